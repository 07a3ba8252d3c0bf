"""Recipe and benchmark scripts at their edges (review 29): the GRPO smoke run's server log kept drained, a ``--merge``
folder or ``--variants`` name that names nothing refused before any work, the scorer report on logs that are not
whole and on runs logged at several training sizes, module names in the recipes' pages that exist, and the
benchmarks recording ``TOKENIZERS_PARALLELISM`` in what they print."""

from __future__ import annotations

import importlib
import json
import logging
import re
import signal
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import ROOT, http, load_recipe

from pmi_reward.evaluation.study import average_rounds, save_scores
from pmi_reward.evaluation.study.methods import MethodScores

# -- recipes/remote_reward/grpo_smoke.py ---------------------------------------------------------------------------


def test_grpo_smoke_keeps_copying_the_server_log_so_requests_never_stall(tiny_scorer_dir, capfd):
    """start_server read the server's stderr only until "listening on": the access log (one line per request) then
    filled the 64 KiB pipe and the server blocked inside its handler, so every later reward request timed out (about
    900 requests of /score; here 250 bytes a line, so about 260). Now a thread copies the log to our stderr."""
    smoke = load_recipe("recipes/remote_reward/grpo_smoke.py")
    server, url, *drain = smoke.start_server(str(tiny_scorer_dir))
    path = "/" + "x" * 199  # an unknown path: 404, and the longest path the access log writes
    try:
        statuses = [http(url, "GET", path, timeout=10.0)[0] for _ in range(500)]
        assert statuses == [404] * 500
        assert http(url, "GET", "/health", timeout=10.0)[0] == 200
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=60) == 0
    finally:
        server.kill()
    drain[0].join(timeout=30)
    assert not drain[0].is_alive()  # the copy ends with the server's stderr
    log = capfd.readouterr().err
    assert log.count(f'"GET {path}" 404') == 500 and "stopped" in log  # copied through to the end, not dropped


# -- recipes/synthetic/run.py --merge ------------------------------------------------------------------------------


def _synthetic_sets(data: Path, kinds: tuple[str, ...]) -> None:
    """20-row synthetic sets (test and val) of ``kinds`` under ``data``, as the shared folder lays them out."""
    for kind in kinds:
        folder = data / "datasets" / "synthetic" / kind
        folder.mkdir(parents=True)
        for split in ("test", "val"):
            (folder / f"{split}.csv").write_text(
                "context_paraphrased,response_paraphrased,p_xy,p_x,p_y\n"
                + "".join(f"context {i},reply {i},0.0{i + 1},0.1,0.1\n" for i in range(20))
            )


def _scores(path: Path, encoder: str, seed: int) -> None:
    """Two rounds of NWJ scores (and their average) of ``encoder`` on 20 test rows, saved at ``path``."""
    rng = np.random.default_rng(seed)
    runs = [
        MethodScores(encoder, "nwj", "pair", r, {"test": rng.normal(1.0, 1.0, 20)}, {"test": rng.normal(size=(20, 5))})
        for r in range(2)
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    save_scores(path, runs + average_rounds(runs))


def test_synthetic_merge_refuses_a_folder_with_no_scores_and_keeps_one_with_some(tmp_path, capsys):
    """A --merge folder holding nothing (a typo, a run not made yet) was skipped without a word: the report lacked its
    rows and the exit code was 0. A folder holding some of the datasets (a run over fewer sets) still joins those."""
    synthetic = load_recipe("recipes/synthetic/run.py")
    _synthetic_sets(tmp_path / "data", ("block", "diagonal"))
    for kind in ("block", "diagonal"):
        _scores(tmp_path / "main" / kind / "scores.npz", "minilm", 0)
    _scores(tmp_path / "other" / "block" / "scores.npz", "smollm2-135m-instruct", 1)  # block only
    (tmp_path / "empty").mkdir()
    argv = ["--data_dir", str(tmp_path / "data"), "--test_k_random", "5", "--datasets", "block", "diagonal"]
    argv += ["--report_only", "true", "--n_boot", "10", "--output_dir", str(tmp_path / "main"), "--merge"]
    with pytest.raises(SystemExit, match=r"--merge .*/othr: no such folder"):
        synthetic.main([*argv, str(tmp_path / "othr")])
    with pytest.raises(SystemExit, match=r"--merge .*/empty: no .*/empty/<dataset>/scores.npz for any of --datasets"):
        synthetic.main([*argv, str(tmp_path / "other"), str(tmp_path / "empty")])
    assert not (tmp_path / "main" / "results.md").exists()  # refused before any report
    assert synthetic.main([*argv, str(tmp_path / "other")]) == 0
    block, diagonal = capsys.readouterr().out.split("## block")[1].split("## diagonal")
    assert "| smollm2-135m-instruct |" in block and "| smollm2-135m-instruct |" not in diagonal
    assert "| minilm |" in block and "| minilm |" in diagonal


# -- recipes/quality/run.py --variants -----------------------------------------------------------------------------


def test_quality_refuses_an_unknown_variant_before_the_first_try(tmp_path):
    """A misspelt variant was found only when its turn came: after the slow ones had run (lora-r8: hours on a CPU), a
    raw KeyError, and the table never written. Now every name is checked before any data is read."""
    quality = load_recipe("recipes/quality/run.py")
    argv = ["--config", str(ROOT / "recipes/quality/en.yaml"), "--data_dir", str(tmp_path / "no-data")]
    argv += ["--output_dir", str(tmp_path / "out"), "--variants", "kde-bandwidth-3", "head-64s", "lora-r9"]
    with pytest.raises(SystemExit, match=r"--variants head-64s lora-r9: unknown; choose from base mix-3r-1d .*lora-r8"):
        quality.main(argv)
    assert not (tmp_path / "out").exists()


# -- recipes/scorer/report.py --------------------------------------------------------------------------------------


def _run(report, name: str, stage: str, seed: int, pairs: int, auc: float) -> dict:
    """One ``runs.jsonl`` row of scorer/run.py: every column of its stage at 0.5, ``auc_random`` at ``auc``."""
    columns = dict.fromkeys(report.COLUMNS[stage], 0.5)
    return {"name": name, "stage": stage, "seed": seed, "train_pairs": pairs, **columns, "auc_random": auc}


def _log(path: Path, rows: list[dict], tail: str = "") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + tail, encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, r"/runs.jsonl: no such file"),
        ("", r"/runs.jsonl: no runs"),
        ("\n \n", r"/runs.jsonl: no runs"),
        ("[1, 2]\n", r"/runs.jsonl, line 3: a JSON list, not a run \(an object\)"),
        ('{"name": "head", "stage": "val"}\n', r"/runs.jsonl, line 3: not a run of run.py \(no seed\)"),
        (
            '{"name": "head", "stage": "val", "seed": 0, "auc_ra',
            r"/runs.jsonl, line 3: not JSON \(.*a run cut short\?\)",
        ),
    ],
    ids=["missing", "empty", "blank-lines", "not-an-object", "no-seed", "cut-short"],
)
def test_scorer_report_refuses_a_log_that_holds_no_whole_runs(tmp_path, content, message):
    """A missing log and a line cut short (run.py appends a line per run, a killed run leaves half of one) ended in a
    raw FileNotFoundError or JSONDecodeError naming neither file nor line; an empty log wrote a results.md of empty
    tables beside it and exited 0. Each is refused, naming the file (and line), before anything is written."""
    report = load_recipe("recipes/scorer/report.py")
    log = tmp_path / "out" / "runs.jsonl"
    if content is not None:
        whole = [_run(report, "head", "val", s, 100, 0.8) for s in (0, 1)] if content.strip() else []
        _log(log, whole, content)
    with pytest.raises(SystemExit, match=message):
        report.main(["--runs", str(log), "--scaling", "none"])
    assert not (tmp_path / "out" / "results.md").exists()


def test_scorer_report_lists_every_training_size_seed_by_seed(tmp_path, capsys):
    """--per_seed on a run logged at several training sizes (--max_train_pairs 1000 3000, the scaling recipe) kept one
    row per seed, the last size's, unlabelled: the other sizes' seeds vanished while the main table showed them. Now
    one row per (size, seed), with a "train pairs" column, each validation figure beside its own size's test ones."""
    report = load_recipe("recipes/scorer/report.py")
    rows = [
        _run(report, "scaling", stage, seed, pairs, base + seed / 100 + (stage == "test") / 10)
        for stage in ("val", "test")
        for pairs, base in ((1000, 0.70), (3000, 0.80))
        for seed in (0, 1)
    ]
    log = _log(tmp_path / "runs.jsonl", rows)
    assert report.main(["--runs", str(log), "--scaling", "none", "--per_seed", "scaling"]) == 0
    table = capsys.readouterr().out.split("## per seed\n\n")[1].splitlines()
    assert table[0].startswith("| run | train pairs | seed | val auc_random | test auc_random |")
    assert table[2:] == [
        "| scaling | 1000 | 0 | 0.700 | 0.800 | 0.500 | 0.500 | 0.500 |",
        "| scaling | 1000 | 1 | 0.710 | 0.810 | 0.500 | 0.500 | 0.500 |",
        "| scaling | 3000 | 0 | 0.800 | 0.900 | 0.500 | 0.500 | 0.500 |",
        "| scaling | 3000 | 1 | 0.810 | 0.910 | 0.500 | 0.500 | 0.500 |",
    ]
    assert (tmp_path / "results.md").read_text().endswith("\n".join(table) + "\n")


def test_scorer_report_keeps_its_per_seed_table_for_runs_of_one_size_each(tmp_path):
    """Runs of one training size each (sizes differing between runs, as plain and +chitchat2k do) keep the table the
    RESULTS pages quote: no size column."""
    report = load_recipe("recipes/scorer/report.py")
    rows = [_run(report, name, "val", s, pairs, 0.9) for name, pairs in (("plain", 100), ("more", 200)) for s in (0, 1)]
    table = report.per_seed_table(rows, ["plain", "more"]).splitlines()
    assert table[0].startswith("| run | seed | val auc_random |")
    assert table[2:] == [f"| {n} | {s} | 0.900 | - | - | - | - |" for n in ("plain", "more") for s in (0, 1)]


# -- module names in recipes/ and benchmarks/ pages ----------------------------------------------------------------


def _resolves(reference: str) -> bool:
    """Whether ``pmi_reward.a.b[.attr][:name]`` names an importable module (and attributes of it)."""
    dotted, _, name = reference.partition(":")
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            target = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attribute in [*parts[cut:], *([name] if name else [])]:
            if not hasattr(target, attribute):
                return False
            target = getattr(target, attribute)
        return True
    return False


def test_recipe_and_benchmark_pages_name_modules_that_exist():
    """recipes/quality/RESULTS.md named the LoRA code ``pmi_reward.finetune``, a module long gone (it is
    ``pmi_reward.training.trainable``): every ``pmi_reward.x.y`` a page under recipes/ or benchmarks/ names imports."""
    pages = sorted([*(ROOT / "recipes").rglob("*.md"), *(ROOT / "benchmarks").glob("*.md")])
    missing = [
        f"{page.relative_to(ROOT)}:{number}: {match.group(0)}"
        for page in pages
        for number, line in enumerate(page.read_text(encoding="utf-8").split("\n"), 1)
        for match in re.finditer(r"\bpmi_reward(?:\.\w+)+(?::\w+)?", line)
        if not _resolves(match.group(0))
    ]
    assert missing == []


# -- benchmarks record TOKENIZERS_PARALLELISM ----------------------------------------------------------------------


class _ConstantScorer:
    """A stand-in for PMIScorer: every pair scores 0 (int8_batch.py's paths without onnx or a saved scorer)."""

    @classmethod
    def from_pretrained(cls, *args, **kwargs) -> _ConstantScorer:
        return cls()

    def score(self, contexts: list[str], replies: list[str]) -> np.ndarray:
        return np.zeros(len(contexts))


def test_int8_batch_prints_the_tokenizers_setting(monkeypatch, capsys):
    """benchmarks/README.md: every tokenizing script records TOKENIZERS_PARALLELISM in what it prints; int8_batch.py
    set it but did not print it. It goes to stderr: stdout stays the table the README and tests read."""
    bench = load_recipe("benchmarks/int8_batch.py")
    monkeypatch.setattr(bench, "PMIScorer", _ConstantScorer)
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")
    bench.main(["--scorer", "unused"])
    printed = capsys.readouterr()
    assert printed.err.splitlines() == ["TOKENIZERS_PARALLELISM=false"]
    out = printed.out.splitlines()  # the markdown table alone, as before
    assert out[0].startswith("| backend | quantize |") and len(out) == 6
    assert "| onnx | int8 | +0.000 | +0.000, +0.000, +0.000 | 0.000 |" in out


def test_verl_merge_prints_the_tokenizers_setting(tiny_scorer_dir, monkeypatch, capsys):
    """verl_merge.py set TOKENIZERS_PARALLELISM but left it out of its JSON line (the tiny encoder stands in for
    MiniLM: the setting, not the speed, is under test)."""
    import pmi_reward.rewards.verl as verl
    from pmi_reward.scoring.encoder import EncoderSpec

    bench = load_recipe("benchmarks/verl_merge.py")
    encoder = str(tiny_scorer_dir.parent / "encoder")
    monkeypatch.setattr(bench, "EncoderSpec", lambda model: EncoderSpec(encoder, max_length=64))
    monkeypatch.setattr(verl, "MERGE_WAIT_MS", verl.MERGE_WAIT_MS)  # the script sets it from --wait_ms
    monkeypatch.setattr("sys.argv", ["verl_merge.py", "--prompts", "2", "--group", "2", "--pool", "2"])
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")
    threads = torch.get_num_threads()
    try:
        bench.main()
    finally:  # the script's process-wide settings, put back
        logging.disable(logging.NOTSET)
        torch.set_num_threads(threads)
        verl._load_reward.cache_clear()
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["tokenizers_parallelism"] == "false" and result["responses"] == 4

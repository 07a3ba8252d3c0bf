"""The CLI on the real offline MiniLM: train on a small pair file, score, configs and errors."""

import csv
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import TOPICS

from pmi_reward.cli.main import main
from pmi_reward.scoring.scorer import PMIScorer


def _pair_file(path: Path, n_dialogues: int, seed: int) -> Path:
    rng = np.random.default_rng(seed)
    rows = []
    for d in range(n_dialogues):
        topic = list(TOPICS)[d % len(TOPICS)]
        turns = list(rng.permutation(TOPICS[topic]))
        for t in range(1, len(turns)):
            rows.append({"dialog_key": f"{seed}-{d}", "context": "\n".join(turns[:t]), "response": turns[t]})
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, ["dialog_key", "context", "response"])
        w.writeheader()
        w.writerows(rows)
    return path


@pytest.mark.integration
def test_train_then_score_on_minilm(tmp_path, capsys):  # the whole CLI path end to end, one step after another
    train, val = _pair_file(tmp_path / "train.csv", 40, 0), _pair_file(tmp_path / "val.csv", 12, 1)
    out = tmp_path / "scorer"
    code = main(
        [
            "train",
            "--config",
            "scorer/minilm",  # a shipped config, by name
            "--train_file",
            str(train),
            "--val_file",
            str(val),
            "--test_file",
            str(val),
            "--output_dir",
            str(out),
            "--epochs",
            "8",
            "--batch_size",
            "16",
            "--cache_dir",
            str(tmp_path / "cache"),
            "--progress",
            "false",
        ]
    )
    assert code == 0
    printed = capsys.readouterr().out
    summary = json.loads(printed[printed.index("{\n") :])
    assert summary["saved"] == str(out) and summary["train_pairs"] == 120 and 0 <= summary["test_auc"] <= 1
    scorer = PMIScorer.from_pretrained(out)
    assert scorer.metadata["best_val_auc"] > 0.7  # topics are easy for MiniLM
    assert scorer.metadata["training"]["batch_size"] == 16
    rows = tmp_path / "rows.jsonl"
    rows.write_text(
        "\n".join(
            json.dumps(r)
            for r in [
                {"context": "I love pizza.", "response": "Pasta is my favourite dish.", "id": 1},
                {"context": "I love pizza.", "response": "I play tennis on Sundays.", "id": 2},
            ]
        )
        + "\n"
    )
    assert (
        main(
            [
                "score",
                "--scorer",
                str(out),
                "--input",
                str(rows),
                "--output",
                str(tmp_path / "o.jsonl"),
                "--progress",
                "false",
            ]
        )
        == 0
    )
    scored = [json.loads(line) for line in (tmp_path / "o.jsonl").read_text().splitlines()]
    assert [r["id"] for r in scored] == [1, 2]
    assert scored[0]["pmi"] > scored[1]["pmi"]


def test_help_and_unknown_command(capsys):
    assert main([]) == 2
    assert main(["--help"]) == 0
    assert "train" in capsys.readouterr().out
    result = subprocess.run(
        [sys.executable, "-m", "pmi_reward.cli.main", "train", "--help"], capture_output=True, text=True, check=True
    )
    assert "--objective" in result.stdout and "--k_in_dialogue" in result.stdout


def test_score_reports_bad_input_file(tmp_path, capsys):
    """A user's mistake is one line on stderr and exit code 2; ``--debug`` shows the traceback instead."""
    bad = tmp_path / "bad.csv"
    bad.write_text("context,reply\nhi,there\n")
    from pmi_reward.data.records import DataError

    argv = ["score", "--scorer", str(tmp_path), "--input", str(bad), "--output", str(tmp_path / "o.csv")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pmi-reward score:" in err and "missing column 'response'" in err
    with pytest.raises(DataError, match="missing column 'response'"):
        main([*argv, "--debug"])


def test_user_errors_print_no_traceback(tmp_path):
    """The command in a subprocess: a missing input file, a missing scorer."""
    for args, message in (
        (["score", "--scorer", str(tmp_path), "--input", "nowhere.csv", "--output", "o.csv"], "nowhere.csv"),
        (
            ["evaluate", "--scorer", str(tmp_path / "none"), "--input", str(_pair_file(tmp_path / "p.csv", 2, 0))],
            "none",
        ),
    ):
        run = subprocess.run([sys.executable, "-m", "pmi_reward.cli.main", *args], capture_output=True, text=True)
        assert run.returncode == 2 and "Traceback" not in run.stderr and message in run.stderr, run.stderr
        assert run.stderr.strip().count("\n") == 0, run.stderr


def test_a_config_that_is_not_yaml_is_a_user_error(tmp_path, capsys):
    config = tmp_path / "bad.yaml"
    config.write_text("scorer: [unclosed\n")
    argv = ["score", "--config", str(config), "--input", "in.csv", "--output", str(tmp_path / "o.csv")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pmi-reward score:" in err and str(config) in err and "line 1" in err


@pytest.fixture
def no_scoring(monkeypatch):
    """Loading a scorer fails the test: the command must stop before any work."""

    def forbidden(*args, **kwargs):
        raise AssertionError("the command started working before checking its output")

    monkeypatch.setattr(PMIScorer, "from_pretrained", forbidden)


def test_score_checks_its_output_before_scoring(tmp_path, capsys, no_scoring):
    data = _pair_file(tmp_path / "pairs.csv", 2, 0)
    (tmp_path / "done.jsonl").write_text("{}\n")
    for output, message in (
        ("out.txt", "unsupported output type '.txt'"),
        (str(data), "is the input file"),
        (str(tmp_path / "done.jsonl"), "exists; pass --overwrite"),
    ):
        argv = ["score", "--scorer", str(tmp_path), "--input", str(data), "--output", output]
        assert main(argv) == 2
        assert message in capsys.readouterr().err
    with pytest.raises(AssertionError, match="started working"):  # with --overwrite it goes on, to the scorer
        main([*argv, "--overwrite"])


def test_train_refuses_to_overwrite_a_scorer(tmp_path, capsys, no_scoring):
    out = tmp_path / "scorer"
    out.mkdir()
    (out / "config.json").write_text("{}")
    assert main(["train", "--dialogues", "chitchat", "--output_dir", str(out)]) == 2
    assert "exists and is not empty; pass --overwrite" in capsys.readouterr().err
    assert (out / "config.json").read_text() == "{}"


def test_evaluate_reports_auc_correlations_and_true_pmi(tmp_path, tiny_encoder, monkeypatch, capsys):
    from pmi_reward.data.negatives import NegativeSpec
    from pmi_reward.data.pairs import load_pairs
    from pmi_reward.scoring.templates import TEMPLATES
    from pmi_reward.training.fit import fit_scorer
    from pmi_reward.training.loop import TrainConfig

    train = load_pairs(_pair_file(tmp_path / "train.csv", 40, 0))
    val = load_pairs(_pair_file(tmp_path / "val.csv", 12, 1))
    config = TrainConfig(batch_size=32, epochs=6, lr=3e-3)
    scorer, _ = fit_scorer(
        train, val, tiny_encoder, TEMPLATES["en"], config, negatives=NegativeSpec(3, 0, 0), progress=False
    )
    monkeypatch.setattr(PMIScorer, "from_pretrained", classmethod(lambda cls, *a, **k: scorer))
    path = tmp_path / "rated.csv"
    with open(_pair_file(tmp_path / "eval.csv", 12, 2), newline="") as f:
        rows = list(csv.DictReader(f))
    scores = scorer.score([r["context"] for r in rows], [r["response"] for r in rows])
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, ["dialog_key", "context", "response", "rating", "p_xy", "p_x", "p_y"])
        w.writeheader()
        for r, s in zip(rows, scores, strict=True):  # a rating that follows the score; p's whose PMI is the score + 1
            w.writerow({**r, "rating": float(s), "p_xy": float(np.exp(s + 1)) * 0.01, "p_x": 0.1, "p_y": 0.1})
    assert (
        main(
            [
                "evaluate",
                "--scorer",
                "unused",
                "--input",
                str(path),
                "--k_random",
                "2",
                "--k_in_dialogue",
                "1",
                "--k_context",
                "0",
                "--targets",
                "rating",
                "--pmi_columns",
                "p_xy",
                "p_x",
                "p_y",
                "--n_boot",
                "50",
                "--progress",
                "false",
            ]
        )
        == 0
    )
    report = json.loads(capsys.readouterr().out)
    assert report["rows"] == len(rows) and 0.0 <= report["auc"]["value"] <= 1.0
    assert {"auc_random", "auc_in_dialogue"} <= set(report)
    assert report["rating"]["spearman"]["value"] == pytest.approx(1.0)
    low, high = report["rating"]["pearson"]["ci95"]
    assert low <= report["rating"]["pearson"]["value"] <= high
    assert report["true_pmi"]["mse"]["value"] == pytest.approx(1.0, abs=1e-4)


def test_score_reads_contexts_as_the_scorer_was_trained(tmp_path, tiny_scorer_dir, monkeypatch):
    """`pmi-reward score` embedded whole contexts where training cut them to the newest context_turns lines (3 here),
    unlike PMIReward and the server: 0.74 nats apart on 8-turn Chit-Chat contexts with the RL recipe's reward."""
    long = "\n".join(["Hi.", "Hello!", "I went hiking.", "Where?", "", "Yosemite!", "Nice, when?"])
    rows = tmp_path / "in.jsonl"
    rows.write_text(json.dumps({"context": long, "response": "Last week."}) + "\n")
    seen = []
    real = PMIScorer.score
    monkeypatch.setattr(PMIScorer, "score", lambda self, c, r, **k: seen.append(list(c)) or real(self, c, r, **k))
    for flags in ([], ["--context_turns", "0"]):
        out = tmp_path / f"out{len(flags)}.jsonl"
        argv = ["score", "--scorer", str(tiny_scorer_dir), "--input", str(rows), "--output", str(out), *flags]
        assert main([*argv, "--progress", "false"]) == 0
    # the newest 3 non-empty lines; 0: every non-empty line, as PMIReward reads a context with no cut
    assert seen == [["Where?\nYosemite!\nNice, when?"], [long.replace("\n\n", "\n")]]


def test_score_leaves_unscorable_rows_empty_and_never_overwrites_a_column(tmp_path, tiny_scorer_dir, capsys):
    """A blank context or reply got a number where PMIReward gives None (an empty cell now, every row kept); a
    --score_column naming an input column replaced its values without a word (refused, by name)."""
    rows = tmp_path / "in.csv"
    rows.write_text("context,response\n,hi there\nI love jazz.,Coltrane!\nI love jazz., \n")
    out = tmp_path / "out.jsonl"
    argv = ["score", "--scorer", str(tiny_scorer_dir), "--input", str(rows), "--progress", "false"]
    assert main([*argv, "--output", str(out)]) == 0
    scored = [json.loads(line)["pmi"] for line in out.read_text().splitlines()]
    assert scored[0] is None and isinstance(scored[1], float) and scored[2] is None
    assert main([*argv, "--output", str(tmp_path / "o2.jsonl"), "--score_column", "context"]) == 2
    assert "column 'context' already" in capsys.readouterr().err and not (tmp_path / "o2.jsonl").exists()


def test_score_reads_rows_as_pmi_reward_reads_them(tmp_path, tiny_scorer_dir, capsys):
    """`pmi-reward score` scored the raw text where PMIReward strips a <think> block and leaves an invisible reply
    unscored: the same answer after reasoning got another score, and "\u200b" got one. Its column is PMIReward's raw
    PMI (empty_score None: null), in the input's order."""
    from pmi_reward.rewards.reward import PMIReward

    rows = [
        {"context": "I went hiking.\nWhere?", "response": "Yosemite, it was great."},
        {"context": "I went hiking.\nWhere?", "response": "<think>where: a place</think>Yosemite, it was great."},
        {"context": "I went hiking.\nWhere?", "response": "\u200b"},
        {"context": "I went hiking.\nWhere?", "response": "<think>a place, but which"},
        {"context": "<think>hmm</think>\n", "response": "Hello there."},
        {"context": "I love jazz.\n<think>a question?</think>Do you?", "response": "Coltrane, always."},
        {"context": "I love jazz.\nDo you?", "response": "  Coltrane, always.\n"},
    ]
    data, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    argv = ["score", "--scorer", str(tiny_scorer_dir), "--input", str(data), "--output", str(out)]
    assert main([*argv, "--progress", "false"]) == 0
    scored = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["response"] for r in scored] == [r["response"] for r in rows]
    pmi = [r["pmi"] for r in scored]
    reward = PMIReward(PMIScorer.from_pretrained(tiny_scorer_dir), empty_score=None)
    expected = reward([r["context"] for r in rows], [r["response"] for r in rows])
    assert pmi == [None if s is None else round(s, 6) for s in expected]
    assert pmi[2] is None and pmi[3] is None and pmi[4] is None
    assert pmi[1] == pmi[0] and pmi[6] == pmi[5] and isinstance(pmi[0], float)
    assert json.loads(capsys.readouterr().out)["mean_pmi"] == pytest.approx(np.mean([pmi[0], pmi[1], pmi[5], pmi[6]]))


def test_evaluate_makes_its_output_folder(tmp_path, tiny_scorer_dir):
    """evaluate's --output in a new folder failed after the whole evaluation (score makes the folder)."""
    pairs = tmp_path / "pairs.csv"
    pairs.write_text("context,response\n" + "".join(f"I like topic {i}.,Tell me about {i}!\n" for i in range(6)))
    out = tmp_path / "new" / "folder" / "eval.json"
    argv = ["evaluate", "--scorer", str(tiny_scorer_dir), "--input", str(pairs), "--output", str(out)]
    assert main([*argv, "--k_random", "1", "--k_context", "0", "--n_boot", "10"]) == 0 and out.is_file()


def test_train_refuses_a_dim_it_would_ignore(tmp_path, tiny_encoder, capsys, monkeypatch):
    """--dim was replaced by the encoder's width without a word: a width below 1, or other than the encoder's, is
    refused with its reason, by fit_scorer and by ``train`` on real training data (without data, train exits 2 for
    the missing data whatever --dim says)."""
    import pmi_reward.training.job as job
    from pmi_reward.data.pairs import load_pairs
    from pmi_reward.scoring.head import HeadConfig
    from pmi_reward.scoring.templates import TEMPLATES
    from pmi_reward.training.fit import fit_scorer
    from pmi_reward.training.loop import TrainConfig

    with pytest.raises(ValueError, match="dim must be >= 1"):
        HeadConfig(dim=-5)
    train, val = _pair_file(tmp_path / "train.csv", 8, 0), _pair_file(tmp_path / "val.csv", 4, 1)
    wide, width = HeadConfig(dim=tiny_encoder.dim + 1), f"dim {tiny_encoder.dim + 1} is not the encoder's width"
    with pytest.raises(ValueError, match=f"{width} {tiny_encoder.dim}: leave it out"):
        fit_scorer(load_pairs(train), load_pairs(val), tiny_encoder, TEMPLATES["en"], TrainConfig(epochs=1), wide)
    monkeypatch.setattr(job, "TextEncoder", lambda *args, **kwargs: tiny_encoder)
    out = tmp_path / "scorer"
    argv = ["train", "--train_file", str(train), "--val_file", str(val), "--output_dir", str(out)]
    argv += ["--cache_dir", str(tmp_path / "cache"), "--epochs", "1", "--progress", "false"]
    assert main([*argv, "--dim", "0"]) == 2
    assert "pmi-reward train: dim must be >= 1 (or left out: the encoder's width), got 0" in capsys.readouterr().err
    assert main([*argv, "--dim", str(tiny_encoder.dim + 1)]) == 2
    assert f"pmi-reward train: {width} {tiny_encoder.dim}" in capsys.readouterr().err and not out.exists()
    assert main([*argv, "--dim", str(tiny_encoder.dim)]) == 0 and (out / "config.json").is_file()


def test_debug_keeps_exit_code_2_and_false_turns_it_off(tmp_path, capsys, monkeypatch):
    """Under --debug a command's own ``SystemExit("message")`` printed the message alone and exited 1;
    ``PMI_REWARD_DEBUG=false`` (or no, off) turned debugging on."""
    assert main(["prepare-models", "minilmm", "--debug"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and "pmi-reward prepare-models: minilmm: not a shipped model" in err
    missing, output = str(tmp_path / "nowhere.csv"), str(tmp_path / "o.csv")
    argv = ["score", "--scorer", str(tmp_path), "--input", missing, "--output", output]
    for off in ("false", "No", "OFF", "0", ""):
        monkeypatch.setenv("PMI_REWARD_DEBUG", off)
        assert main(argv) == 2, off
        assert "nowhere.csv: no such file (--debug shows the traceback)" in capsys.readouterr().err
    monkeypatch.setenv("PMI_REWARD_DEBUG", "1")
    with pytest.raises(ValueError, match="nowhere.csv: no such file"):
        main(argv)


@pytest.mark.parametrize(
    ("device", "message"),
    [
        ("gpu", "--device gpu: not a device; expected cpu, cuda, cuda:N or mps"),
        ("cuda", "--device cuda: this machine has no CUDA device"),
        ("cuda:1", "--device cuda:1: this machine has no CUDA device"),
        ("mps", "--device mps: MPS is not available on this machine"),
        ("meta", "--device meta: not available on this machine"),
    ],
)
def test_serve_refuses_a_bad_device_before_loading(tmp_path, capsys, monkeypatch, no_scoring, device, message):
    """``serve --device gpu``, or ``--device cuda`` on a machine without CUDA, was a traceback and exit code 1 after
    the scorer loaded: now one line naming --device and exit code 2, before it loads."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    assert main(["serve", "--scorer", str(tmp_path), "--device", device]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"pmi-reward serve: {message}" in err, err

"""Bad input to scorer training and evaluation: one line naming what is wrong, exit code 2, before any work."""

import csv
import json
from pathlib import Path

import pytest

from pmi_reward.cli.main import main
from pmi_reward.evaluation.baselines.jsonl_cache import JsonlCache
from pmi_reward.scoring.scorer import PMIScorer, ScorerLoadError
from pmi_reward.training import job

ROWS = [
    {"dialog_key": "a", "context": "I love pizza.", "response": "Pasta is my favourite dish."},
    {"dialog_key": "a", "context": "I love pizza.\nPasta is my favourite dish.", "response": "I baked bread today."},
    {"dialog_key": "b", "context": "Did you watch the match?", "response": "Our team won the cup!"},
    {"dialog_key": "b", "context": "Did you watch the match?\nOur team won the cup!", "response": "I ran ten miles."},
    {"dialog_key": "c", "context": "I play the guitar.", "response": "Jazz relaxes me."},
    {"dialog_key": "d", "context": "I flew to Rome last week.", "response": "Paris is lovely in spring."},
]


def _write(path: Path, rows: list[dict]) -> str:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, list(dict.fromkeys(k for row in rows for k in row)))
        writer.writeheader()
        writer.writerows(rows)
    return str(path)


@pytest.fixture
def no_encoder(monkeypatch):
    """Building the encoder (or loading a scorer) fails the test: the command must stop before any work."""

    def forbidden(*args, **kwargs):
        raise AssertionError("the command started working before checking its input")

    monkeypatch.setattr(job, "TextEncoder", forbidden)
    monkeypatch.setattr(PMIScorer, "from_pretrained", forbidden)


def _train(tmp_path: Path, *extra: str) -> list[str]:
    pairs = _write(tmp_path / "pairs.csv", ROWS)
    return ["train", "--train_file", pairs, "--val_file", pairs, "--output_dir", str(tmp_path / "out"), *extra]


@pytest.mark.parametrize(
    ("split", "option"), [("training", "--train_file"), ("validation", "--val_file"), ("test", "--test_file")]
)
def test_train_checks_each_splits_negatives_before_training(tmp_path, capsys, no_encoder, split, option):
    """A split whose pairs share one reply gives no negatives: this was found only when they were drawn, after
    training for the test split, with no file named."""
    one = _write(tmp_path / "one.csv", [{"context": f"line {i}", "response": "same reply"} for i in range(3)])
    assert main([*_train(tmp_path), option, one]) == 2
    err = capsys.readouterr().err
    assert f"the {split} pairs of {one}" in err and "every pair has the same response" in err


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--skip_dialogues", "-1", "skip_dialogues must be >= 0"),
        ("--max_dialogues", "-5", "max_dialogues must be >= 1"),
        ("--max_dialogues", "0", "max_dialogues must be >= 1"),
        ("--max_pairs_per_dialogue", "0", "max_pairs_per_dialogue must be >= 1"),
        ("--batch_size", "0", "batch_size must be >= 1"),
        ("--epochs", "0", "epochs must be >= 1"),
        ("--hidden", "0", "hidden widths must be >= 1"),
    ],
)
def test_train_refuses_counts_out_of_range(tmp_path, capsys, no_encoder, option, value, message):
    """A negative --skip_dialogues or --max_dialogues sliced dialogues from the end, --max_dialogues 0 took them all,
    --epochs 0 saved an untrained head, --batch_size 0 was a ZeroDivisionError traceback."""
    assert main([*_train(tmp_path), option, value]) == 2
    assert message in capsys.readouterr().err


def test_train_checks_the_checkpoint_dir_before_training(tmp_path, capsys, no_encoder):
    """A --checkpoint_dir that is a file failed with '[Errno 17] File exists' after the first round."""
    taken = tmp_path / "taken"
    taken.write_text("")
    assert main([*_train(tmp_path), "--checkpoint_dir", str(taken)]) == 2
    assert f"--checkpoint_dir {taken} is a file, not a folder" in capsys.readouterr().err


def _evaluate(tmp_path: Path, rows: list[dict], *extra: str) -> list[str]:
    path = _write(tmp_path / "rated.csv", rows)
    return ["evaluate", "--scorer", "unused", "--input", path, "--n_boot", "20", "--progress", "false", *extra]


@pytest.fixture
def rated():
    """ROWS with a rating per row (one left blank, one marked NA) and a synthetic file's probabilities."""
    ratings = ["1", "", "2.5", "NA", "4", "3"]
    return [
        {**row, "rating": r, "p_xy": "0.02", "p_x": "0.1", "p_y": "0.2"} for row, r in zip(ROWS, ratings, strict=True)
    ]


@pytest.mark.parametrize(
    ("column", "value", "option", "message"),
    [
        ("rating", "high", "--targets", "row 3, field 'rating': 'high' is not a number"),
        ("rating", "inf", "--targets", "row 3, field 'rating': inf is not a number"),
        ("p_x", "0", "--pmi_columns", "row 3, field 'p_x': 0.0 is not a positive number"),
        ("p_y", "-0.1", "--pmi_columns", "row 3, field 'p_y': -0.1 is not a positive number"),
    ],
)
def test_evaluate_refuses_values_that_are_not_numbers(
    tmp_path, capsys, no_encoder, rated, column, value, option, message
):
    """A value that is no number was dropped from the target's metrics without a word (a p of 0 or below too, with
    numpy's log warnings): now a DataError naming the row, before the scorer is loaded."""
    rated[2][column] = value
    columns = ["rating"] if option == "--targets" else ["p_xy", "p_x", "p_y"]
    assert main(_evaluate(tmp_path, rated, option, *columns)) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'rated.csv'}, {message}" in err


def test_evaluate_leaves_out_missing_ratings_and_counts_the_rest(tmp_path, capsys, tiny_scorer, monkeypatch, rated):
    """Blank and NA cells are missing values: left out of the correlations, whose row count says so."""
    monkeypatch.setattr(PMIScorer, "from_pretrained", classmethod(lambda cls, *a, **k: tiny_scorer))
    assert main(_evaluate(tmp_path, rated, "--targets", "rating", "--pmi_columns", "p_xy", "p_x", "p_y")) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["rows"] == 6 and report["rating"]["spearman"]["rows"] == 4
    assert report["true_pmi"]["mse"]["rows"] == 6


def test_evaluate_checks_its_negatives_and_n_boot_before_scoring(tmp_path, capsys, no_encoder):
    one = [{"context": f"line {i}", "response": "same reply"} for i in range(3)]
    assert main(_evaluate(tmp_path, one)) == 2
    assert f"{tmp_path / 'rated.csv'}: cannot build negatives" in capsys.readouterr().err
    assert main(_evaluate(tmp_path, ROWS, "--n_boot", "-1")) == 2  # was numpy's error, after scoring every row
    assert "n_boot must be >= 0" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("file", "change", "message"),
    [
        ("config.json", {"version": "2"}, "invalid version '2'"),
        ("config.json", {"context_turns": "three"}, "invalid scorer config"),
        ("config.json", {"context_turns": -2}, "invalid scorer config"),
        ("metadata.json", [1, 2], "expected a JSON object"),
    ],
)
def test_a_scorer_with_a_corrupted_config_or_metadata_fails_clearly(tiny_scorer, tmp_path, file, change, message):
    """A version that is not a number was a TypeError traceback; a bad context_turns an error naming no file; a
    metadata.json that is not an object loaded, to fail wherever the provenance is read."""
    directory = tiny_scorer.save_pretrained(tmp_path / "scorer")
    path = directory / file
    content = {**json.loads(path.read_text()), **change} if isinstance(change, dict) else change
    path.write_text(json.dumps(content))
    with pytest.raises(ScorerLoadError, match=message) as caught:
        PMIScorer.from_pretrained(directory, encoder=tiny_scorer.encoder)
    assert str(directory) in str(caught.value)


def test_a_cache_file_cut_short_by_a_kill_still_loads_and_appends_cleanly(tmp_path):
    """A run killed while appending left a last line without its end; every later run failed to read the file (a
    JSONDecodeError naming no file), and an append after it would have spoilt the next record too."""
    path = tmp_path / "answers.jsonl"
    path.write_text('{"key": "a", "value": 1}\n{"key": "b", "val')
    cache = JsonlCache(path)
    assert cache == {"a": 1}
    cache.add({"c": 3})
    assert JsonlCache(path) == {"a": 1, "c": 3}
    path.write_text('{"key": "a", "value": 1}')  # a whole record, only its newline missing: kept, then ended
    JsonlCache(path).add({"c": 3})
    assert JsonlCache(path) == {"a": 1, "c": 3}
    path.write_text('{"key": "a", "value": 1}\nnot json\n{"key": "c", "value": 3}\n')
    with pytest.raises(ValueError, match=f"{path}, line 2: not a cache record"):
        JsonlCache(path)


def test_evaluate_reads_contexts_as_the_scorer_was_trained(tmp_path, capsys, tiny_scorer, monkeypatch):
    """`evaluate` scored whole contexts where the scorer trained on (and PMIReward reads) the newest context_turns
    lines: its AUC and correlations described another model than the reward in use. --context_turns 0: whole."""
    import pmi_reward.cli.evaluate as evaluate_cli

    monkeypatch.setattr(PMIScorer, "from_pretrained", classmethod(lambda cls, *a, **k: tiny_scorer))  # 3 turns
    seen = []
    real = evaluate_cli.evaluate_scorer
    monkeypatch.setattr(
        evaluate_cli, "evaluate_scorer", lambda s, p, *a: seen.append(p.context_texts) or real(s, p, *a)
    )
    long = [{**row, "context": "Hi.\nHello!\nHow are you?\nFine.\n" + row["context"]} for row in ROWS]
    for flags in ([], ["--context_turns", "0"]):
        assert main(_evaluate(tmp_path, long, "--k_random", "1", *flags)) == 0
    assert seen[0][0] == "How are you?\nFine.\nI love pizza." and seen[1][0] == long[0]["context"]
    capsys.readouterr()
    assert main(_evaluate(tmp_path, ROWS, "--key_column", "conv")) == 2  # a key the user names must be there
    assert "missing column 'conv' (the dialogue key" in capsys.readouterr().err

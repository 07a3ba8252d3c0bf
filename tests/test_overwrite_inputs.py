"""An output that holds or is one of the run's own inputs is refused before any work, --overwrite or not: the run
would read the input, then its save would delete it (``train`` replaces --output_dir whole) or write over it."""

from __future__ import annotations

import pytest

import pmi_reward.training.job as job
from pmi_reward.cli.main import main
from pmi_reward.data.records import DataError, check_output, check_output_dir
from pmi_reward.scoring.scorer import PMIScorer


def test_an_output_folder_holding_an_input_is_refused_even_with_overwrite(tmp_path, monkeypatch):
    """Paths are compared resolved: relative, with ``..``, through a symlinked input or a symlinked output folder;
    inputs that do not exist yet (a checkpoint folder the run would create there) count too."""
    out = tmp_path / "scorer"
    out.mkdir()
    (out / "train.csv").write_text("context,response\na,b\n")
    (tmp_path / "link.csv").symlink_to(out / "train.csv")
    (tmp_path / "outputs").symlink_to(out)
    monkeypatch.chdir(tmp_path)
    for folder, name, given in (
        (out, "--train_file", out / "train.csv"),
        (out, "--dialogues", out),
        ("scorer", "--val_file", "other/../scorer/train.csv"),
        (out, "--test_file", "link.csv"),
        ("outputs", "--train_file", out / "train.csv"),
        (tmp_path / "new", "--checkpoint_dir", tmp_path / "new" / "ckpt"),
    ):
        refused = f"{name} {given} is inside --output_dir {folder} .* --overwrite or not"
        for overwrite in (False, True):
            with pytest.raises(DataError, match=refused):
                check_output_dir(folder, overwrite, inputs={name: given})
    (tmp_path / "data.csv").write_text("context,response\na,b\n")
    (out / "data.csv").symlink_to(tmp_path / "data.csv")  # the link is deleted with the folder, the data is not
    (tmp_path / "scorer2").mkdir()
    outside = {"--train_file": out / "data.csv", "--val_file": "scorer2/v.csv", "--test_file": None, "--model": ""}
    assert check_output_dir(out, overwrite=True, inputs=outside) == out
    assert check_output_dir(out, overwrite=True, what="--checkpoint_dir", whole=False, inputs={"-": out / "train.csv"})


@pytest.mark.parametrize("option", ["--train_file", "--val_file", "--dialogues", "--checkpoint_dir", "--cache_dir"])
def test_train_refuses_an_output_dir_holding_its_inputs(tmp_path, monkeypatch, capsys, option):
    """``train --output_dir D --overwrite`` with an input in D read it, trained, then deleted it with D (a checkpoint
    or an embedding cache there was lost the same way). Refused before any pair is read, and D is left as it was."""

    def forbidden(*args, **kwargs):
        raise AssertionError("the run started working before checking its output folder")

    monkeypatch.setattr(job, "build_pairs", forbidden)
    out, other = tmp_path / "scorer", tmp_path / "data"
    out.mkdir()
    other.mkdir()
    pairs = "context,response,dialog_key\nhi,hello,0\n"
    for folder in (out, other):
        (folder / "train.csv").write_text(pairs)
        (folder / "val.csv").write_text(pairs)
        (folder / "dialogues.jsonl").write_text('{"turns": ["a", "b"]}\n')
    paths = {
        "--train_file": "train.csv",
        "--val_file": "val.csv",
        "--dialogues": "dialogues.jsonl",
        "--checkpoint_dir": "ckpt",
        "--cache_dir": "cache",
    }

    def argv(inside: str | None) -> list[str]:
        given = {name: str((out if name == inside else other) / paths[name]) for name in paths}
        return ["train", "--output_dir", str(out), "--overwrite", *(x for kv in given.items() for x in kv)]

    before = sorted(p.name for p in out.iterdir())
    assert main(argv(option)) == 2
    err = capsys.readouterr().err
    assert f"{option} {out / paths[option]} is inside --output_dir {out}" in err and "--overwrite or not" in err
    assert sorted(p.name for p in out.iterdir()) == before
    with pytest.raises(AssertionError, match="started working"):  # the same inputs outside the folder: it goes on
        main(argv(None))


def test_train_refuses_a_default_cache_or_a_local_encoder_inside_its_output_dir(tmp_path, monkeypatch, capsys):
    """The embedding cache by default (``$PMI_REWARD_CACHE/embeddings``) and a local encoder folder are inputs too;
    --no_cache leaves the cache out."""
    monkeypatch.setattr(job, "build_pairs", lambda data: (_ for _ in ()).throw(AssertionError("started working")))
    out = tmp_path / "scorer"
    (out / "encoder").mkdir(parents=True)
    monkeypatch.setenv("PMI_REWARD_CACHE", str(out))
    argv = ["train", "--dialogues", "chitchat", "--output_dir", str(out), "--overwrite"]
    assert main(argv) == 2
    assert f"--cache_dir {out / 'embeddings'} is inside --output_dir {out}" in capsys.readouterr().err
    assert main([*argv, "--no_cache", "--model", str(out / "encoder")]) == 2
    assert f"--model {out / 'encoder'} is inside --output_dir {out}" in capsys.readouterr().err
    with pytest.raises(AssertionError, match="started working"):
        main([*argv, "--no_cache"])


@pytest.fixture
def no_scoring(monkeypatch):
    def forbidden(*args, **kwargs):
        raise AssertionError("the command started working before checking its output")

    monkeypatch.setattr(PMIScorer, "from_pretrained", forbidden)


def test_an_output_file_that_is_a_file_of_an_input_folder_is_refused(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (tmp_path / "report.json").write_text("{}")
    with pytest.raises(DataError, match="is a file of the input folder"):
        check_output(model / "config.json", overwrite=True, inputs=[model])
    with pytest.raises(DataError, match="is the input file"):
        check_output(tmp_path / "report.json", overwrite=True, inputs=[None, model, tmp_path / "report.json"])
    assert check_output(tmp_path / "report.json", overwrite=True, inputs=[model, tmp_path / "absent"])
    assert check_output(model / "new.json", inputs=[model])  # a new file is no input


def test_commands_refuse_to_write_over_the_scorer_or_model_they_read(tmp_path, capsys, no_scoring):
    """``evaluate/score/rerank --output SCORER/config.json --overwrite`` read the scorer, then wrote their report
    over its config (or its metadata, or a fine-tuned encoder's files); rerank's --model folder likewise. A report
    of one's own beside the scorer's files is still replaced."""
    scorer, model = tmp_path / "scorer", tmp_path / "chat"
    (scorer / "encoder").mkdir(parents=True)
    model.mkdir()
    for path in (scorer / "config.json", scorer / "metadata.json", scorer / "encoder" / "tokenizer.json"):
        path.write_text('{"kept": true}')
    (model / "config.json").write_text('{"kept": true}')
    (model / "tokenizer_config.json").write_text('{"kept": true}')
    (model / "ranked.jsonl").write_text("")
    rows = [f'{{"context": "c{i}", "response": "r{i}", "candidates": ["r{i}"]}}\n' for i in range(4)]
    (tmp_path / "pairs.jsonl").write_text("".join(rows))
    (scorer / "eval.json").write_text("{}")
    given = ["--scorer", str(scorer), "--input", str(tmp_path / "pairs.jsonl"), "--overwrite"]
    for command, output, message in (
        ("evaluate", scorer / "config.json", "is the input file"),
        ("evaluate", scorer / "metadata.json", "is the input file"),
        ("score", scorer / "encoder" / "tokenizer.json", "is a file of the input folder"),
        ("rerank", scorer / "config.json", "is the input file"),
        ("rerank", model / "config.json", "is the input file"),
        ("rerank", model / "tokenizer_config.json", "is the input file"),
    ):
        extra = ["--model", str(model)] if command == "rerank" else []
        assert main([command, *given, "--output", str(output), *extra]) == 2
        assert message in capsys.readouterr().err and output.read_text() == '{"kept": true}'
    for command in ("evaluate", "score", "rerank"):
        with pytest.raises(AssertionError, match="started working"):
            main([command, *given, "--output", str(scorer / "eval.json")])
    with pytest.raises(AssertionError, match="started working"):  # a report of one's own in the model's folder
        main(["rerank", *given, "--model", str(model), "--output", str(model / "ranked.jsonl")])

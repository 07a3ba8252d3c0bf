"""Writing outputs: atomic (a kill -9 leaves the old file or the complete new one), checked before any work, valid
JSON (no NaN), with the umask's mode."""

import csv
import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from pmi_reward.data.records import (
    DataError,
    check_output,
    check_output_dir,
    read_records,
    replace_directory,
    write_records,
)

ROOT = Path(__file__).resolve().parent.parent


# The writer stops (and says so) in the middle of its rows (JSONL: after 1000 rows) or once they are all written but
# not yet moved into place (CSV); then it is killed.
STOP = {
    ".jsonl": "real = records._dumps\n"
    "def _dumps(value, calls=[0], **kw):\n"
    "    calls[0] += 1\n"
    "    if calls[0] == 1000: stop()\n"
    "    return real(value, **kw)\n"
    "records._dumps = _dumps\n",
    ".csv": "records.os.chmod = lambda *a: stop()\n",
}


@pytest.mark.parametrize("suffix", list(STOP))
def test_a_kill_9_during_a_write_leaves_the_old_file(tmp_path, suffix):
    target = tmp_path / f"out{suffix}"
    write_records(target, [{"context": "old", "pmi": 1.0}])
    before = target.read_bytes()
    code = (
        "import sys, time\nimport pmi_reward.data.records as records\n"
        "def stop():\n    print('writing', flush=True)\n    time.sleep(600)\n"
        + STOP[suffix]
        + f"records.write_records({str(target)!r}, [{{'context': 'c' * 200, 'pmi': float(i)}} for i in range(5000)])"
    )
    writer = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout.readline() == "writing\n"
        assert [p.name.endswith(".tmp") for p in sorted(tmp_path.iterdir())] == [True, False]  # the new file, half
    finally:
        writer.kill()
        writer.wait()
    assert writer.returncode == -signal.SIGKILL
    assert target.read_bytes() == before


def test_a_complete_write_replaces_the_file_in_one_step(tmp_path):
    target = tmp_path / "out.jsonl"
    write_records(target, [{"a": 1}])
    write_records(target, [{"a": 2}, {"a": 3}])
    assert read_records(target) == [{"a": 2}, {"a": 3}]
    assert [p.name for p in tmp_path.iterdir()] == ["out.jsonl"]  # no temporary file left behind


@pytest.mark.parametrize("suffix", [".json", ".jsonl", ".csv"])
def test_non_finite_numbers_are_written_as_null(tmp_path, suffix):
    target = tmp_path / f"out{suffix}"
    write_records(target, [{"pmi": float("nan")}, {"pmi": float("inf")}, {"pmi": 1.5}])
    text = target.read_text()
    assert "NaN" not in text and "Infinity" not in text
    if suffix == ".csv":  # the cells as read back: empty, not "nan" or "inf" (which read back as numbers)
        with target.open(newline="") as f:
            assert [r["pmi"] for r in csv.DictReader(f)] == ["", "", "1.5"]
    else:
        rows = json.loads(text) if suffix == ".json" else [json.loads(line) for line in text.splitlines()]
        assert [r["pmi"] for r in rows] == [None, None, 1.5]


def test_outputs_are_checked_before_any_work(tmp_path):
    data = tmp_path / "in.csv"
    data.write_text("context,response\na,b\n")
    with pytest.raises(DataError, match="unsupported output type '.txt'"):
        check_output(tmp_path / "out.txt")
    with pytest.raises(DataError, match="is the input file"):
        check_output(data, overwrite=True, inputs=[data])
    with pytest.raises(DataError, match="exists; pass --overwrite"):
        check_output(data, inputs=[tmp_path / "other.csv"])
    assert check_output(data, overwrite=True) == data
    (tmp_path / "dir.csv").mkdir()
    with pytest.raises(DataError, match="is a folder"):
        check_output(tmp_path / "dir.csv", overwrite=True)
    assert check_output(tmp_path / "new" / "deeper" / "out.jsonl").name == "out.jsonl"  # folders are created later


def test_output_folders_are_not_overwritten_without_overwrite(tmp_path):
    scorer = tmp_path / "scorer"
    check_output_dir(scorer)  # absent: fine
    scorer.mkdir()
    check_output_dir(scorer)  # empty: fine
    (scorer / "config.json").write_text("{}")
    with pytest.raises(DataError, match="not empty; pass --overwrite"):
        check_output_dir(scorer)
    check_output_dir(scorer, overwrite=True)
    with pytest.raises(DataError, match="is a file"):
        check_output_dir(scorer / "config.json", overwrite=True)


def test_replace_directory_swaps_in_the_complete_folder(tmp_path):
    target = tmp_path / "scorer"
    target.mkdir()
    (target / "old.txt").write_text("old")

    def failing(folder):
        (folder / "new.txt").write_text("half")
        raise KeyboardInterrupt("killed while filling")

    with pytest.raises(KeyboardInterrupt):
        replace_directory(target, failing)
    assert [p.name for p in tmp_path.iterdir()] == ["scorer"] and (target / "old.txt").exists()
    replace_directory(target, lambda folder: (folder / "new.txt").write_text("new"))
    assert [p.name for p in target.iterdir()] == ["new.txt"] and [p.name for p in tmp_path.iterdir()] == ["scorer"]


def test_an_output_folder_that_is_a_symlink_is_replaced_at_its_target(tmp_path):
    """outputs/scorer -> big/scorer: the link was moved aside (a dangling .old link left behind) and a real folder put
    in its place, while the target kept the old scorer. The target is replaced; the link points at the new one."""
    (tmp_path / "big" / "scorer").mkdir(parents=True)
    (tmp_path / "big" / "scorer" / "f").write_text("old")
    (tmp_path / "outputs").mkdir()
    link = tmp_path / "outputs" / "scorer"
    link.symlink_to(Path("..") / "big" / "scorer")
    with pytest.raises(DataError, match="not empty"):  # the target's files count
        check_output_dir(link)
    check_output_dir(link, overwrite=True)
    assert replace_directory(link, lambda folder: (folder / "f").write_text("new")) == link
    assert link.is_symlink() and (link / "f").read_text() == "new"
    assert [p.name for p in (tmp_path / "outputs").iterdir()] == ["scorer"]
    assert [p.name for p in (tmp_path / "big").iterdir()] == ["scorer"]  # the old folder and the temporary are gone
    (tmp_path / "big" / "gone").symlink_to(tmp_path / "nowhere" / "scorer")  # dangling: the target is created
    replace_directory(tmp_path / "big" / "gone", lambda folder: (folder / "f").write_text("new"))
    assert (tmp_path / "big" / "gone").is_symlink() and (tmp_path / "nowhere" / "scorer" / "f").read_text() == "new"


def test_the_current_folder_is_refused_as_an_output_folder(tmp_path, monkeypatch):
    """--output_dir . passed the check, the whole run trained, then the save failed (Path('.').with_name); replacing
    the current folder (or one holding it) would leave the process and its shell in a deleted folder. Refused before
    any work; a checkpoint folder, written into, may be the current folder."""
    run = tmp_path / "run"
    run.mkdir()
    monkeypatch.chdir(run)
    for given in (".", "/", "..", tmp_path, "sub/../"):
        with pytest.raises(DataError, match="is the current folder or holds it"):
            check_output_dir(given, overwrite=True)
    filled = []
    with pytest.raises(DataError, match="is the current folder or holds it"):
        replace_directory(".", filled.append)
    assert filled == [] and list(run.iterdir()) == []
    check_output_dir(".", overwrite=True, what="--checkpoint_dir", whole=False)
    check_output_dir("scorer")
    assert replace_directory("scorer", lambda folder: (folder / "f").write_text("new")) == Path("scorer")
    assert (run / "scorer" / "f").read_text() == "new"


def test_reading_names_a_folder_or_a_missing_file(tmp_path):
    with pytest.raises(DataError, match="a folder, not a file"):
        read_records(tmp_path)
    with pytest.raises(DataError, match="no such file"):
        read_records(tmp_path / "pairs.csv")


def test_lists_and_objects_in_csv_cells_are_json(tmp_path):
    """The csv module wrote Python's repr ({'a': 1}, single quotes), which no JSON reader reads back."""
    target = tmp_path / "out.csv"
    write_records(target, [{"context": "hi", "meta": {"source": "x", "tags": ["a"]}, "ids": (1, 2)}])
    row = read_records(target)[0]
    assert json.loads(row["meta"]) == {"source": "x", "tags": ["a"]} and json.loads(row["ids"]) == [1, 2]


def test_a_short_row_keeps_a_multi_line_field_that_holds_a_delimiter(tmp_path):
    """A row that omits its last column leaves it None; one whose multi-line context held a comma was refused as an
    unclosed quote. A field whose later lines hold a whole row's delimiters still is (rows swallowed)."""
    path = tmp_path / "rated.csv"
    path.write_text('context,response,rating\n"Hi, there.\nHow are you, friend?",Fine,4\n"Hello, you.\nPlans?",No\n')
    rows = read_records(path)
    assert rows[1] == {"context": "Hello, you.\nPlans?", "response": "No", "rating": None}
    path.write_text('context,response,rating\nHi,"Hmm\nHow are you?,Fine,4\nBye,See you,3"\n')
    with pytest.raises(DataError, match="row 1: fewer values than header columns"):
        read_records(path)


def test_a_short_row_with_a_line_that_reads_as_a_row_is_refused_without_asserting_an_unclosed_quote(tmp_path):
    """A legit short row (its last column left off) whose multi-line field has a later line with a whole row's
    commas reads exactly as a quote left open that swallowed the rows after it: it is still refused, but the error
    said the cause was an unclosed quote, which this file does not have. It now names both readings and what mends
    each (the row given its empty value reads)."""
    path = tmp_path / "short.csv"
    path.write_text(
        'context,response,rating\n"Hi there\nWell, yes, sure",Great,4\n"How are you?\nFine, thanks, you?",Good\n'
    )
    with pytest.raises(DataError) as err:
        read_records(path)
    message = str(err.value)
    assert message.startswith(f"{path}, row 2: fewer values than header columns")
    assert "if a quote was left open" in message and "end the row with an empty value" in message
    assert "a field that opens with an unclosed quote" not in message
    path.write_text('context,response,rating\n"How are you?\nFine, thanks, you?",Good,\n')
    assert read_records(path) == [{"context": "How are you?\nFine, thanks, you?", "response": "Good", "rating": ""}]

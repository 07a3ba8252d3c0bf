"""Line breaks in CSV/TSV cells are the user's text: read as written, scored as JSONL and the API read them, and
written back by `pmi-reward score` unchanged (universal newlines read a cell's \\r\\n and lone \\r as \\n)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from pmi_reward.cli.main import main
from pmi_reward.data.pairs import load_pairs
from pmi_reward.data.records import DataError, read_records, write_records
from pmi_reward.rewards.reward import PMIReward
from pmi_reward.scoring.scorer import PMIScorer

# one context per kind of line break, and all three in one; replies with line breaks of their own
ROWS = [
    {
        "context": "I got a dog\rWhat breed?\rA beagle\rCute! How old?\rTwo months",
        "response": "Puppies are so much work.",
    },
    {"context": "Hi\r\nHello\r\nHow was your day?", "response": "line one\r\nline two"},
    {"context": "I love jazz.\nDo you?\nSometimes.", "response": "Coltrane,\ralways."},
    {"context": "I went hiking.\r\nWhere?\rYosemite!\nNice, when?", "response": "Last week, with friends."},
]


def _write_table(path: Path, rows: list[dict], lineterminator: str = "\r\n") -> Path:
    """``rows`` as the csv module writes them, by ``path``'s suffix. Its minimal quoting quotes a cell holding a
    character of ``lineterminator`` only, so with another row end than \r\n every cell is quoted (a lone \r or \n
    left unquoted ends a row, for any CSV reader)."""
    quoting = csv.QUOTE_MINIMAL if lineterminator == "\r\n" else csv.QUOTE_ALL
    with path.open("w", encoding="utf-8", newline="") as f:
        delimiter = "\t" if path.suffix == ".tsv" else ","
        writer = csv.DictWriter(f, list(rows[0]), delimiter=delimiter, lineterminator=lineterminator, quoting=quoting)
        writer.writeheader()
        writer.writerows(rows)
    return path


@pytest.mark.parametrize("suffix", [".csv", ".tsv"])
@pytest.mark.parametrize("lineterminator", ["\r\n", "\n", "\r"])
def test_table_cells_keep_their_line_breaks(tmp_path, suffix, lineterminator):
    """A quoted cell's \\r\\n and lone \\r came back as \\n, whatever the file's own row ends (\\r\\n as the csv
    module and Excel write them, \\n, or \\r): now every cell reads as written, and the rows end where they did."""
    path = _write_table(tmp_path / f"in{suffix}", ROWS, lineterminator)
    assert read_records(path) == ROWS


@pytest.mark.parametrize("lineterminator", ["\r\n", "\r"])
def test_unclosed_quote_is_named_whatever_the_row_ends(tmp_path, lineterminator):
    """A quote left open swallows the rows after it into one field; with the file read as written, those rows keep
    their \\r\\n or \\r ends inside the field, and are still seen as rows (a DataError naming the row)."""
    lines = ["context,response,rating", 'Hi,"Hmm', "How are you?,Fine,4", 'Bye,See you,3"', ""]
    path = tmp_path / "open.csv"
    path.write_bytes(lineterminator.join(lines).encode())
    with pytest.raises(DataError, match=r"row 1: fewer values than header columns"):
        read_records(path)


def test_pair_file_warns_of_a_reply_swallowing_cr_rows(tmp_path, caplog):
    """load_pairs' check of replies whose later lines read as rows also sees rows ended by a lone \\r."""
    path = tmp_path / "pairs.csv"
    path.write_bytes(b'context,response\rHi,"Hello\rHow are you?,Fine"\rI love jazz.,Coltrane\r')
    with caplog.at_level("WARNING"):
        pairs = load_pairs(path, key_column=None)
    assert pairs.responses[0] == "Hello\rHow are you?,Fine"
    assert "a reply whose later lines read as whole rows" in caplog.text


def test_json_files_keep_escaped_carriage_returns(tmp_path):
    """JSON and JSONL files with \\r\\n or \\r line ends read as before; a \\r escaped in a string is text, kept."""
    jsonl = tmp_path / "in.jsonl"
    jsonl.write_bytes("".join(json.dumps(r) + "\r\n" for r in ROWS).encode())
    assert read_records(jsonl) == ROWS
    old_mac = tmp_path / "cr.jsonl"
    old_mac.write_bytes("".join(json.dumps(r) + "\r" for r in ROWS).encode())
    assert read_records(old_mac) == ROWS
    whole = tmp_path / "in.json"
    whole.write_bytes(json.dumps(ROWS, indent=1).replace("\n", "\r\n").encode())
    assert read_records(whole) == ROWS


@pytest.fixture(scope="module")
def spread_scorer_dir(spread_scorer, tmp_path_factory):
    """``spread_scorer`` (scores below the cap, so that two readings of a row score apart) saved as users save
    scorers, its encoder beside it by path, as ``tiny_scorer_dir`` saves the tiny scorer."""
    from dataclasses import replace

    from pmi_reward.scoring.encoder import TextEncoder

    root = tmp_path_factory.mktemp("spread-scorer")
    encoder = spread_scorer.encoder
    encoder.model.save_pretrained(root / "encoder")
    encoder.tokenizer.save_pretrained(root / "encoder")
    saved = TextEncoder(
        replace(encoder.spec, model=str(root / "encoder")),
        device="cpu",
        model=encoder.model,
        tokenizer=encoder.tokenizer,
    )
    PMIScorer(saved, spread_scorer.template, spread_scorer.head, context_turns=3).save_pretrained(root / "scorer")
    return root / "scorer"


def test_score_reads_csv_jsonl_and_the_api_alike_and_writes_text_back(tmp_path, spread_scorer_dir, monkeypatch):
    """The lone-\\r context was one turn from JSONL and PMIReward but five from CSV (cut to its newest three: another
    score), and `pmi-reward score` wrote every CSV cell back with \\r\\n and \\r made \\n. Now CSV, TSV, JSONL and
    PMIReward give the scorer the same contexts and the same scores, and the output's cells are the input's."""
    seen: dict[str, list[str]] = {}
    real = PMIScorer.score
    current = []

    def spy(self, contexts, responses, **kwargs):
        seen.setdefault(current[-1], []).extend(contexts)
        return real(self, contexts, responses, **kwargs)

    monkeypatch.setattr(PMIScorer, "score", spy)
    inputs = {
        "csv": _write_table(tmp_path / "in.csv", ROWS),
        "tsv": _write_table(tmp_path / "in.tsv", ROWS),
        "jsonl": tmp_path / "in.jsonl",
    }
    inputs["jsonl"].write_text("".join(json.dumps(r) + "\n" for r in ROWS), encoding="utf-8")
    scored = {}
    for kind, given in inputs.items():
        current.append(kind)
        out = tmp_path / f"out.{kind}"
        argv = ["score", "--scorer", str(spread_scorer_dir), "--input", str(given), "--output", str(out)]
        assert main([*argv, "--progress", "false"]) == 0
        scored[kind] = read_records(out)
    current.append("api")
    reward = PMIReward(PMIScorer.from_pretrained(spread_scorer_dir), empty_score=None)
    api = reward([r["context"] for r in ROWS], [r["response"] for r in ROWS])

    assert seen["csv"] == seen["tsv"] == seen["jsonl"] == seen["api"]
    # a lone \r parts no turns, anywhere: the first context is one turn, scored whole (the newest three of five were)
    assert seen["csv"][0] == ROWS[0]["context"]
    pmi = [round(s, 6) for s in api]
    for kind, rows in scored.items():
        assert [r["pmi"] if kind == "jsonl" else float(r["pmi"]) for r in rows] == pmi, kind
        assert [{k: r[k] for k in ("context", "response")} for r in rows] == ROWS, kind
    # the CSV output, read by the csv module itself, holds the user's text byte for byte
    with (tmp_path / "out.csv").open(encoding="utf-8", newline="") as f:
        assert [{k: r[k] for k in ("context", "response")} for r in csv.DictReader(f)] == ROWS


def test_written_csv_reads_back_as_written(tmp_path):
    """write_records then read_records is the identity on cells with \\r\\n, \\r and \\n (it turned them into \\n)."""
    path = tmp_path / "round.csv"
    write_records(path, ROWS)
    assert read_records(path) == ROWS

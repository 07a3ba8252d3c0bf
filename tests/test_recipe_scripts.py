"""The SmolLM2 recipe's scripts that read an evaluation's ``samples.jsonl`` (and the scorer recipe's report, which
reads ``runs.jsonl``): JSON Lines split at ``\\n`` only, and replies a judge left unscored (null) never read as a
score."""

import json

import numpy as np
import pytest
from conftest import load_recipe

# characters that str.splitlines() ends a line at and json.dumps(ensure_ascii=False) writes raw inside a string
SEPARATORS = "one\u2028two\u2029three\x85four"


def _samples(tmp_path, rows: list[dict]) -> None:
    (tmp_path / "samples.jsonl").write_text(
        "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8"
    )


def test_samples_scripts_read_a_reply_holding_unicode_line_separators(tmp_path, monkeypatch, capsys):
    """evaluate-policy writes replies raw: a reply holding U+2028, U+2029 or \\x85 split its row in two for seeds.py,
    overlap.py and repetition.py (str.splitlines), which then ended in JSONDecodeError (final.sh after its
    evaluation)."""
    rows = []
    for c in range(4):
        row = {"context": f"c{c}", "base": [{"reply": "hi there", "pmi": {"j": 0.1 * c}} for _ in range(2)]}
        for s in (0, 1):
            reply = SEPARATORS if c == 1 else "ok then"
            row[f"grpo-s{s}"] = [{"reply": reply, "pmi": {"j": 0.5 + 0.1 * c + 0.2 * k}} for k in range(2)]
        rows.append(row)
    _samples(tmp_path, rows)
    diag = [{"policy": p, "reward_pmi": 0.0, "words": 2.0, "distinct_2": 0.5, "kl_reply": 0.0} for p in rows[0]]
    (tmp_path / "results.json").write_text(json.dumps({"rows": diag[1:]}))
    assert "| grpo | j | 2 | +0.60 / +0.60 |" in load_recipe("recipes/smollm2-135m/seeds.py").summary(tmp_path)
    monkeypatch.setattr("sys.argv", ["overlap.py", str(tmp_path / "samples.jsonl")])
    load_recipe("recipes/smollm2-135m/overlap.py").main()
    assert "| grpo-s0 | 8 | 0.000 | 0.000 |" in capsys.readouterr().out
    monkeypatch.setattr("sys.argv", ["repetition.py", str(tmp_path / "samples.jsonl")])
    load_recipe("recipes/smollm2-135m/repetition.py").main()
    assert "| grpo-s1 | 8 |" in capsys.readouterr().out


def test_scorer_report_reads_a_run_whose_name_holds_a_line_separator(tmp_path, capsys):
    report = load_recipe("recipes/scorer/report.py")
    row = {"stage": "val", "seed": 0, "train_pairs": 100, **{c: 0.5 for c in report.COLUMNS["val"]}}
    runs = tmp_path / "runs.jsonl"
    runs.write_text(json.dumps({**row, "name": f"head {SEPARATORS}"}, ensure_ascii=False) + "\n", encoding="utf-8")
    assert report.main(["--runs", str(runs), "--scaling", "none"]) == 0
    assert f"| head {SEPARATORS} | 100 | 1 |" in capsys.readouterr().out


def test_judge_agreement_never_picks_or_averages_an_unscored_reply(tmp_path):
    """np.argmax took the first NaN: a reply the selector left unscored was its pick, and the evaluator's score of
    it entered the gain (context 0: +1.13 instead of -0.37); a context the evaluator left partly unscored gave a NaN
    that made the whole pair's mean NaN."""
    recipe = load_recipe("recipes/smollm2-135m/judge_agreement.py")
    sel = np.array([[1.0, np.nan, 0.0], [0.2, 0.1, 0.0], [np.nan, np.nan, np.nan]])
    ev = np.array([[0.5, 2.0, 0.1], [1.0, 0.0, 0.0], [1.0, 2.0, 3.0]])
    gain = recipe.pick_gain(sel, ev)
    assert gain[:2].tolist() == pytest.approx([0.5 - 2.6 / 3, 1.0 - 1.0 / 3]) and np.isnan(gain[2])
    ev_gaps = np.array([[0.5, np.nan, 0.1], [1.0, 0.0, 0.0], [1.0, 2.0, 3.0]])
    assert np.isnan(recipe.pick_gain(np.ones((3, 3)), ev_gaps)[0])  # the mean would read two replies of three
    assert recipe.within_spearman(sel, ev) == pytest.approx(np.sqrt(3) / 2)  # context 1 only: 0 and 2 hold a NaN
    rows = [
        {
            "context": f"c{i}",
            "base": [{"pmi": {"a": None if np.isnan(x) else x, "b": y}} for x, y in zip(a, b, strict=True)],
        }
        for i, (a, b) in enumerate(zip(sel[:2], ev[:2], strict=True))
    ]
    (tmp_path / "s.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    text = recipe.agreement(tmp_path / "s.jsonl")
    assert "2 contexts, 3 replies of base each; contexts with a reply left unscored (null), by judge: a 1 (" in text
    assert "| a | b | +0.15 [-0.37, +0.67] | +0.87 |" in text  # both contexts, the pick in 0 the scored 0.5
    assert "| b | a | +0.10 [+0.10, +0.10] | +0.87 |" in text  # context 1 only: a left one of context 0's unscored
    assert "| a | a | +0.10 [+0.10, +0.10] |  |" in text

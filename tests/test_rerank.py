"""Reranking by PMI: order, unscorable candidates, batching, best-of-n sampling, and the CLI."""

import json
import re

import numpy as np
import pytest

from pmi_reward.cli import rerank as rerank_cli
from pmi_reward.cli.main import main
from pmi_reward.data.conversation import turns_to_messages
from pmi_reward.policy.sampling import SamplingSettings, best_of_n, sample_replies
from pmi_reward.rewards.rerank import rerank, rerank_many

CONTEXT = "I love jazz.\nMe too!\nWho is your favourite?"
CANDIDATES = ["Coltrane, no doubt.", "ok", "", "I like pizza.", "Miles Davis and Bill Evans.", "   "]


def _apart(scores) -> None:
    """The scores differ, and the candidates' own order is not already best first: an ordering has to be checked."""
    scores = [s for s in scores if s is not None]
    assert len(set(np.round(scores, 4))) == len(scores) and scores != sorted(scores, reverse=True), scores


def test_rerank_sorts_by_score_and_puts_unscorable_last(spread_scorer):
    direct = spread_scorer.score([CONTEXT] * 4, [c for c in CANDIDATES if c.strip()])
    _apart(direct.tolist())
    ranked = rerank(spread_scorer, CONTEXT, CANDIDATES)
    assert sorted(t for t, _ in ranked) == sorted(CANDIDATES)
    scored = [s for _, s in ranked if s is not None]
    assert scored == sorted(scored, reverse=True) and len(scored) == 4
    assert [t for t, s in ranked if s is None] == ["", "   "]
    assert scored == pytest.approx(sorted(direct.tolist(), reverse=True), abs=1e-5)
    by_text = dict(zip([c for c in CANDIDATES if c.strip()], direct.tolist(), strict=True))
    assert all(s == pytest.approx(by_text[t], abs=1e-5) for t, s in ranked if s is not None)  # each its own score


def test_chat_context_ranks_like_plain_context(spread_scorer):
    chat = turns_to_messages(CONTEXT, system_prompt="Be nice.")
    assert chat[-1] == {"role": "user", "content": "Who is your favourite?"} and chat[0]["role"] == "system"
    plain = rerank(spread_scorer, CONTEXT, CANDIDATES)
    _apart(spread_scorer.score([CONTEXT] * 4, [c for c in CANDIDATES if c.strip()]).tolist())
    assert [t for t, _ in rerank(spread_scorer, chat, CANDIDATES)] == [t for t, _ in plain]
    assert [s for _, s in rerank(spread_scorer, chat, CANDIDATES)] == pytest.approx([s for _, s in plain], abs=1e-5)


def test_rerank_many_matches_one_by_one(spread_scorer):
    contexts = [CONTEXT, "Did you watch the match?", "我喜欢音乐"]
    cands = [CANDIDATES[:3], ["No.", "Yes, what a goal!"], ["我也是", "🎵"]]
    many = rerank_many(spread_scorer, contexts, cands)
    for ctx, c, ranked in zip(contexts, cands, many, strict=True):
        scorable = [x for x in c if x.strip()]
        direct = spread_scorer.score([ctx] * len(scorable), scorable).tolist()
        assert len(set(np.round(direct, 4))) == len(direct)  # the order is something to check
        one = rerank(spread_scorer, ctx, c)
        assert [t for t, _ in ranked] == [t for t, _ in one]
        assert [s for _, s in ranked] == pytest.approx([s for _, s in one], abs=1e-5)
        assert [s for _, s in ranked if s is not None] == pytest.approx(sorted(direct, reverse=True), abs=1e-5)
    assert any(c != [t for t, _ in ranked] for c, ranked in zip(cands, many, strict=True))  # some list was reordered
    assert rerank(spread_scorer, CONTEXT, []) == []
    with pytest.raises(ValueError):
        rerank_many(spread_scorer, contexts, cands[:1])


def test_sampling_is_seeded_and_best_of_n_ranks_n_replies(spread_scorer, tiny_policy, smol_tokenizer):
    model = tiny_policy()
    settings = SamplingSettings(max_new_tokens=5, batch_size=3, seed=7)
    prompts = [turns_to_messages(CONTEXT), "plain prompt"]
    first = sample_replies(model, smol_tokenizer, prompts, n=2, settings=settings)
    assert len(first) == 2 and all(len(r) == 2 for r in first)
    assert sample_replies(model, smol_tokenizer, prompts, n=2, settings=settings) == first
    ranked = best_of_n(spread_scorer, model, smol_tokenizer, CONTEXT, n=4, settings=settings)
    assert len(ranked) == 4
    scores = [s for _, s in ranked if s is not None]
    assert len(set(np.round(scores, 4))) == len(scores) >= 2  # the replies score apart: the order is checked
    assert scores == sorted(scores, reverse=True)


def test_cli_inline_and_file(spread_scorer, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(rerank_cli.PMIScorer, "from_pretrained", staticmethod(lambda path, **k: spread_scorer))
    assert (
        main(
            [
                "rerank",
                "--scorer",
                "x",
                "--context",
                "I love jazz.",
                "Who is your favourite?",
                "--candidates",
                "Coltrane.",
                "ok",
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert "Coltrane." in printed and "ok" in printed
    rows = [
        {"context": CONTEXT, "candidates": CANDIDATES[:4], "id": 1},
        {"context": turns_to_messages("Did you watch the match?"), "candidates": ["Yes!", "No."], "id": 2},
    ]
    src, out = tmp_path / "rows.jsonl", tmp_path / "ranked.jsonl"
    src.write_text("\n".join(json.dumps(r) for r in rows))
    assert main(["rerank", "--scorer", "x", "--input", str(src), "--output", str(out)]) == 0
    got = [json.loads(line) for line in out.read_text().splitlines()]
    assert [g["id"] for g in got] == [1, 2]
    pmis = [r["pmi"] for r in got[0]["ranked"] if r["pmi"] is not None]
    _apart(spread_scorer.score([CONTEXT] * 3, [c for c in CANDIDATES[:4] if c.strip()]).tolist())
    assert got[0]["best"] == got[0]["ranked"][0]["text"] and pmis == sorted(pmis, reverse=True)
    assert np.isfinite(pmis).all() and len(pmis) == 3


def test_cli_errors_name_the_row(tiny_scorer, tmp_path, monkeypatch, capsys):
    """One line on stderr and exit code 2 (``--debug``: the exception itself)."""
    monkeypatch.setattr(rerank_cli.PMIScorer, "from_pretrained", staticmethod(lambda path: tiny_scorer))
    src = tmp_path / "bad.jsonl"
    good, bad = {"context": "hi", "candidates": ["a"]}, {"context": "hi", "candidates": "a"}
    src.write_text(json.dumps(good) + "\n" + json.dumps(bad))
    argv = ["rerank", "--scorer", "x", "--input", str(src), "--output", str(tmp_path / "o.jsonl")]
    assert main(argv) == 2
    assert re.search("row 2.*candidates", capsys.readouterr().err)
    with pytest.raises(Exception, match="row 2.*candidates"):
        main([*argv, "--debug"])
    # a context list that holds no chat messages would be read as an empty context: the ranking would ignore it
    for context in (["I love jazz.", "Who is your favourite?"], [{"content": "hi"}], [{"role": "user"}]):
        src.write_text(json.dumps(good) + "\n" + json.dumps({"context": context, "candidates": ["a", "b"]}))
        assert main(argv) == 2
        assert re.search("row 2, field 'context': expected text or chat messages", capsys.readouterr().err)
    src.write_text(json.dumps({"context": "hi"}))
    assert main(argv) == 2
    assert "--model" in capsys.readouterr().err
    assert main([*argv, "--debug"]) == 2  # our own message: exit 2 with --debug too, the traceback shown
    err = capsys.readouterr().err
    assert "Traceback" in err and "--model" in err


def test_cli_refuses_a_best_of_zero_before_loading_the_chat_model(monkeypatch, capsys):
    from pmi_reward.policy import loading

    monkeypatch.setattr(loading, "load_policy", lambda *a, **k: pytest.fail("the chat model loaded before the check"))
    assert main(["rerank", "--context", "I love jazz.", "--model", "smollm2-135m-instruct", "--n", "0"]) == 2
    assert "n must be >= 1, got 0" in capsys.readouterr().err
    # --input beside --context/--candidates: one of them was dropped without a word
    assert main(["rerank", "--input", "rows.jsonl", "--context", "zzz", "--candidates", "q"]) == 2
    assert "not both" in capsys.readouterr().err


def test_a_row_with_nothing_scorable_has_no_best(tiny_scorer, tmp_path, monkeypatch):
    """`best` was the first candidate even when none could be scored (an empty reply for a best-of-n pipeline)."""
    monkeypatch.setattr(rerank_cli.PMIScorer, "from_pretrained", staticmethod(lambda path, **k: tiny_scorer))
    src, out = tmp_path / "rows.jsonl", tmp_path / "ranked.jsonl"
    src.write_text(json.dumps({"context": CONTEXT, "candidates": ["", "   "]}) + "\n")
    assert main(["rerank", "--scorer", "x", "--input", str(src), "--output", str(out)]) == 0
    assert json.loads(out.read_text())["best"] is None


def test_best_of_n_ranks_unscorable_replies_last(monkeypatch):
    """The pool was ranked with the report's empty_score 0.0: an empty reply beat a group of negative PMI."""
    from pmi_reward.policy import evaluate
    from pmi_reward.policy.sampling import Replies
    from pmi_reward.rewards.reward import PMIReward

    class Negative:  # a scorer that finds every reply a little off
        context_turns = None

        def score(self, contexts, replies, progress=False):
            return np.full(len(replies), -1.0, dtype=np.float32)

    pool = Replies([["Coltrane.", ""]], [[[1], []]], [[False, False]])
    monkeypatch.setattr(evaluate, "generate_replies", lambda *a, **k: pool)
    args = evaluate.EvalArguments(best_of_n=[2], samples=1, kl=False)
    rows = evaluate._best_of_n(
        (None, None), [CONTEXT], PMIReward(Negative(), empty_score=0.0), args, SamplingSettings()
    )
    assert rows["best-of-2"].texts == [["Coltrane."]]

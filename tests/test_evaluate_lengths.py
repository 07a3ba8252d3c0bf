"""The length diagnostics of evaluate-policy (length bins, their edges, the length-adjusted gain) measure the answer
the judges read: a reasoning model's ``<think>`` block is no part of it."""

import numpy as np
import pytest

from pmi_reward.data.conversation import turns_to_messages
from pmi_reward.policy.evaluate import EvalArguments, evaluate_policies
from pmi_reward.policy.panel import Judge
from pmi_reward.policy.sampling import Replies


def _replies(texts: list[list[str]]) -> Replies:
    return Replies(texts, [[[1]] * len(row) for row in texts], [[False] * len(row) for row in texts])


def test_length_bins_and_adjusted_gain_read_the_answer_not_the_reasoning(spread_scorer):
    """A policy that writes the base's very answers after reasoning of random length gains nothing by the judge;
    its length bins, edges and length-adjusted gain read the whole reply (reasoning included): its answers fell in
    the top bins, the base's alike ones lower, and the length correction gave it a gain of -0.32."""
    prompts = [
        turns_to_messages(t)
        for t in ("I love jazz.\nWho do you like?", "I flew to Rome.\nHow was it?", "Did you watch the match?")
    ]
    answers = [
        ["Coltrane is great.", "I like Miles Davis a lot", "Ok"],
        ["It was lovely", "Rome? Wow", "The food was amazing there, pasta"],
        ["Yes we won!", "No", "I missed it sadly, work"],
    ]
    rng = np.random.default_rng(0)
    reasoned = [
        [f"<think>\n{' '.join(['hmm'] * int(rng.integers(5, 40)))}\n</think>\n\n{a}" for a in r] for r in answers
    ]
    judge = Judge("j", "x", spread_scorer, {"encoder": "other", "data": {"train_file": "x.csv"}, "best_val_auc": 0.7})
    replies = {"base": _replies(answers), "thinker": _replies(reasoned), "plain": _replies([list(r) for r in answers])}
    out = evaluate_policies({}, prompts, [judge], None, EvalArguments(kl=False), replies=replies)
    rows = {r["policy"]: r for r in out["rows"]}
    thinker, plain = rows["thinker"]["judges"]["j"], rows["plain"]["judges"]["j"]
    assert thinker["gain"] == pytest.approx(0.0, abs=1e-6)  # the judge reads the answer only
    assert thinker["len_adj_gain"] == pytest.approx(0.0, abs=1e-6)
    assert thinker["binned_gain"] == pytest.approx(0.0, abs=1e-6)
    shown = [(b["bin"], b["n_policy"], b["n_base"]) for b in thinker["bins"]]
    assert shown == [(b["bin"], b["n_policy"], b["n_base"]) for b in plain["bins"]] and len(shown) > 1
    assert all(n == m for _, n, m in shown) and all(b["gain"] == pytest.approx(0.0, abs=1e-6) for b in thinker["bins"])
    assert rows["thinker"]["words"] == rows["base"]["words"]
    assert out["length_edges"][-1] < 10  # the answers' lengths (at most 6 words), not the reasoning's

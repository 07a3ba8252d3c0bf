"""Graded supervision: other turns of a dialogue as positives of weight w (pmi_reward.data.graded)."""

import numpy as np
import pytest
import torch

from pmi_reward.data.graded import partial_replies
from pmi_reward.data.negatives import NegativeSpec
from pmi_reward.data.pairs import PairSet
from pmi_reward.scoring.features import TensorFeatures
from pmi_reward.scoring.head import HeadConfig
from pmi_reward.training.loop import TrainConfig, score_index_pairs, train_head


@pytest.fixture
def pairs(topic_dialogues):
    return PairSet.from_dialogues(topic_dialogues[:40], max_context_turns=2)


def test_partial_replies_are_other_turns_of_the_dialogue_never_gold_nor_context(pairs):
    out = partial_replies(pairs, 3, np.random.default_rng(0))
    assert out.shape == (len(pairs), 3) and (out >= 0).all()  # every topic dialogue has turns to spare
    for i in range(len(pairs)):
        g, c = pairs.group[i], pairs.ctx[i]
        pool = set(pairs.pool[pairs.pool_ptr[g] : pairs.pool_ptr[g + 1]].tolist())
        lines = set(pairs.lines[pairs.line_ptr[c] : pairs.line_ptr[c + 1]].tolist())
        assert set(out[i].tolist()) <= pool - lines - {pairs.resp[i]}


def test_a_partial_reply_is_found_when_one_turn_of_many_is_left():
    """A long dialogue read whole: the pair at turn 19 has 18 context lines and one turn to spare (turn 20). It is
    drawn every time, not missed when random tries run out (-1: the positive was dropped from training)."""
    turns = [f"turn {i}" for i in range(21)]
    pairs = PairSet.from_pairs(["\n".join(turns[:t]) for t in range(1, 21)], turns[1:], keys=["d"] * 20)
    draws = partial_replies(pairs, 2, np.random.default_rng(0), rows=np.full(500, 18))
    assert {pairs.responses[j] for j in draws.ravel()} == {"turn 20"}
    last = partial_replies(pairs, 1, np.random.default_rng(0), rows=np.array([19]))  # turn 20: nothing left
    assert last.tolist() == [[-1]]


def test_a_multi_line_turn_is_never_partial_credit_for_its_own_copy():
    """A turn with line breaks was one text as a dialogue candidate and another as a context line: the copy of a
    context line earned graded credit, which the module promises it never does."""
    from pmi_reward.data.dialogues import Dialogue

    dialogues = [
        Dialogue("a", ("My list:\n1. eggs\n2. milk", "Anything else?", "Bread too.")),
        Dialogue("b", ("x", "y")),
    ]
    pairs = PairSet.from_dialogues(dialogues, max_context_turns=2)
    out = partial_replies(pairs, 8, np.random.default_rng(0))
    for i in range(len(pairs)):
        lines = set(pairs.context_texts[i].split("\n"))
        assert not {" ".join(pairs.responses[j].split("\n")) for j in out[i] if j >= 0} & lines  # as read


def test_partial_replies_are_missing_where_the_dialogue_has_none():
    # a 3-turn dialogue: the last turn's context holds both others, so nothing is left for it
    pairs = PairSet.from_pairs(["a\nb", "a"], ["c", "b"], keys=["d", "d"])
    out = partial_replies(pairs, 2, np.random.default_rng(0))
    assert (out[0] == -1).all()
    assert set(out[1].tolist()) == {pairs.responses.index("c")}


def _scores_of_partials(pairs: PairSet, graded: int, weight: float) -> np.ndarray:
    """Train a head on features that identify each text (nothing shared between turns), return its scores of fixed
    partial pairs."""
    g = torch.Generator().manual_seed(0)
    features = TensorFeatures(
        torch.randn(len(pairs.contexts), 16, generator=g), torch.randn(len(pairs.responses), 16, generator=g)
    )
    config = TrainConfig(
        batch_size=32, epochs=30, patience=30, seed=0, lr=3e-3, graded_in_dialogue=graded, graded_weight=weight
    )
    head = train_head(
        HeadConfig(dim=16, hidden=[64]),
        features,
        pairs,
        features,
        pairs,
        config,
        False,
        negatives=NegativeSpec(3, 0, 0),
    ).head
    partial = partial_replies(pairs, 1, np.random.default_rng(123))[:, 0]
    return score_index_pairs(head, features, pairs.ctx, partial)


def test_graded_training_gives_other_turns_partial_credit(pairs):
    """Counted as positives of weight w, the dialogue's other turns score above what a binary head gives them, the
    more so the larger w (measured: 0.35, 0.63, 1.36 nat for w = 0, 0.25, 1)."""
    binary, light, full = (_scores_of_partials(pairs, 2 * (w > 0), w).mean() for w in (0.0, 0.25, 1.0))
    assert binary < light < full and full > binary + 0.5


@pytest.mark.parametrize(("option", "value"), [("graded_in_dialogue", -1), ("graded_weight", -0.5)])
def test_graded_options_out_of_range_are_refused(option, value):
    with pytest.raises(ValueError, match=option):
        TrainConfig(**{option: value})


def test_graded_supervision_refuses_infonce():
    with pytest.raises(ValueError, match="infonce"):
        TrainConfig(objective="infonce", graded_in_dialogue=1)

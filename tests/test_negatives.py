import numpy as np
import pytest

from pmi_reward.data.negatives import NegativeSpec, random_from_batch, sample_negatives
from pmi_reward.data.pairs import PairSet


@pytest.fixture
def pairs(topic_dialogues):
    return PairSet.from_dialogues(topic_dialogues, max_context_turns=2)


def test_negatives_never_equal_gold_and_kinds_are_right(pairs):
    negs = sample_negatives(pairs, NegativeSpec(k_random=3, k_in_dialogue=2, k_context=0), np.random.default_rng(0))
    assert negs.shape == (len(pairs), 5)
    assert not np.any(negs == pairs.resp[:, None])
    texts = np.array(pairs.responses, dtype=object)
    assert not np.any(texts[negs] == texts[pairs.resp][:, None])
    # random columns come from other dialogues' responses; in-dialogue columns from the same dialogue
    owner = {}
    for g, r in zip(pairs.group, pairs.resp, strict=True):
        owner.setdefault(r, set()).add(g)
    for i in range(len(pairs)):
        g = pairs.group[i]
        pool = set(pairs.pool[pairs.pool_ptr[g] : pairs.pool_ptr[g + 1]].tolist())
        assert all(owner[r] - {g} for r in negs[i, :3])
        assert all(r in pool for r in negs[i, 3:])


def test_negatives_are_seeded_and_resampled(pairs):
    spec = NegativeSpec(2, 1, 0)
    a = sample_negatives(pairs, spec, np.random.default_rng(1))
    b = sample_negatives(pairs, spec, np.random.default_rng(1))
    rng = np.random.default_rng(1)
    c1, c2 = sample_negatives(pairs, spec, rng), sample_negatives(pairs, spec, rng)
    assert np.array_equal(a, b)
    assert not np.array_equal(c1, c2)


def test_in_dialogue_falls_back_when_dialogue_has_no_other_turn():
    pairs = PairSet.from_pairs(["a", "b", "c"], ["x", "y", "z"])  # every pair its own dialogue, one-line contexts
    pairs_no_ctx = PairSet.from_pairs(["", "", ""], ["x", "y", "z"])
    for p in (pairs, pairs_no_ctx):
        negs = sample_negatives(p, NegativeSpec(0, 2, 0), np.random.default_rng(0))
        assert not np.any(negs == p.resp[:, None])


def test_impossible_negatives_raise():
    pairs = PairSet.from_pairs(["a", "b"], ["same", "same"])
    with pytest.raises(ValueError, match="same response"):
        sample_negatives(pairs, NegativeSpec(1, 0, 0), np.random.default_rng(0))


def test_spec_validation():
    with pytest.raises(ValueError):
        NegativeSpec(-1, 2)
    with pytest.raises(ValueError, match="empty mix"):  # an empty mix is a valid spec (evaluation), not a draw
        sample_negatives(PairSet.from_pairs(["a", "b"], ["x", "y"]), NegativeSpec(0, 0, 0), np.random.default_rng(0))


def test_in_context_negatives_are_lines_of_the_context(pairs):
    negs = sample_negatives(pairs, NegativeSpec(0, 0, 2), np.random.default_rng(0))
    for i in range(len(pairs)):
        lines = set(pairs.contexts[pairs.ctx[i]].split("\n"))
        gold = pairs.responses[pairs.resp[i]]
        for r in negs[i]:
            text = pairs.responses[r]
            assert text != gold
            assert text in lines or gold in lines  # only a context made of gold copies falls back


def test_random_negatives_from_the_batch_are_its_replies_of_other_dialogues():
    # 24 distinct replies in 8 dialogues of 3 pairs each: a reply names its batch position and its dialogue
    pairs = PairSet.from_pairs(
        [f"c{i}" for i in range(24)], [f"r{i}" for i in range(24)], [str(i // 3) for i in range(24)]
    )
    rng = np.random.default_rng(0)
    batch = rng.choice(24, 10, replace=False)
    negs = random_from_batch(pairs, batch, 3, rng)
    assert negs.shape == (10, 3)
    for i, row in zip(batch, negs, strict=True):
        others = {pairs.resp[j] for j in batch if pairs.group[j] != pairs.group[i]}
        assert set(row) <= others and len(set(row)) == 3


def test_random_negatives_from_a_batch_too_small_come_from_the_whole_set():
    pairs = PairSet.from_pairs(
        [f"c{i}" for i in range(12)], [f"r{i}" for i in range(12)], [str(i // 4) for i in range(12)]
    )
    one_dialogue = np.array([0, 1, 2])  # no reply of another dialogue in the batch
    negs = random_from_batch(pairs, one_dialogue, 2, np.random.default_rng(0))
    assert negs.shape == (3, 2)
    dialogue_of = dict(zip(pairs.resp.tolist(), pairs.group.tolist(), strict=True))
    assert all(dialogue_of[r] != 0 for r in negs.ravel())


def test_random_negatives_from_a_batch_smaller_than_k_fill_from_the_whole_set():
    """A training pass's last batch may hold fewer pairs than k_random: it raised IndexError (the end of round 1 of a
    train_encoder run). Its slots past the batch are drawn from the whole set; batches of k or more draw as before."""
    pairs = PairSet.from_pairs(
        [f"c{i}" for i in range(12)], [f"r{i}" for i in range(12)], [str(i // 2) for i in range(12)]
    )
    for batch in ([3], [3, 4]):
        negs = random_from_batch(pairs, np.array(batch), 3, np.random.default_rng(0))
        assert negs.shape == (len(batch), 3)
        assert (negs >= 0).all() and not (negs == pairs.resp[batch][:, None]).any()
        dialogue_of = dict(zip(pairs.resp.tolist(), pairs.group.tolist(), strict=True))
        assert all(dialogue_of[int(r)] != pairs.group[i] for i, row in zip(batch, negs, strict=True) for r in row)
    # the draws of batches of k and more rows, recorded before the fix: unchanged
    drawn = {
        (0, 2, 4): [[8, 4, 18], [8, 0, 0], [4, 0, 20]],
        (0, 1, 5, 7, 9, 11): [[10, 18, 22], [14, 22, 10], [18, 0, 22], [0, 2, 18], [14, 10, 2], [2, 0, 18]],
    }
    for batch, expected in drawn.items():
        assert random_from_batch(pairs, np.array(batch), 3, np.random.default_rng(1)).tolist() == expected


def test_random_negatives_come_from_other_dialogues_even_beside_a_dominant_one():
    """One 300-turn dialogue beside five short ones: random tries mostly land in the big one, and once they ran out
    half of its negatives were its own turns. Every one now comes from another dialogue (uniform over their pairs);
    a corpus of one dialogue still draws its other turns, and one text everywhere cannot give a negative."""
    from pmi_reward.data.dialogues import Dialogue

    big = Dialogue("big", tuple(f"turn {i} of the long chat" for i in range(300)))
    small = [Dialogue(f"s{j}", (f"hello {j}", f"reply {j}")) for j in range(5)]
    pairs = PairSet.from_dialogues([big, *small], max_context_turns=3)
    negs = sample_negatives(pairs, NegativeSpec(k_random=2, k_context=0), np.random.default_rng(0))
    rows = np.flatnonzero(pairs.group == pairs.group[0])
    own = set(pairs.pool[pairs.pool_ptr[pairs.group[0]] : pairs.pool_ptr[pairs.group[0] + 1]].tolist())
    assert not own & set(negs[rows].ravel().tolist())
    assert {pairs.responses[r] for r in negs[rows].ravel()} == {f"reply {j}" for j in range(5)}
    lone = PairSet.from_dialogues([big], max_context_turns=3)
    negs = sample_negatives(lone, NegativeSpec(k_random=1, k_context=0), np.random.default_rng(0))[:, 0]
    assert (negs != lone.resp).all() and len(set(negs.tolist())) > 100


def test_a_padded_reply_is_one_text_with_its_context_line():
    """A pair file's reply "I am fine, you? " is the next row's context line "I am fine, you?": one text, so an
    in-dialogue negative is never the gold reply written with a trailing space."""
    pairs = PairSet.from_pairs(["Hi", "Hi\nI am fine, you? "], ["I am fine, you? ", "Great."], keys=["d", "d"])
    assert pairs.responses[pairs.resp[0]] == "I am fine, you?"
    spec = NegativeSpec(k_random=0, k_context=0, k_in_dialogue=1)
    negs = sample_negatives(pairs, spec, np.random.default_rng(0), rows=np.zeros(50, int))[:, 0]
    assert "I am fine, you?" not in {pairs.responses[n] for n in negs}


def test_a_multi_line_reply_of_a_pair_file_is_one_text_with_its_context_line():
    """A pair file's reply "I am fine.\nYou?" is the next row's context line "I am fine. You?" (a turn's line breaks
    read as spaces): one text, so its context-line copy is never an in-dialogue negative of its own pair."""
    contexts = ["Hi", "Hi\nI am fine. You?", "Hi\nI am fine. You?\nGreat."]
    pairs = PairSet.from_pairs(contexts, ["I am fine.\nYou?", "Great.", "Bye."], keys=["d", "d", "d"])
    assert pairs.responses[pairs.resp[0]] == "I am fine. You?"
    spec = NegativeSpec(k_random=0, k_context=0, k_in_dialogue=1)
    negs = sample_negatives(pairs, spec, np.random.default_rng(0), rows=np.zeros(50, int))[:, 0]
    assert {pairs.responses[n] for n in negs} == {"Hi", "Great.", "Bye."}  # every other turn, not the gold one

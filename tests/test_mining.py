"""Mined hard negatives: lexical look-alikes and the encoder's nearest replies, never from the same dialogue; and
scrambles of the gold reply."""

import numpy as np
import pytest

from pmi_reward.data.dialogues import Dialogue
from pmi_reward.data.mining import mine_lexical, mine_nearest, mine_scrambled, scramble
from pmi_reward.data.negatives import KINDS, NegativeSpec, sample_negatives
from pmi_reward.data.pairs import PairSet

DIALOGUES = [
    Dialogue("jazz", ("Do you like jazz music?", "I love jazz, Coltrane is my favourite.", "Mine too!")),
    Dialogue("dogs", ("My dog chased a squirrel today.", "Did the dog catch the squirrel?", "No, it got away.")),
    Dialogue("music", ("What music do you play?", "Mostly jazz music on the piano.", "Cool, classical too?")),
    Dialogue("cats", ("My cat sleeps all day.", "Cats are lazy.", "Indeed.")),
]


@pytest.fixture
def pairs():
    return PairSet.from_dialogues(DIALOGUES, max_context_turns=2)


def test_lexical_look_alikes_share_words_and_come_from_other_dialogues(pairs):
    mine_lexical(pairs, m=2)
    ptr, pool = pairs.mined["lexical"]
    ctx = pairs.contexts.index("Do you like jazz music?")
    mined = [pairs.responses[r] for r in pool[ptr[ctx] : ptr[ctx + 1]]]
    assert mined[0] == "Mostly jazz music on the piano."  # shares "jazz" and "music", answers nothing
    for c, text in enumerate(pairs.contexts):
        own = {pairs.responses[r] for i, r in enumerate(pairs.resp) if pairs.ctx[i] == c}
        dialogue = next(d for d in DIALOGUES if text.split("\n")[0] in d.turns)
        for r in pool[ptr[c] : ptr[c + 1]]:
            assert pairs.responses[r] not in dialogue.turns and pairs.responses[r] not in own


def test_nearest_replies_follow_the_embeddings(pairs):
    rng = np.random.default_rng(0)
    u = rng.normal(size=(len(pairs.contexts), 8))
    v = rng.normal(size=(len(pairs.responses), 8))
    target = pairs.resp[pairs.group != pairs.group[0]][0]  # a reply of another dialogue
    v[target] = u[pairs.ctx[0]] * 10  # make it the nearest reply to the first context
    mine_nearest(pairs, u, v, m=1)
    ptr, pool = pairs.mined["nearest"]
    assert pool[ptr[pairs.ctx[0]]] == target


def test_mined_kinds_are_sampled_in_their_columns_and_need_mining(pairs):
    spec = NegativeSpec(k_random=1, k_in_dialogue=0, k_context=0, k_lexical=2)
    assert list(spec.counts()) == list(KINDS) and spec.k == 3
    with pytest.raises(ValueError, match="mine_lexical"):
        sample_negatives(pairs, spec, np.random.default_rng(0))
    mine_lexical(pairs, m=3)
    negs = sample_negatives(pairs, spec, np.random.default_rng(0))
    ptr, pool = pairs.mined["lexical"]
    for i, row in enumerate(negs):
        c = pairs.ctx[i]
        assert set(row[1:]) <= set(pool[ptr[c] : ptr[c + 1]])
        assert pairs.resp[i] not in row


@pytest.mark.parametrize("mine", ["lexical", "nearest"])
def test_a_corpus_smaller_than_m_never_mines_the_own_dialogue(mine):
    # 2 dialogues of 2 replies each: m=32 asks for more replies of other dialogues than there are
    pairs = PairSet.from_dialogues(DIALOGUES[:2], max_context_turns=2)
    if mine == "lexical":
        mine_lexical(pairs, m=32)
    else:
        rng = np.random.default_rng(0)
        mine_nearest(pairs, rng.normal(size=(len(pairs.contexts), 8)), rng.normal(size=(len(pairs.responses), 8)))
    ptr, pool = pairs.mined[mine]
    dialogue_of = {r: g for r, g in zip(pairs.resp.tolist(), pairs.group.tolist(), strict=True)}
    for i in range(len(pairs)):
        c, g = pairs.ctx[i], pairs.group[i]
        assert [dialogue_of[r] for r in pool[ptr[c] : ptr[c + 1]]] == [1 - g] * 2  # both replies of the other
    spec = NegativeSpec(k_random=0, k_context=0, **{f"k_{mine}": 4})
    negs = sample_negatives(pairs, spec, np.random.default_rng(0))
    assert all(dialogue_of[r] != pairs.group[i] for i, row in enumerate(negs) for r in row)


def test_a_context_shared_by_dialogues_never_mines_the_turns_of_any_of_them():
    """An opener ("hi") in two dialogues took the first one's dialogue only: the second's own next turn could be
    drawn as a 'look-alike of another dialogue'."""
    dialogues = [
        Dialogue("a", ("hi", "hello, how is your garden")),
        Dialogue("b", ("hi", "hey, my garden roses bloom", "nice garden roses")),
        Dialogue("c", ("cars", "cars are fast", "garden roses are red")),
    ]
    pairs = PairSet.from_dialogues(dialogues, max_context_turns=1)
    mine_lexical(pairs, m=8)
    ptr, pool = pairs.mined["lexical"]
    hi = pairs.contexts.index("hi")
    mined = {pairs.responses[r] for r in pool[ptr[hi] : ptr[hi + 1]]}
    assert mined and not mined & {"hello, how is your garden", "hey, my garden roses bloom", "nice garden roses"}


def test_scrambles_are_the_gold_replys_words_in_another_order_drawn_for_its_own_context(pairs):
    rng = np.random.default_rng(0)
    assert scramble("ok then") is None and scramble("no no no") is None
    text = "I love jazz, Coltrane is my favourite."
    out = scramble(text)
    assert out != text and sorted(out.split()) == sorted(text.split())
    assert scramble(text) == out and scramble(text, seed=1) != out  # seeded by the text: the same wherever it is read
    n = len(pairs.responses)
    spec = NegativeSpec(k_random=0, k_context=0, k_scrambled=1)
    with pytest.raises(ValueError, match="mine_scrambled"):
        sample_negatives(pairs, spec, rng)
    mine_scrambled(pairs)
    mine_scrambled(pairs)  # once only
    assert len(pairs.responses) > n
    negs = sample_negatives(pairs, spec, np.random.default_rng(0))[:, 0]
    for i, r in enumerate(negs):
        gold = pairs.responses[pairs.resp[i]]
        if len(gold.split()) >= 3:
            assert r >= n and sorted(pairs.responses[r].split()) == sorted(gold.split())
        else:  # "Indeed." has no scramble: a random reply of another dialogue
            assert r != pairs.resp[i] and r < n


def test_pairs_that_share_a_context_each_get_their_own_replys_scramble():
    """Ten dialogues open with "hi": each pair's scrambled negative is its own reply's words (the table was by
    context, so most got another pair's reply scrambled)."""
    from pmi_reward.data.dialogues import Dialogue

    dialogues = [Dialogue(f"d{i}", ("hi", f"my cat number {i} likes fish", "ok")) for i in range(10)]
    pairs = PairSet.from_dialogues(dialogues, max_context_turns=1)
    mine_scrambled(pairs)
    spec = NegativeSpec(k_random=0, k_context=0, k_scrambled=1)
    negs = sample_negatives(pairs, spec, np.random.default_rng(0))[:, 0]
    rows = np.flatnonzero(pairs.ctx == pairs.contexts.index("hi"))
    assert len(rows) == 10
    for i in rows:
        gold = pairs.responses[pairs.resp[i]]
        assert sorted(pairs.responses[negs[i]].split()) == sorted(gold.split()) and pairs.responses[negs[i]] != gold


def test_a_scorer_trains_and_is_evaluated_with_scrambled_negatives(topic_dialogues, tiny_encoder_factory):
    from pmi_reward.scoring.head import HeadConfig
    from pmi_reward.scoring.templates import TEMPLATES
    from pmi_reward.training.fit import fit_scorer, score_with_negatives
    from pmi_reward.training.loop import TrainConfig

    train, val = PairSet.from_dialogues(topic_dialogues[:24]), PairSet.from_dialogues(topic_dialogues[60:72])
    spec = NegativeSpec(k_random=2, k_context=0, k_scrambled=1)
    scorer, result = fit_scorer(
        train, val, tiny_encoder_factory(), TEMPLATES["en"], TrainConfig(batch_size=8, epochs=2), HeadConfig(), spec,
        progress=False,
    )  # fmt: skip
    assert "scrambled" in train.mined and "scrambled" in val.mined  # added before the features were built
    assert scorer.metadata["training"]["k_scrambled"] == 1 and np.isfinite(result.best_val_auc)
    test = PairSet.from_dialogues(topic_dialogues[72:80])
    n = len(test.responses)
    pos, neg = score_with_negatives(scorer, test, NegativeSpec(k_random=0, k_context=0, k_scrambled=1))
    ptr, pool = test.mined["scrambled"]
    assert len(pool) and set(pool.tolist()) <= set(range(n, len(test.responses)))  # new texts, embedded and scored
    assert neg.shape == (len(test), 1) and np.isfinite(neg).all() and np.isfinite(pos).all()


def test_contexts_with_nothing_to_mine_are_named(caplog):
    """A file whose rows share one dialogue key (the study's human.csv) has no reply of another dialogue: every
    mined draw is a random reply, which the caller should know."""
    one = PairSet.from_pairs(["hi", "how are you", "bye"], ["hello", "fine", "see you"], keys=["a", "a", "a"])
    with caplog.at_level("WARNING", "pmi_reward.data.mining"):
        mine_lexical(one)
    assert "3 of 3 contexts have no reply of another dialogue" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", "pmi_reward.data.mining"):
        mine_lexical(PairSet.from_dialogues(DIALOGUES, max_context_turns=2))
    assert caplog.text == ""

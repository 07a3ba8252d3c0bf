"""Reward options against reward hacking: the length-neutral PMI reward, the diversity reward and the truncation
penalty each keep TRL's contract (one float or None per completion, a ``__name__``, numpy inputs, picklable)
and do what they are for."""

import json
import math
import pickle

import numpy as np
import pytest

from pmi_reward.rewards.combined import CombinedReward
from pmi_reward.rewards.diversity import DiversityReward, diversity_reward, opening, repeated_ngram_share
from pmi_reward.rewards.length import LengthBaseline, fit_length_baseline, reply_words
from pmi_reward.rewards.options import RewardOptions
from pmi_reward.rewards.reward import PMIReward
from pmi_reward.rewards.truncation import TruncationPenalty, is_truncated

PROMPT = [{"role": "user", "content": "I went hiking in Yosemite."}]
OTHER = [{"role": "user", "content": "Who is your favourite singer?"}]


class LengthScorer:
    """A stand-in scorer whose PMI is pure length (0.1 nat per word) plus 1 for mentioning Half Dome."""

    context_turns = 3

    def score(self, contexts, replies):
        return np.array([0.1 * reply_words(r) + ("Half Dome" in r) for r in replies], dtype=np.float32)


def _contract(reward, prompts, completions, **kwargs):
    out = reward(prompts=prompts, completions=completions, **kwargs)
    assert isinstance(out, list) and len(out) == len(completions)
    assert all(x is None or (isinstance(x, float) and math.isfinite(x)) for x in out)
    assert isinstance(reward.__name__, str) and reward.__name__
    return out


@pytest.fixture
def baseline_file(tmp_path):
    human = [" ".join(["word"] * n) for n in range(1, 61)]
    fitted = fit_length_baseline(LengthScorer().score(["c"] * len(human), human), human, bins=12)
    return str(fitted.save(tmp_path / "length_baseline.json"))


def test_length_baseline_fits_bins_and_round_trips(baseline_file):
    loaded = LengthBaseline.load(baseline_file)
    assert len(loaded.lengths) == 12 and sum(loaded.counts) == 60 and loaded.source["replies"] == 60
    assert loaded.expected([loaded.lengths[2]])[0] == pytest.approx(loaded.pmi[2])
    assert loaded.expected([0, 1000]).tolist() == [loaded.pmi[0], loaded.pmi[-1]]  # flat beyond the ends
    with pytest.raises(FileNotFoundError, match="no such file"):
        LengthBaseline.load(baseline_file + ".missing")
    with pytest.raises(ValueError, match="increasing"):
        LengthBaseline((2.0, 1.0), (0.0, 0.0), (1, 1))


def test_a_length_baseline_is_saved_whole_or_not_at_all(baseline_file, monkeypatch):
    """Under DDP with --length_neutral every rank saves output_dir/length_baseline.json and loads it back; the file
    was truncated, then written, so a rank could read another's half-written file (and a write cut short, by a full
    disk, left one behind). A save now moves a complete file into place."""
    import errno
    from pathlib import Path

    before = LengthBaseline.load(baseline_file)
    reader = open(baseline_file)  # noqa: SIM115 - a rank that opened the file before another rank's save
    other = LengthBaseline((1.0, 2.0), (0.5, 0.6), (3, 4))
    other.save(baseline_file)
    assert LengthBaseline.load(baseline_file) == other
    assert json.loads(reader.read())["pmi"] == list(before.pmi)  # the old file, whole
    reader.close()

    def cut_short(self, text, *args, **kwargs):
        with open(self, "w") as f:
            f.write(text[: len(text) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Path, "write_text", cut_short)
    with pytest.raises(OSError, match="No space left"):
        before.save(baseline_file)
    monkeypatch.undo()
    assert LengthBaseline.load(baseline_file) == other
    assert sorted(p.name for p in Path(baseline_file).parent.iterdir()) == ["length_baseline.json"]


def test_a_longer_reply_with_the_same_content_is_not_rewarded_more(baseline_file):
    content = "Did you see Half Dome?"
    padded = content + " It is a really really really really really really really big rock you know."
    plain = PMIReward(LengthScorer(), empty_score=-5.0)
    neutral = PMIReward(LengthScorer(), RewardOptions(empty_score=-5.0, length_baseline=baseline_file))
    raw = plain([PROMPT, PROMPT], [content, padded])
    assert raw[1] > raw[0] + 1.0  # raw PMI pays for length
    fair = neutral([PROMPT, PROMPT], [content, padded])
    assert fair[1] <= fair[0] + 1e-5  # the length-neutral form does not
    assert fair[0] == pytest.approx(1.0, abs=0.2)  # what is left is the content (Half Dome)


def test_length_neutral_reward_keeps_the_contract(baseline_file, tiny_scorer):
    reward = PMIReward(LengthScorer(), RewardOptions(empty_score=None, length_baseline=baseline_file, center="group"))
    out = _contract(reward, [PROMPT, PROMPT, PROMPT], np.array(["Half Dome!", "", "nice rock"]))
    assert out[1] is None and out[0] + out[2] == pytest.approx(0.0, abs=1e-6)  # centred after the baseline
    real = PMIReward(tiny_scorer, length_baseline=baseline_file)
    assert _contract(real, [PROMPT], ["Half Dome!"])[0] is not None
    # pickling keeps the options and the baseline as loaded (a full round trip rebuilds the scorer from its model
    # files: tests/test_reward.py does it)
    state = pickle.loads(pickle.dumps(real.__getstate__()))
    assert state["length_baseline"] == LengthBaseline.load(baseline_file) == real.length_baseline
    assert RewardOptions(**state["options"]) == real.options


def test_diversity_reward_penalises_repetition_and_alike_openings():
    assert repeated_ngram_share("a b c a b c a b c") == pytest.approx(4 / 7)
    assert repeated_ngram_share("I love the mountains in spring") == 0.0 and repeated_ngram_share("hi") == 0.0
    assert opening("That's so cool, really!") == "thats so cool"
    prompts = [PROMPT] * 3 + [OTHER]
    completions = [
        [{"role": "assistant", "content": "That is so cool! Where did you stay?"}],
        [{"role": "assistant", "content": "That is so cool, I love hiking."}],
        [{"role": "assistant", "content": "Did you see Half Dome?"}],
        [{"role": "assistant", "content": "That is so cool and so cool and so cool."}],
    ]
    out = _contract(diversity_reward, prompts, completions)
    assert out[0] == pytest.approx(-0.5) and out[1] == pytest.approx(-0.5)  # 1 of the 2 others opens alike
    assert out[2] == 0.0  # a fresh opening, no repetition
    assert out[3] < -0.2  # alone in its group, but it repeats itself


def test_diversity_reward_contract_on_odd_inputs():
    reward = DiversityReward(name="div")
    replies = np.array(["same start here", "same start here too", ""])
    out = _contract(reward, np.array(["ctx a", "ctx a", "ctx b"]), replies)
    assert out == [-1.0, -1.0, 0.0]
    assert _contract(reward, ["a", "a"], [None, [{"role": "assistant", "content": 3}]]) == [None, None]
    assert reward(prompts=None, completions=["x y z", "x y z"]) == [0.0, 0.0]  # no prompts: no groups
    assert pickle.loads(pickle.dumps(diversity_reward))(prompts=["a"], completions=["b"]) == [0.0]
    with pytest.raises(ValueError, match="2 prompts but 1 completions"):
        reward(prompts=["a", "b"], completions=["x"])


def test_diversity_reward_reads_the_answer_and_refuses_split_groups(monkeypatch):
    """A reasoning policy's samples all open "<think>Okay, the user": the reward read that preamble, not the
    answers PMI scores; and under several processes a group can be split, so the opening share is refused there."""
    import pmi_reward.rewards.diversity as diversity

    thoughts = [
        "<think>Okay, the user asks what I did.</think>Great, I went hiking!",
        "<think>Okay, the user asks.</think>Quiet, mostly reading.",
    ]
    assert diversity_reward(prompts=["ctx"] * 2, completions=thoughts) == [0.0, 0.0]
    assert DiversityReward(strip_think=False)(prompts=["ctx"] * 2, completions=thoughts) == [-1.0, -1.0]
    monkeypatch.setattr(diversity, "world_size", lambda: 2)
    with pytest.raises(ValueError, match="2 processes each score a slice"):
        diversity_reward(prompts=["ctx"] * 2, completions=["a b", "a b"])
    assert DiversityReward(opening_weight=0)(prompts=["ctx"], completions=["a b c a b c a b"]) == [pytest.approx(-0.5)]


def test_truncation_penalty_flags_completions_without_an_end_token():
    penalty = TruncationPenalty({2, 0}, penalty=-2.0)
    assert is_truncated([5, 6, 7], {2}) and not is_truncated([5, 2], {2}) and not is_truncated([], {2})
    ids = [[5, 6, 2], np.array([5, 6, 7]), [5, 0]]
    out = _contract(penalty, ["p"] * 3, ["a", "b", "c"], completion_ids=ids)
    assert out == [0.0, -2.0, 0.0]
    assert penalty(prompts=["p"], completions=["a"]) == [None]  # no ids: unscorable
    assert pickle.loads(pickle.dumps(penalty)).stop_ids == {0, 2}
    with pytest.raises(ValueError, match="end-of-sequence"):
        TruncationPenalty([])


def test_combined_reward_sums_like_trl():
    def a(prompts, completions, **kw):
        return [1.0, None, None]

    def b(prompts, completions, **kw):
        return [0.5, 2.0, None]

    combined = CombinedReward([a, b], [1.0, -2.0])
    # PMI (the first) unscorable: the sample is, whatever a penalty says (its 0 beat a group of negative PMI in RFT)
    assert combined(["p"] * 3, ["x"] * 3) == [0.0, None, None] and combined.__name__ == "a+b"
    assert CombinedReward([b, a])(["p"] * 3, ["x"] * 3) == [1.5, 2.0, None]  # an extra's None counts as 0
    with pytest.raises(ValueError, match="2 reward_weights for 1"):
        CombinedReward([a], [1.0, 2.0])

    async def c(prompts, completions, **kw):  # TRL allows async reward functions; PPO indexed the coroutine
        return [1.0, 1.0, 1.0]

    assert CombinedReward([a, c])(["p"] * 3, ["x"] * 3) == [2.0, None, None]

    def long(prompts, completions, **kw):  # a part of the wrong length was cut silently (longer) or an IndexError
        return [1.0] * 4

    for wrong in (long, lambda prompts, completions, **kw: [1.0]):
        with pytest.raises(ValueError, match="returned (4|1) values for 3 completions"):
            CombinedReward([a, wrong])(["p"] * 3, ["x"] * 3)


def test_combined_reward_counts_a_non_finite_part_as_none():
    """TRL treats NaN like None (it nansums); summed here, an extra's NaN made the whole reward NaN, and PPO fed it
    into its rewards. A non-finite value counts as None, from an extra (0) and from the first part (unscorable)."""

    def pmi(prompts, completions, **kw):
        return [1.0, 1.0, float("nan"), float("inf"), 1.0]

    def extra(prompts, completions, **kw):
        return [float("nan"), float("-inf"), 2.0, 2.0, np.float32(2.0)]

    out = CombinedReward([pmi, extra])(["p"] * 5, ["x"] * 5)
    assert out == [1.0, 1.0, None, None, 3.0]


def test_reward_functions_with_one_name_are_refused():
    """TRL keys its metrics and completions table by a reward function's name: two PMIRewards with the default name
    merged their metrics and crashed the table (log_completions). Refused, saying how to rename one."""

    def a(prompts, completions, **kw):
        return [1.0] * len(completions)

    first, second = PMIReward(LengthScorer()), PMIReward(LengthScorer(), scale=2.0)
    with pytest.raises(ValueError, match=r"distinct names.*\['pmi_reward'\].*name="):
        CombinedReward([first, second])
    with pytest.raises(ValueError, match="distinct names"):
        CombinedReward([a, a])
    renamed = CombinedReward([first, PMIReward(LengthScorer(), scale=2.0, name="pmi_x2")])
    assert renamed.__name__ == "pmi_reward+pmi_x2"

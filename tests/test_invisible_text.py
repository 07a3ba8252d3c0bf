"""Text the scorer cannot measure as it is written: invisible text (zero-width, control or replacement characters,
which tokenize exactly like an empty string) counts as blank everywhere, by one check; and the length-neutral
baseline counts the words of scripts written without spaces (Chinese, Japanese, Korean, Thai), which it used to count
as one word a reply, fitting a constant baseline that left the reward as length-biased as raw PMI."""

import json
import logging
import random

import numpy as np
import pytest

import pmi_reward.policy.evaluate as evaluate
import pmi_reward.rewards.path as path
import pmi_reward.scoring.scorer as scoring
import pmi_reward.serving.endpoints as endpoints
from pmi_reward.rewards import length
from pmi_reward.rewards.length import LengthBaseline, fit_length_baseline, reply_words
from pmi_reward.rewards.options import RewardOptions
from pmi_reward.rewards.reward import PMIReward

INVISIBLE = ["\u200b", "\x00\x00", "\ufffd\ufffd", "\ufeff\u2060", " \u200d\t\u200b", "\u3164", "\u1734 \ufffd"]


# -- invisible text counts as blank ----------------------------------------------------------------------------------
def test_one_visible_check_serves_the_scorer_and_every_reward_path():
    """The scorer's check is the one the reward path, the server and the evaluation import: one rule of what is
    blank, not one per module that can drift apart."""
    visible = scoring.visible
    assert path.visible is visible and endpoints.visible is visible and evaluate.visible is visible
    assert not any(visible(t) for t in [*INVISIBLE, "", "  \n"])
    assert all(visible(t) for t in ["a", "\u200bok", "好", "\ufffdx", "😀"])


@pytest.mark.parametrize("invisible", INVISIBLE)
def test_the_scorer_refuses_an_invisible_reply_as_it_does_a_blank_one(tiny_scorer, invisible):
    """``PMIScorer.score`` refused a blank reply (its head would rate it like any text) but scored a reply of
    zero-width, NUL or U+FFFD characters, whose token ids are those of ``""``: it is refused the same way."""
    with pytest.raises(ValueError, match=r"responses\[1\] is blank .*PMI is not defined for an empty reply"):
        tiny_scorer.score(["I went hiking.", "I went hiking."], ["Where?", invisible])
    with pytest.raises(ValueError, match=r"responses\[0\] is blank: PMI"):  # a blank one, as before
        tiny_scorer.score(["I went hiking."], [" \n"])
    scores = tiny_scorer.score(["I went hiking."] * 2, ["Where?" + invisible, invisible + "Where?"])
    assert np.isfinite(scores).all()  # text beside invisible characters is text


@pytest.mark.parametrize(
    "prompt",
    [
        [{"role": "user", "content": "\u200b\u2060"}],
        [{"role": "user", "content": "\x00"}, {"role": "assistant", "content": "\ufffd\ufffd"}],
        "\u200b\n\ufeff",
        "\u3164",
    ],
)
def test_an_invisible_context_is_no_context(tiny_scorer, prompt):
    """A prompt of only invisible characters was scored as a context (+0.45 on a tiny scorer, where a blank one got
    ``empty_score``) and not counted in ``no_context_frac``: it is read as no context, as a blank one is."""
    metrics: dict[str, float] = {}
    reward = PMIReward(tiny_scorer, empty_score=-5.0)
    prompts = [prompt, [{"role": "user", "content": "   "}], "I went hiking in Yosemite."]
    out = reward(prompts, ["Nice!"] * 3, log_metric=metrics.__setitem__)
    assert out[:2] == [-5.0, -5.0] and out[2] != -5.0
    assert metrics["pmi_reward/no_context_frac"] == pytest.approx(2 / 3)
    assert PMIReward(tiny_scorer, empty_score=None)([prompt], ["Nice!"]) == [None]


def test_a_context_with_a_visible_turn_is_still_scored(tiny_scorer):
    """Only a context that shows nothing at all is dropped: one visible turn beside invisible ones is a context."""
    reward = PMIReward(tiny_scorer, empty_score=-5.0)
    out = reward(["\u200b\nI went hiking.", "I went hiking.\u200b"], ["Nice!", "Nice!"])
    assert all(r != -5.0 for r in out)


# -- the length-neutral baseline counts words in scripts without spaces ---------------------------------------------
@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("我今天去公园散步了，天气很好。", 13),  # Chinese: each ideograph, no punctuation
        ("私は学生です。", 6),  # Japanese: kanji and kana
        ("안녕하세요 세계", 7),  # Korean: each Hangul syllable
        ("ภาษาไทย", 7),  # Thai: each letter
        ("用Python写代码。", 5),  # a Latin word between ideographs is one word
        ("2024年", 2),
        ("好", 1),
        ("・", 1),  # a token of punctuation alone still counts, as it always did
    ],
)
def test_replies_in_scripts_without_spaces_are_counted_by_letter(text, words):
    assert reply_words(text) == words


def test_text_without_those_scripts_counts_exactly_as_before():
    """English (and any text without CJK, kana, Hangul or Thai) keeps its whitespace word count, so English baselines
    and their tests are unchanged."""
    rng = random.Random(0)
    alphabet = list("abc XYZ,.!?'-\t\n") + ["\u00e9", "\u0416", "\u0627", "\u05d0", "😀", "\u200b", "\xa0", "\u3000"]
    alphabet += ["\x1c", "\u2028", "\u0301", "\u0915"]
    for _ in range(2000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(40)))
        assert reply_words(text) == len(text.split()), repr(text)
    assert reply_words("Did you see Half Dome? It is big.") == 8


class CharScorer:
    """A stand-in scorer whose PMI is pure length: 0.05 nat per character of the reply."""

    context_turns = 3

    def score(self, contexts, replies):
        return np.array([0.05 * len(r) for r in replies], dtype=np.float32)


def test_a_baseline_fitted_on_chinese_replies_takes_out_their_length(tmp_path):
    """Chinese replies were all one word: the fitted baseline had one bin and subtracted a constant, so the
    length-neutral reward still paid 0.05 nat a character. Counted by ideograph, it pays (nearly) nothing for
    length."""
    rng = np.random.default_rng(0)
    human = ["好" * int(n) + "。" for n in rng.integers(2, 60, 400)]
    fitted = fit_length_baseline(CharScorer().score(["c"] * len(human), human), human)
    assert len(fitted.lengths) >= 3 and fitted.unit == length.SCRIPT_WORDS
    baseline = str(fitted.save(tmp_path / "zh.json"))
    short, long = "好" * 5 + "。", "好" * 50 + "。"
    neutral = PMIReward(CharScorer(), RewardOptions(empty_score=-5.0, length_baseline=baseline))
    raw = PMIReward(CharScorer(), empty_score=-5.0)(["你好"] * 2, [short, long])
    fair = neutral(["你好"] * 2, [short, long])
    assert raw[1] - raw[0] == pytest.approx(2.25, abs=1e-4)
    assert abs(fair[1] - fair[0]) < 0.3


def test_a_baseline_of_fewer_than_three_bins_warns(caplog):
    """Replies all of one length make a baseline of one bin, a constant: said, not left silent."""
    same = ["a b c"] * 20
    with caplog.at_level(logging.WARNING, logger="pmi_reward.rewards.length"):
        fit_length_baseline(np.linspace(0, 1, 20), same)
    assert any("1 length bin(s) from 20 replies of 3 to 3 words" in r.getMessage() for r in caplog.records)
    caplog.clear()
    varied = [" ".join(["w"] * n) for n in range(1, 41)]
    with caplog.at_level(logging.WARNING, logger="pmi_reward.rewards.length"):
        fitted = fit_length_baseline(np.linspace(0, 1, 40), varied)
        fit_length_baseline(np.linspace(0, 1, 20), same, bins=1)  # one bin asked: one bin given, no warning
    assert len(fitted.lengths) == 10 and not caplog.records


def test_a_baseline_saved_before_the_unit_loads_and_counts_as_it_was_fitted(tmp_path):
    """A file saved by the earlier code (``"unit": "words"``: whitespace words) loads, and the reward measures
    replies against it by whitespace words, the count its bins were fitted in; a new file records its unit."""
    old = tmp_path / "old.json"
    old.write_text(
        json.dumps({"unit": "words", "lengths": [1.0, 9.0], "pmi": [0.0, 8.0], "counts": [5, 5], "source": {"x": 1}})
    )
    loaded = LengthBaseline.load(old)
    assert loaded.unit == length.WHITESPACE_WORDS and loaded.source == {"x": 1}
    assert loaded.words(["我今天去公园散步了", "one two three"]) == [1, 3]
    new = LengthBaseline((1.0, 9.0), (0.0, 8.0), (5, 5)).save(tmp_path / "new.json")
    assert json.loads(new.read_text())["unit"] == length.SCRIPT_WORDS
    assert LengthBaseline.load(new).words(["我今天去公园散步了"]) == [9]
    (tmp_path / "bad.json").write_text(json.dumps({"unit": "tokens", "lengths": [1.0], "pmi": [0.0], "counts": [1]}))
    with pytest.raises(ValueError, match=r"bad\.json: not a length baseline .*unit 'tokens' is unknown"):
        LengthBaseline.load(tmp_path / "bad.json")


def test_emoji_newer_than_pythons_unicode_database_are_visible():
    """Python 3.11's Unicode database (14.0) has the emoji of Unicode 15 and later (🫨, 🫎, 🪼) unassigned, which
    counted as invisible: a reply of them got empty_score from the reward and a "blank" refusal from
    ``PMIScorer.score`` on 3.11, and a score on 3.12. What is unassigned is read from a newer database; code points
    unassigned in it stay invisible."""
    from pmi_reward.scoring.scorer import visible

    assert visible("🫨") and visible("🫎🪼") and visible("ok 🫨")
    assert not visible("\u0378") and not visible("\U000effff")  # unassigned in every Unicode version so far

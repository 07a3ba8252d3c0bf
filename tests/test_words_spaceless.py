"""The shared word splitter (``data.words``) of evaluate-policy's reward-hacking diagnostics and RFT's log: a Chinese,
Japanese or Thai reply counts a word per letter (as the reward's length baseline, ``reply_words``), combining marks
stay in their word, and "？"/"؟" ask a question (review 32, F1). English text splits exactly as before: every code
point and a sample of Chit-Chat replies against the former rule, frozen here."""

from __future__ import annotations

import math
import random
import re
import sys
import unicodedata

import numpy as np
import pytest

from pmi_reward.evaluation.metrics import copies_context, distinct_n, is_generic, words
from pmi_reward.policy import diagnostics, evaluate
from pmi_reward.policy.diagnostics import length_adjusted_gain, opening_share, question_rate, reply_lengths
from pmi_reward.policy.evaluate import text_metrics
from pmi_reward.rewards.length import reply_words

_FORMER_PUNCT = re.compile(r"[^\w\s]+")


def former_words(text: str) -> list[str]:
    """``metrics.words`` before the shared splitter (HEAD 4b679e4): punctuation removed, whitespace words."""
    return _FORMER_PUNCT.sub("", text.lower().replace("'", "").replace("\u2019", "")).split()


def former_question_rate(replies) -> float:
    """``diagnostics.question_rate`` before: an ASCII "?" only."""
    return float(np.mean(["?" in r for r in replies])) if len(replies) else 0.0


def _code_points(keep) -> list[str]:
    return [chr(c) for c in range(sys.maxunicode + 1) if not 0xD800 <= c <= 0xDFFF and keep(chr(c))]


# -- English text: nothing moves ------------------------------------------------------------------------------------


def test_every_code_point_outside_the_spaceless_scripts_and_combining_marks_splits_as_before():
    """Each assigned code point that is neither a character of a spaceless script nor a combining mark (Mn, Mc),
    inside a word and alone: the same words as the former rule (removed, kept, or parting the word alike).
    Unassigned and private-use ones (Cn, Co) are removed by both, as any other character of no word class."""
    from pmi_reward.data.words import has_spaceless

    chars = _code_points(lambda c: unicodedata.category(c) not in ("Mn", "Mc", "Cn", "Co") and not has_spaceless(c))
    text = " ".join(f"A{c}b {c}" for c in chars)
    assert words(text) == former_words(text)


def test_a_combining_mark_after_no_letter_and_a_variation_selector_are_removed_as_before():
    """An emoji's variation selector, a keycap, a mark after a space, a symbol or at the start: removed as before,
    so an English reply with emoji keeps its words ("love❤️" is ``love``)."""
    from pmi_reward.data.words import has_spaceless

    marks = _code_points(lambda c: unicodedata.category(c)[0] == "M" and not has_spaceless(c))
    for form in ("x❤{m}y", " {m}a", "{m}", "a!{m}b", "😀{m}{m} ok", "1\ufe0f{m}"):
        text = " ".join(form.format(m=m) for m in marks)
        assert words(text) == former_words(text), form
    selectors = "".join(map(chr, [*range(0xFE00, 0xFE10), 0xE0100, 0xE01EF, 0x20E3, 0x20DD, 0x034F]))
    text = " ".join(f"love{s} b{s}c" for s in selectors)
    assert words(text) == former_words(text)
    assert words("I ❤️ it, love❤️! 1️⃣ 2⃣ 👍🏽 don't") == ["i", "it", "love", "1", "2", "dont"]


def former_diversity_words(text: str) -> list[str]:
    """``rewards.diversity._words`` before (HEAD 4b679e4): ``\\w+`` runs, so a punctuation mark parts a word."""
    return re.findall(r"\w+", text.lower().replace("'", "").replace("\u2019", ""))


def test_punctuation_parts_finds_the_words_a_word_character_search_found(chitchat_sample):
    """``split_words(text, punctuation_parts=True)`` (for ``rewards.diversity``, review 32 F4) equals the ``\\w+``
    search on every assigned code point outside the spaceless scripts and combining marks, and on Chit-Chat text.
    Left out: "İ", which the search parted ("i", then a lone combining dot) and the splitter reads as "i"."""
    from pmi_reward.data.words import has_spaceless, split_words

    chars = _code_points(
        lambda c: unicodedata.category(c) not in ("Mn", "Mc", "Cn", "Co") and not has_spaceless(c) and c != "\u0130"
    )
    text = " ".join(f"A{c}b {c}" for c in chars)
    assert split_words(text, punctuation_parts=True) == former_diversity_words(text)
    flat = [t for row in chitchat_sample[1] for t in row] + chitchat_sample[0]
    assert [split_words(t, punctuation_parts=True) for t in flat] == [former_diversity_words(t) for t in flat]
    assert split_words("e-mail me, ok?", punctuation_parts=True) == ["e", "mail", "me", "ok"]
    assert split_words("e-mail me, ok?") == ["email", "me", "ok"]
    assert split_words("我去公园跑步了", punctuation_parts=True) == list("我去公园跑步了")


@pytest.fixture(scope="module")
def chitchat_sample() -> tuple[list[str], list[list[str]]]:
    """300 contexts of Chit-Chat (as ``load_dialogues("chitchat")`` reads them: its last 3 turns) with 3 replies
    each: the true reply, a copy of the context's last turn (copy flags fire) and a stock reply of another row."""
    from pmi_reward.data.dialogues import chitchat_dialogues

    dialogues = [d for d in chitchat_dialogues() if len(d.turns) >= 4][:300]
    stock = ["ok!", "Thanks :)", "lol", "That's cool.", "I don't know...", "Wow, really?"]
    contexts = ["\n".join(d.turns[:3]) for d in dialogues]
    replies = [[d.turns[3], d.turns[2], stock[i % len(stock)]] for i, d in enumerate(dialogues)]
    return contexts, replies


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(
        a[k] == b[k] or (isinstance(a[k], float) and math.isnan(a[k]) and math.isnan(b[k])) for k in a
    )


def test_english_replies_give_every_figure_they_gave_before(chitchat_sample, monkeypatch):
    """On Chit-Chat replies: words, distinct-1/2, copy, question and generic flags, lengths, openings and the whole
    ``text_metrics`` row equal those of the former splitter and question test, exactly."""
    contexts, replies = chitchat_sample
    flat = [r for row in replies for r in row]
    assert [words(r) for r in flat] == [former_words(r) for r in flat]
    assert [question_rate([r]) for r in flat] == [former_question_rate([r]) for r in flat]
    copies = [copies_context(r, c) for c, row in zip(contexts, replies, strict=True) for r in row]
    assert sum(copies) > 250 and 0 < question_rate(flat) < 1 and 0 < np.mean([is_generic(r) for r in flat]) < 1
    new = text_metrics(replies, contexts)
    new_lengths, new_openings = reply_lengths(replies), opening_share(flat)
    for module in (evaluate.__name__, diagnostics.__name__, "pmi_reward.evaluation.metrics"):
        monkeypatch.setattr(f"{module}.words", former_words)
    monkeypatch.setattr(diagnostics, "question_rate", former_question_rate)
    assert copies == [copies_context(r, c) for c, row in zip(contexts, replies, strict=True) for r in row]
    assert [distinct_n(row, n) for row in replies for n in (1, 2)] == [
        len({tuple(w[i : i + n]) for w in map(former_words, row) for i in range(len(w) - n + 1)})
        / max(1, sum(max(0, len(w) - n + 1) for w in map(former_words, row)))
        for row in replies
        for n in (1, 2)
    ]
    old = text_metrics(replies, contexts)
    assert _same(new, old), (new, old)
    assert np.array_equal(new_lengths, reply_lengths(replies)) and new_openings == opening_share(flat)


# -- scripts written without spaces, combining marks, question marks -------------------------------------------------


def test_a_chinese_japanese_or_thai_reply_has_a_word_per_letter_as_the_length_baseline_counts():
    """Split on whitespace, each of these was one word whatever its length."""
    for text, n in [
        ("我昨天和我的狗去了公园。", 11),
        ("昨日、犬と公園に行きました。", 12),
        ("เมื่อวานฉันพาสุนัขไปสวนสาธารณะ", 25),
        ("用Python写代码！", 5),
    ]:
        assert len(words(text)) == reply_words(text) == n, (text, words(text))
    assert words("用Python写代码！") == ["用", "python", "写", "代", "码"]
    assert words("ที่นี่") == ["ที่", "นี่"]  # a Thai letter's vowel and tone marks stay with it


def test_the_splitter_counts_as_reply_words_where_every_token_holds_a_letter_or_digit():
    """``len(words(text)) == reply_words(text)`` on random mixed-script text whose whitespace-separated tokens each
    hold a letter or digit (and no underscore, and no Hangul: ``test_korean_words_are_whitespace_words``): the
    diagnostics and the reward's length baseline agree."""
    alphabet = list("abcXYZ019 éñ我的狗公园昨日かなカナｶﾞか\u3099ไทยกขี่้มुझेकामपसंद,.!?。，！？、・๏…-'😀❤\ufe0f\u0301  ")
    rng = random.Random(0)
    checked = 0
    for _ in range(3000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 30)))
        if all(any(ch.isalnum() for ch in token) for token in text.split()):
            checked += 1
            assert len(words(text)) == reply_words(text), (text, words(text))
    assert checked > 500


def test_chinese_policy_diagnostics_see_length_copies_and_questions():
    """The review's example: a zh policy that copies the context's last line and asks back had words 1.0, copy 0,
    questions 0 and distinct-2 0.00; its length-only judge gain passed as a length-adjusted gain."""
    context = "我上周去优胜美地徒步了。\n哦不错，你看到半穹顶了吗？"
    policy = [["哦不错，你看到半穹顶了吗？", "你喜欢穿过山谷和瀑布的那段很长的徒步路线吗？"]]
    m = text_metrics(policy, [context])
    assert m["words"] == 16.0 and m["copy"] == 0.5 and m["questions"] == 1.0
    assert m["distinct_2"] == 1.0 and m["distinct_2_within"] == 1.0
    assert reply_lengths(policy).tolist() == [[11.0, 21.0]]
    rng = np.random.default_rng(0)
    base = [["好的。", "嗯嗯"] for _ in range(30)]
    tuned = [
        ["".join(rng.choice(list("我们今天去公园散步天气很好")) for _ in range(n)) for n in (20, 30)] for _ in range(30)
    ]
    pmi_base = np.array([[0.1 * len(r) for r in row] for row in base]) + rng.normal(0, 0.1, (30, 2))
    pmi_tuned = np.array([[0.1 * len(r) for r in row] for row in tuned]) + rng.normal(0, 0.1, (30, 2))
    plain = float((pmi_tuned - pmi_base).mean())
    adjusted = length_adjusted_gain(pmi_tuned, pmi_base, reply_lengths(tuned), reply_lengths(base)).value
    assert plain > 2.0 and abs(adjusted) < 0.3, (plain, adjusted)  # the gain is length: none is left


def test_replies_opening_alike_in_chinese_are_a_template():
    replies = ["我去公园跑步了", "我去公园和小明玩了", "我去公园很早", "我待在家里"]
    assert opening_share(replies, top=1) == 0.75


def test_question_marks_of_other_scripts_ask():
    from pmi_reward.data.words import asks_question

    assert question_rate(["你去哪儿了？", "هل أنت بخير؟", "¿Qué tal", "ok"]) == 0.75
    assert asks_question("Really‽") and asks_question("Ποιος είναι\u037e") and not asks_question("好的。")


def test_devanagari_vowel_signs_keep_different_words_apart():
    """``\\w`` leaves out combining vowel signs: removed, "काम" (work) and "कम" (less) were one word."""
    assert words("मुझे काम पसंद है") == ["मुझे", "काम", "पसंद", "है"]
    assert words("मुझे काम पसंद है") != words("मुझे कम पसंद है")
    assert distinct_n(["मुझे काम पसंद है", "मुझे कम पसंद है"], 2) == 5 / 6
    assert not copies_context("मुझे कम पसंद है", "मुझे काम पसंद है")
    assert words("café") == words("cafe\u0301") != words("cafe")  # a written-apart accent is the accent


def test_rft_logs_the_mean_words_of_chinese_replies_as_the_length_baseline_counts():
    from pmi_reward.policy.rft import _mean_words

    assert _mean_words(["我昨天去了公园", "好的"]) == 4.5
    assert _mean_words(["I went to the park - it was fun :)"]) == 10.0  # English: whitespace words, as before


def test_the_diversity_reward_sees_repeats_and_same_openings_in_chinese():
    """``diversity_reward`` read a Chinese reply as one word (``\\w+``): a looping reply had no repeated n-gram and a
    GRPO group opening alike no shared opening, so both terms were 0 where English ones scored."""
    from pmi_reward.rewards.diversity import diversity_reward, repeated_ngram_share

    assert repeated_ngram_share("我去公园了我去公园了我去公园了我去公园了") > 0.5
    assert repeated_ngram_share("I went to the park I went to the park I went to the park") > 0.5
    group = ["我去公园跑步了。", "我去公园和小明玩了。", "我去公园很早。", "我待在家里。"]
    prompt = [{"role": "user", "content": "你周末做了什么？"}]
    rewards = diversity_reward(prompts=[prompt] * 4, completions=[[{"role": "assistant", "content": c}] for c in group])
    assert rewards[:3] == [pytest.approx(rewards[0])] * 3 and rewards[0] < 0 and rewards[3] == 0


# -- Korean: written with spaces (review 32 second look, finding 2) --------------------------------------------------

KOREAN = "저는 어제 친구와 함께 공원에 갔어요"  # "Yesterday I went to the park with a friend"


def test_korean_words_are_whitespace_words_while_the_length_baseline_still_counts_syllables():
    """Korean puts spaces between its words, but Hangul was read as a script without them: every syllable was a word
    of the diagnostics and the diversity reward. The length baseline keeps counting syllables (``reply_words``: fitted
    baselines must not move), so there the splitter and it differ, as documented."""
    from pmi_reward.data.words import has_spaceless, split_words
    from pmi_reward.rewards.diversity import _words

    expected = ["저는", "어제", "친구와", "함께", "공원에", "갔어요"]
    assert words(KOREAN) == _words(KOREAN) == split_words(KOREAN, punctuation_parts=True) == expected
    assert words("네, 좋아요! 한국어로 Python을 배워요.") == ["네", "좋아요", "한국어로", "python을", "배워요"]
    assert words(KOREAN) == former_words(KOREAN) and not has_spaceless(KOREAN)
    assert reply_words(KOREAN) == 15 and reply_words("안녕하세요 세계") == 7  # syllables, as fitted
    assert len(words("안녕하세요 세계")) == 2
    assert words("我爱 한국어") == ["我", "爱", "한국어"]  # beside Chinese letters, a Korean word stays whole


def test_korean_replies_that_share_only_their_first_word_are_no_template():
    """Read by syllable, the 3-word opening was about one Korean word: replies that both start with "저는 오늘" ("I
    ... today") were penalised as opening alike, and distinct-2 counted syllable pairs."""
    from pmi_reward.rewards.diversity import DiversityReward, opening

    group = ["저는 오늘 집에 있었어요.", "저는 오늘 영화를 봤어요.", "저는 어제 공원에 갔어요.", "네, 좋아요!"]
    assert [opening(r, 3) for r in group] == ["저는 오늘 집에", "저는 오늘 영화를", "저는 어제 공원에", "네 좋아요"]
    assert DiversityReward(repetition_weight=0.0)(["안녕"] * 4, group) == [0.0] * 4
    assert distinct_n(group, 2) == 0.9
    assert opening_share(group, top=1) == 0.25


# English replies with hyphens, apostrophes, digits, contractions and emoji: the diversity reward's words must be the
# ``\w+`` words it always read (``punctuation_parts=True``: "e-mail" is two words there)
ENGLISH_REPLIES = [
    "e-mail me, it's 5-6 pm",
    "I'm a well-known cat-lover :) and you?",
    "Don't worry - it's 3:30 now, see you at 4.",
    "The U.S.-based co-op sells 2-for-1 deals!!!",
    "state-of-the-art? nah... it's so-so 😀👍",
    "Rock'n'roll & R&B, 90's hits, 100% fun",
    "x-ray, t-shirt, e.g. Wi-Fi",
    "It is what it is. It is what it is. It is what it is.",
]


def test_the_diversity_reward_reads_english_words_as_it_always_did(monkeypatch):
    """The diversity reward's words, openings and repeated n-grams on English replies equal those of the former
    ``\\w+`` rule (punctuation parts a word): the shared splitter changed none of its English figures."""
    from pmi_reward.rewards import diversity

    assert [diversity._words(r) for r in ENGLISH_REPLIES] == [former_diversity_words(r) for r in ENGLISH_REPLIES]
    assert diversity._words("e-mail me, it's 5-6 pm") == ["e", "mail", "me", "its", "5", "6", "pm"]
    new = [(diversity.opening(r, 3), diversity.repeated_ngram_share(r)) for r in ENGLISH_REPLIES]
    prompts = [[{"role": "user", "content": "Hi"}]] * len(ENGLISH_REPLIES)
    rewards = diversity.DiversityReward()(prompts, ENGLISH_REPLIES)
    monkeypatch.setattr(diversity, "_words", former_diversity_words)
    assert new == [(diversity.opening(r, 3), diversity.repeated_ngram_share(r)) for r in ENGLISH_REPLIES]
    assert rewards == diversity.DiversityReward()(prompts, ENGLISH_REPLIES)

"""Mined and scrambled negatives, and MEEP's score parser, on text written without spaces between words (Chinese,
Japanese, Thai), while text without those scripts (English, and Korean, Cyrillic, Arabic, Devanagari, accented Latin,
emoji) gets bit for bit the negatives it always got."""

import hashlib
import logging
from types import ModuleType

import numpy as np
import pytest

from pmi_reward.data import mining
from pmi_reward.data.dialogues import Dialogue
from pmi_reward.data.mining import mine_lexical, mine_scrambled, scramble
from pmi_reward.data.negatives import NegativeSpec, sample_negatives
from pmi_reward.data.pairs import PairSet
from pmi_reward.evaluation.baselines.meep import parse_score

# Text in no script written without spaces: contractions, numbers, stop-word-only turns (ties at similarity 0),
# repeated openers shared by several dialogues, accented Latin, Cyrillic, Arabic, Devanagari, emoji, full-width
# punctuation. Its negatives must not move: recorded figures (``make scorer``, the demo) were made with them.
OTHER_SCRIPTS = [
    Dialogue("a", ("Hi!", "Hey, how's it going?", "Not bad, I've been baking bread all day.", "Sourdough? I love it.")),
    Dialogue("b", ("Hi!", "Hello there.", "Did you see the match last night? 3-1!", "Yes, what a goal in the 89th.")),
    Dialogue("c", ("I am", "ok", "It is what it is.", "I am what I am, and that's all that I am.")),
    Dialogue("d", ("Do you like jazz music?", "I love jazz, Coltrane is my favourite.", "Mine too!")),
    Dialogue("e", ("What music do you play?", "Mostly jazz music on the piano.", "Cool, classical too?")),
    Dialogue(
        "f", ("Let's grab a café au lait at the crème brûlée place.", "Déjà vu: we went there in 2019.", "Naïve!")
    ),
    Dialogue("g", ("Привет, как дела?", "Хорошо, спасибо! А у тебя?", "Тоже хорошо, иду в кино.")),
    Dialogue("h", ("مرحبا، كيف حالك؟", "أنا بخير، شكرا لك", "هل تحب القهوة؟", "نعم، أحب القهوة كثيرا")),
    Dialogue("i", ("मुझे काम पसंद है", "आपको कौन सा काम पसंद है?", "मुझे पढ़ाना पसंद है")),
    Dialogue("j", ("Party tonight 🎉🎉", "I'm in 😀 what time?", "8pm, bring snacks 🍕", "On my way 🚗💨")),
    Dialogue("k", ("Really！？ That's wild…", "Ｙｅｓ，ｒｅａｌｌｙ．", "No way — I don't believe it.")),
    Dialogue("l", ("Did the dog catch the squirrel?", "No, it got away.", "Dogs never catch squirrels.", "lol")),
]

# sha256 of what HEAD 4b679e4's mining made (``_digest``) of them, of conftest's topic dialogues and of the first 60
# Chit-Chat dialogues, before text without spaces was read differently
PINNED = {
    "topic": (
        "f37edd60f7f9675f11b8db35011247099c328be4bcd523fe83f84e523be1dc03",
        "c7c5c1d53feb14424a4ac52b8888aa574d46e5edaf3565fc29934c8c6f445a8b",
    ),
    "other_scripts": (
        "97fe32e942054bbe02a57fa24e5f86c27c0a5dfc89e9a8c465551e78471d1b97",
        "54f9d5dce4bc953e86557f6e839f331b0791ae20f15cf5249d1baf361788121e",
    ),
    "chitchat": (
        "106fd8a222550f90b596a10afcc79600df2e6c9edf787cbf8ddaa1d4c3d4a82d",
        "9be302d3b7e31d441de89106915a91c74ab68878f6de0dec77cea26ad8c1480c",
    ),
}


def _digest(module: ModuleType, pairs: PairSet) -> tuple[str, str]:
    """sha256 of ``module``'s mined tables for ``pairs`` (lexical, m=8; scrambled, with the scrambles it appends to the
    response table), and of the negatives ``sample_negatives`` draws from them (a seeded draw of every kind)."""
    module.mine_lexical(pairs, m=8, progress=False)
    module.mine_scrambled(pairs)
    tables = hashlib.sha256()
    for kind in ("lexical", "scrambled"):
        for array in pairs.mined[kind]:
            tables.update(np.asarray(array, dtype="<i8").tobytes())
    tables.update("\x00".join(pairs.responses).encode())
    spec = NegativeSpec(k_random=1, k_context=0, k_lexical=2, k_scrambled=1)
    draws = sample_negatives(pairs, spec, np.random.default_rng(0))
    return tables.hexdigest(), hashlib.sha256(np.asarray(draws, dtype="<i8").tobytes()).hexdigest()


@pytest.mark.parametrize("corpus", ["topic", "other_scripts", "chitchat"])
def test_text_without_spaceless_scripts_mines_the_negatives_it_always_did(corpus, topic_dialogues):
    from pmi_reward.data.dialogues import chitchat_dialogues

    dialogues = {"topic": topic_dialogues, "other_scripts": OTHER_SCRIPTS}.get(corpus) or chitchat_dialogues()[:60]
    tables, draws = _digest(mining, PairSet.from_dialogues(dialogues, max_context_turns=2))
    assert tables == PINNED[corpus][0], f"{corpus}: the lexical or scrambled tables differ from HEAD 4b679e4's"
    assert draws == PINNED[corpus][1], f"{corpus}: the tables match, but the draws from them moved (negatives.py?)"


# Chinese and Japanese chat; three of its replies have fewer than three letters ("拿铁", "是啊", "好的").
ZH = [
    Dialogue("jazz1", ("你喜欢爵士音乐吗？", "我很喜欢爵士，科川是我的最爱。", "我也是！")),
    Dialogue("jazz2", ("你平时弹什么音乐？", "主要是在钢琴上弹爵士音乐。", "酷，古典也弹吗？")),
    Dialogue("dog1", ("我的狗今天追了一只松鼠。", "狗抓到松鼠了吗？", "没有，它跑了。")),
    Dialogue("dog2", ("松鼠又被我家的狗吓跑了", "你家狗真调皮", "是啊")),
    Dialogue("coffee1", ("早上一定要喝咖啡", "你喜欢拿铁还是美式咖啡？", "拿铁")),
    Dialogue("coffee2", ("这家店的拿铁咖啡很好喝", "我明天也去喝一杯", "好的")),
    Dialogue("ja1", ("昨日、犬と公園に行きました。", "公園で犬と遊んだの？", "はい、楽しかったです。")),
    Dialogue("ja2", ("犬の散歩で公園へ行く", "いいですね、どこの公園？", "近所の公園です")),
]


# Four topics, two dialogues each (an opener and its reply); no reply shares a letter with another topic's opener: each
# opener's look-alike is the reply of its topic's other dialogue, which shares a word with it ("公园跑步", "打太极").
LOOK_ALIKES = {
    "周末去公园跑步": "公园跑步更累",
    "早上打太极拳": "晨练打太极",
    "猫咪整天睡觉": "猫咪睡懒觉",
    "家里养了狗狗": "狗狗爱玩球",
    "喝绿茶吗": "绿茶清香",
    "来杯咖啡": "咖啡提神",
    "映画館へ行きました": "映画館で映画",
    "週末は電車の旅": "電車で旅行",
}
OPENERS = [
    ("周末去公园跑步", "晨练打太极"),
    ("早上打太极拳", "公园跑步更累"),
    ("猫咪整天睡觉", "狗狗爱玩球"),
    ("家里养了狗狗", "猫咪睡懒觉"),
    ("喝绿茶吗", "咖啡提神"),
    ("来杯咖啡", "绿茶清香"),
    ("映画館へ行きました", "電車で旅行"),
    ("週末は電車の旅", "映画館で映画"),
]


def test_look_alikes_in_chinese_and_japanese_share_a_word_with_the_context():
    """A whole Chinese clause was one TF-IDF term, so no reply shared a term with any context: every look-alike was
    at similarity 0, and every context mined the same replies, whatever it said."""
    pairs = PairSet.from_dialogues([Dialogue(f"d{i}", turns) for i, turns in enumerate(OPENERS)], max_context_turns=1)
    mine_lexical(pairs, m=2, progress=False)
    ptr, pool = pairs.mined["lexical"]
    mined = {context: pairs.responses[pool[ptr[c]]] for c, context in enumerate(pairs.contexts)}
    assert mined == LOOK_ALIKES


def test_lexical_terms_of_spaceless_text_are_letters_and_letter_bigrams():
    from sklearn.feature_extraction.text import TfidfVectorizer

    words = TfidfVectorizer(stop_words="english").build_analyzer()
    assert mining._lexical_terms(words, "I love the Jazz!") == ["love", "jazz"]  # no such letters: the words alone
    assert mining._lexical_terms(words, "我爱the Jazz音乐！") == ["jazz", "我", "爱", "我爱", "音", "乐", "音乐"]


@pytest.mark.parametrize(
    "text, clusters",
    [
        ("我昨天和我的狗去了公园。", ["园。"]),  # the full stop stays on the letter before it
        ("昨日、犬と公園に行きました。", ["日、", "た。"]),
        ("เมื่อวานฉันพาสุนัขไปสวนสาธารณะ", ["มื่", "ฉั", "สุ", "นั"]),  # Thai vowel and tone marks stay on their consonant
        ("我用Python写代码", ["Python"]),
    ],
)
def test_spaceless_replies_are_scrambled_by_letter(text, clusters):
    out = scramble(text)
    assert out is not None and out != text
    assert sorted(out) == sorted(text) and all(cluster in out for cluster in clusters)
    assert scramble(text) == out and scramble(text, seed=1) != out  # seeded by the text, as English is


def test_a_korean_scramble_shuffles_whole_words():
    """Korean puts spaces between its words: read by syllable (Hangul taken for a script without spaces), a scramble
    moved syllables across words ("공요 함저 원친구 ..."), no Korean words at all. It is a salad of its words again, as
    before, and Korean's TF-IDF terms are its words."""
    from sklearn.feature_extraction.text import TfidfVectorizer

    for text in ["안녕하세요 반갑습니다 오늘 날씨 좋네요", "저는 어제 친구와 함께 공원에 갔어요"]:
        outs = {scramble(text, seed) for seed in range(20)}
        assert None not in outs and text not in outs and len(outs) > 5
        assert all(sorted(out.split()) == sorted(text.split()) for out in outs)
    words = TfidfVectorizer(stop_words="english").build_analyzer()
    assert mining._lexical_terms(words, "저는 공원에 갔어요") == ["저는", "공원에", "갔어요"]
    # beside Chinese letters (permuted one by one, the text's spaces kept in place), a Korean word is one unit
    outs = {scramble("我爱 한국어 音乐", seed) for seed in range(20)}
    assert all("한국어" in out and sorted(out) == sorted("我爱 한국어 音乐") for out in outs) and len(outs) > 5


def test_two_latin_words_of_a_spaceless_reply_are_never_glued():
    """A scramble of "我用Python和Java写代码" may put its two Latin words side by side: a space parts them (glued, the
    scramble held "PythonJava", a word of neither text)."""
    text = "我用Python和Java写代码"
    outs = {scramble(text, seed) for seed in range(200)}
    adjacent = [o for o in outs if "Python Java" in o or "Java Python" in o]
    assert adjacent and not any("PythonJava" in o or "JavaPython" in o for o in outs)
    assert all(sorted(o.replace(" ", "")) == sorted(text) for o in outs)


@pytest.mark.parametrize("text", ["好的！", "哈哈哈", "嗯", "ok 好"])
def test_spaceless_replies_of_under_three_letters_or_one_letter_repeated_have_no_scramble(text):
    assert scramble(text) is None


def test_spaceless_gold_replies_get_scrambles_and_those_left_without_are_counted(caplog):
    """Split by whitespace, no Chinese reply had three words: every k_scrambled draw fell back to a random reply,
    and nothing said so."""
    pairs = PairSet.from_dialogues(ZH, max_context_turns=1)
    n = len(pairs.responses)
    short = {pairs.responses[r] for r in np.unique(pairs.resp) if len(pairs.responses[r].rstrip("！。")) < 3}
    assert short == {"拿铁", "是啊", "好的"}
    with caplog.at_level(logging.WARNING, "pmi_reward.data.mining"):
        mine_scrambled(pairs)
    assert [r.getMessage() for r in caplog.records] == [
        f"k_scrambled: 3 of {len(np.unique(pairs.resp))} gold replies are too short to scramble (fewer than three "
        "words, or all alike); their k_scrambled negatives are random replies"
    ]
    negs = sample_negatives(pairs, NegativeSpec(k_random=0, k_context=0, k_scrambled=1), np.random.default_rng(0))
    for i, r in enumerate(negs[:, 0]):
        gold = pairs.responses[pairs.resp[i]]
        if gold in short:
            assert r < n
        else:
            assert r >= n and sorted(pairs.responses[r]) == sorted(gold) and pairs.responses[r] != gold


def test_english_scrambles_warn_only_where_a_reply_is_left_without_one(caplog):
    pairs = PairSet.from_dialogues([Dialogue("x", ("hi there you", "my cat likes fish", "so does my dog"))], 1)
    with caplog.at_level(logging.WARNING, "pmi_reward.data.mining"):
        mine_scrambled(pairs)
    assert caplog.text == ""


# MEEP's answer parser: a number right after a Chinese or Japanese letter is a score (those scripts put no space
# before it); one glued to a Latin word is not.
@pytest.mark.parametrize(
    "text, expected",
    [
        ("我给这个回复打85分。", 85.0),
        ("得分85分", 85.0),
        ("参与度为85%", 85.0),
        ("分数是８５分", 85.0),
        ("評価は70点です", 70.0),
        ("评分范围为0-100，我打85分", 85.0),  # the scale, written after a letter, is still no score
        ("满分0到100，打分：72分", 72.0),
        ("SmolLM2 says 40", 40.0),
        ("v3", None),
    ],
)
def test_meep_reads_a_score_written_right_after_a_cjk_letter(text, expected):
    assert parse_score(text) == expected

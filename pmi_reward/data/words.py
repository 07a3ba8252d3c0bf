"""Words of a text in any script, and whether it asks a question: the one word splitter of the policy diagnostics
(``evaluation.metrics.words``: length, distinct-n, copies, generic replies, template openings) and the one
definition of the scripts written without spaces, which the mined negatives (``data.mining``) import and the length
baseline (``rewards.length.reply_words``) counts in, with Hangul besides (``HANGUL``).

Here in ``data``, the first stage, so that every later one (``rewards``, ``evaluation``, ``policy``) and ``data``
itself can import it.

A word is a whitespace-separated run of letters, digits and underscores, lower-cased, with punctuation, symbols
(emoji included), control and format characters and apostrophes removed ("Don't!" is ``dont``). Two kinds of text
are not English-like:

- Scripts written without spaces between words (``SPACELESS``: Thai; Japanese kana; CJK ideographs): each letter
  is a word, as ``reply_words`` counts them. Split on whitespace alone, a Chinese reply was one word whatever its
  length, so lengths, distinct-n and copy detection saw nothing. Korean is written with spaces between its words:
  Hangul (``HANGUL``) is no such script here, a Korean word is a whitespace word ("저는 어제" is ``저는``, ``어제``).
- Combining marks (Unicode Mn and Mc: Devanagari vowel signs, Thai vowel and tone marks, accents written apart)
  stay inside the word of the letter they follow. Removed as punctuation, they merged different words ("काम" *work*
  and "कम" *less*). A mark that follows no letter (after a space, or after a removed symbol: an emoji's), an
  enclosing mark (a keycap) and a variation selector are removed, as before.

Text without those scripts, and without a combining mark right after a letter or digit, splits exactly as it always
did: the figures recorded for English replies do not move (``tests/test_words_spaceless.py`` compares every code
point, and Chit-Chat replies, with the former rule).

Consistency with the length baseline: ``len(split_words(text)) == reply_words(text)`` for every text whose
whitespace-separated tokens each hold a letter or a digit and which has no underscore and no Hangul. ``reply_words``
also counts a token of punctuation or symbols alone (``"-"``, ``":)"``, an emoji) as a word, as ``len(text.split())``
does, where this splitter finds none; and it counts each Hangul letter (a Korean syllable) as a word, as its fitted
baselines did, where this splitter counts Korean's whitespace words.
"""

from __future__ import annotations

import functools
import re
import unicodedata

__all__ = ["SPACELESS", "HANGUL", "has_spaceless", "split_words", "QUESTION_MARKS", "asks_question"]

# Scripts written without spaces between words: Thai; kana (hiragana, katakana, their extensions and half-width forms);
# CJK ideographs (the main block, extension A, compatibility ones, and the supplementary planes' extensions). A
# character class body (inside ``[...]``): the splitter's, the mined negatives' (``data.mining``) and, with
# ``HANGUL``, the length baseline's (``rewards.length``).
SPACELESS = (
    "\u0e00-\u0e7f\u3040-\u30ff\u31f0-\u31ff\uff66-\uff9f\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0003134f"
)
# Hangul (jamo, compatibility jamo, syllables), a character class body. Korean puts spaces between its words, so it is
# not in ``SPACELESS``; ``rewards.length.reply_words`` alone counts each Hangul letter as a word (its baselines were
# fitted so, and must not move).
HANGUL = "\u1100-\u11ff\u3130-\u318f\ua960-\ua97f\uac00-\ud7ff"
_HAS_SPACELESS = re.compile(f"[{SPACELESS}]")
_PIECES = re.compile(f"[{SPACELESS}]|[^{SPACELESS}]+")  # one character of those scripts, or a run of anything else
_NOT_WORD = re.compile(r"[^\w\s]+")  # what the splitter removes (combining marks are put back: ``_kept``)

# Question marks of the scripts that write one (the Unicode characters named "... QUESTION MARK" that punctuate
# text), the interrobangs, and the question-mark emoji. Japanese and Thai often ask with a particle (か, ไหม) and
# no mark: such a question is not seen.
QUESTION_MARKS = frozenset(
    "?"  # ASCII
    "\uff1f\ufe56\ufe16"  # full-width (Chinese, Japanese), small, vertical presentation form
    "\u00bf"  # inverted (Spanish: opens a question)
    "\u037e"  # Greek (looks like a semicolon)
    "\u055e"  # Armenian
    "\u061f"  # Arabic, Persian, Urdu
    "\u1367"  # Ethiopic
    "\u1945"  # Limbu
    "\u2cfa\u2cfb"  # Old Nubian
    "\ua60f"  # Vai
    "\ua6f7"  # Bamum
    "\U00011143"  # Chakma
    "\U0001e95f"  # Adlam
    "\u2e2e"  # reversed (rhetorical question)
    "\u2047\u2048\u2049\u203d\u2e18"  # double, question-exclamation, exclamation-question, interrobang, inverted one
    "\u2753\u2754"  # question-mark emoji
)


def has_spaceless(text: str) -> bool:
    """Whether ``text`` holds a character of a script written without spaces between words (``SPACELESS``)."""
    return _HAS_SPACELESS.search(text) is not None


# Marks that are no part of a word: variation selectors (the emoji and text presentation selectors, the ideographic
# and Mongolian ones) and the combining grapheme joiner only select how a character is drawn.
_NO_WORD_MARKS = frozenset(
    [
        *map(chr, range(0xFE00, 0xFE10)),
        *map(chr, range(0xE0100, 0xE01F0)),
        "\u180b",
        "\u180c",
        "\u180d",
        "\u180f",
        "\u034f",
    ]
)


def _is_mark(ch: str) -> bool:
    """Whether ``ch`` is a combining mark a word keeps: a nonspacing or spacing one (Mn, Mc: vowel signs, tone marks,
    accents), not an enclosing one (Me: keycaps, circles) nor a variation selector."""
    return unicodedata.category(ch) in ("Mn", "Mc") and ch not in _NO_WORD_MARKS


def _kept(match: re.Match, sep: str = "") -> str:
    """What stays of a run of characters that are neither word characters nor whitespace: the combining marks at its
    start when a word character precedes them (the marks of that word's last letter; a mark after a removed symbol,
    such as an emoji's, goes with it), and ``sep`` for each character removed; a character of a spaceless script
    that is neither a letter nor a mark (Thai ``๏``, kana ``・``) parts the letters around it, as in ``reply_words``."""
    start = match.start()
    attached = start > 0 and not match.string[start - 1].isspace()  # the run is maximal: a word character before it
    out = []
    for ch in match.group():
        attached = attached and _is_mark(ch)
        if attached:
            out.append(ch)
        else:
            out.append(" " if _HAS_SPACELESS.match(ch) else sep)
    return "".join(out)


_parting = functools.partial(_kept, sep=" ")


def _without_leading_marks(text: str) -> str:
    """``text`` from its first character that is no combining mark on."""
    start = 0
    while start < len(text) and _is_mark(text[start]):
        start += 1
    return text[start:]


def _units(token: str) -> list[str]:
    """The words of one whitespace-separated token holding letters of a spaceless script: each such letter, and
    each run of other letters or digits between them, a letter's or run's combining marks with it (as
    ``reply_words`` counts them: a run without a letter or digit is none)."""
    units: list[str] = []
    for piece in _PIECES.findall(token):
        rest = _without_leading_marks(piece)
        if units and len(rest) < len(piece):  # marks at the start of a piece (a Thai vowel sign) mark the last word
            units[-1] += piece[: len(piece) - len(rest)]
        if any(ch.isalnum() for ch in rest):
            units.append(rest)
    return units


def split_words(text: str, punctuation_parts: bool = False) -> list[str]:
    """Lower-case words with punctuation, symbols and apostrophes removed (module docstring): whitespace-separated,
    each letter of a spaceless script its own word, combining marks kept with the letter they follow (a word holding
    one in its composed form, NFC: "cafe" + U+0301 is "café" as typed precomposed).

    ``punctuation_parts``: a removed character parts the word it stands in ("e-mail" is ``e``, ``mail``), as a
    ``\\w+`` search finds words; by default it is dropped from it (``email``), as the diagnostics always read words.
    Either way an apostrophe is dropped ("don't" is ``dont``)."""
    # "İ".lower() is "i" plus a combining dot above, which the former rule removed: lower it to "i" as before
    text = text.replace("\u0130", "I").lower().replace("'", "").replace("\u2019", "")
    text = _NOT_WORD.sub(_parting if punctuation_parts else _kept, text)
    out: list[str] = []
    for token in text.split():
        if _HAS_SPACELESS.search(token):
            out.extend(_units(token))
        else:
            out.append(token)
    if text.isascii():
        return out
    return [unicodedata.normalize("NFC", w) if any(map(_is_mark, w)) else w for w in out]


def asks_question(text: str) -> bool:
    """Whether ``text`` holds a question mark of any script (``QUESTION_MARKS``)."""
    return not QUESTION_MARKS.isdisjoint(text)

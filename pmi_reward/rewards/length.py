"""A length-neutral PMI reward: PMI minus the PMI a reply of that length is expected to get.

PMI grows with what a reply says, and a longer reply can say more; a policy rewarded with raw PMI can buy
reward with length alone. ``LengthBaseline`` is the reward scorer's own mean PMI of human replies, binned by
their length in words (fitted without any judge, on the human replies of the policy's training prompts:
``pmi_reward.policy.trainers`` does it with ``--length_neutral``); with ``RewardOptions.length_baseline`` set to
its file, the reward path subtracts the baseline at each reply's length (linear between bin centres, flat
beyond the ends) before centring and scaling. A longer reply then earns more only if it is more informative
than human replies of that length usually are.

Length is counted in words: whitespace-separated words, except in scripts written without spaces between words
(Chinese, Japanese kana, Thai) and in Korean Hangul, where each letter counts as a word (``reply_words``). Counted by
whitespace alone, every Chinese reply was one word and a baseline fitted on them one bin: a constant, which leaves
the reward exactly as length-biased as raw PMI. Korean does put spaces between its words (the word splitter
``data.words.split_words`` reads them so), but baselines were fitted counting its syllables: that count stays, so
that they do not move. A baseline file records its unit; files saved before this count (``"unit": "words"``) still
load and keep counting as they were fitted, by whitespace alone.
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from ..data.records import atomic_write
from ..data.words import HANGUL, SPACELESS

__all__ = ["LengthBaseline", "reply_words", "fit_length_baseline", "SCRIPT_WORDS", "WHITESPACE_WORDS", "MIN_BINS"]

logger = logging.getLogger(__name__)

SCRIPT_WORDS = "script_words"  # whitespace words, and each letter of a script written without spaces
WHITESPACE_WORDS = "words"  # whitespace words alone: the unit of baseline files saved before SCRIPT_WORDS
UNITS = (SCRIPT_WORDS, WHITESPACE_WORDS)
MIN_BINS = 3  # fewer length bins than this make a baseline close to a constant: fit_length_baseline warns

# The scripts whose every letter is a word of a reply's length (a character class body): those written without spaces
# (``data.words.SPACELESS``, the one definition), and Hangul, whose syllables fitted baselines count.
LETTER_COUNTED = SPACELESS + HANGUL
_HAS_LETTER_COUNTED = re.compile(f"[{LETTER_COUNTED}]")
_PIECES = re.compile(f"[{LETTER_COUNTED}]|[^{LETTER_COUNTED}]+")  # one letter of those scripts, or a run of the rest


def _token_words(token: str) -> int:
    """Words in one whitespace-separated token: 1, or, where it holds letters of ``LETTER_COUNTED``, each such letter
    and each run of other letters or digits between them (``"用Python写代码。"``: 5; ``"안녕하세요"``: 5); a
    punctuation mark or a combining vowel sign is no word of its own."""
    if not _HAS_LETTER_COUNTED.search(token):
        return 1
    return max(1, sum(1 for piece in _PIECES.findall(token) if any(ch.isalnum() for ch in piece)))


def reply_words(text: str, unit: str = SCRIPT_WORDS) -> int:
    """A reply's length in words (the baseline's unit): whitespace-separated words, and in scripts written without
    spaces (CJK, kana, Thai) and Hangul (``LETTER_COUNTED``) each letter, so that a Chinese reply is not one word
    whatever its length. Text without those scripts counts exactly as ``len(text.split())``;
    ``unit=WHITESPACE_WORDS`` always does (the count of baseline files saved before this one)."""
    if unit not in UNITS:
        raise ValueError(f"unknown length unit {unit!r}: one of {', '.join(UNITS)}")
    words = text.split()
    if unit == WHITESPACE_WORDS or not _HAS_LETTER_COUNTED.search(text):
        return len(words)
    return sum(_token_words(word) for word in words)


@dataclass(frozen=True)
class LengthBaseline:
    """Mean PMI of human replies by length: bin centres (mean words), the mean PMI and the count in each bin; ``unit``:
    how its words are counted (``reply_words``), which the reward path counts a reply's length in."""

    lengths: tuple[float, ...]
    pmi: tuple[float, ...]
    counts: tuple[int, ...]
    source: dict = field(default_factory=dict)
    unit: str = SCRIPT_WORDS

    def __post_init__(self) -> None:
        if not self.lengths or not (len(self.lengths) == len(self.pmi) == len(self.counts)):
            raise ValueError("a length baseline needs one or more bins, with a length, a PMI and a count each")
        if any(b <= a for a, b in zip(self.lengths, self.lengths[1:], strict=False)):
            raise ValueError("length baseline bins must have increasing lengths")
        if not all(math.isfinite(v) for v in (*self.lengths, *self.pmi)):
            raise ValueError("length baseline values must be finite")
        if self.unit not in UNITS:
            raise ValueError(f"length baseline unit {self.unit!r} is unknown: one of {', '.join(UNITS)}")

    def words(self, replies: Sequence[str]) -> list[int]:
        """Each reply's length in this baseline's unit: the count it was fitted with."""
        return [reply_words(r, self.unit) for r in replies]

    def expected(self, n_words: Sequence[float] | np.ndarray) -> np.ndarray:
        """The expected PMI at each length (linear between bin centres, flat beyond the first and last)."""
        return np.interp(np.asarray(n_words, dtype=np.float64), self.lengths, self.pmi)

    def save(self, path: str | Path) -> Path:
        """Write the baseline to ``path`` in one step (a temporary file moved into place), so that no reader ever
        sees a half-written file (under DDP the main process writes it and the other ranks then read it)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps({"unit": self.unit, **asdict(self)}, indent=1)
        atomic_write(path, lambda tmp: Path(tmp).write_text(text))
        return path

    @classmethod
    def load(cls, path: str | Path) -> LengthBaseline:
        """Read a baseline file; a clear error naming the file when it is missing or malformed. A file without a unit
        counts whitespace words, as every file saved before the unit was recorded did."""
        try:
            data = json.loads(Path(path).read_text())
            return cls(
                tuple(data["lengths"]),
                tuple(data["pmi"]),
                tuple(data["counts"]),
                data.get("source") or {},
                data.get("unit", WHITESPACE_WORDS),
            )
        except FileNotFoundError:
            raise FileNotFoundError(f"length_baseline {path}: no such file") from None
        except (ValueError, KeyError, TypeError) as err:
            raise ValueError(f"length_baseline {path}: not a length baseline ({err})") from None


def fit_length_baseline(
    pmi: Sequence[float] | np.ndarray, replies: Sequence[str], bins: int = 10, source: dict | None = None
) -> LengthBaseline:
    """Mean PMI of ``replies`` (human replies, scored by the reward scorer) in ``bins`` length-quantile bins, their
    lengths counted by ``reply_words``. Fewer than ``MIN_BINS`` bins (of ``bins`` >= ``MIN_BINS`` asked) are logged as
    a warning: the replies are nearly all of one length, and the baseline, nearly a constant, takes out little of
    the reward's length bias."""
    values = np.asarray(pmi, dtype=np.float64)
    lengths = np.array([reply_words(r) for r in replies], dtype=np.float64)
    if len(values) != len(lengths):
        raise ValueError(f"got {len(values)} scores but {len(lengths)} replies")
    keep = np.isfinite(values) & (lengths > 0)
    values, lengths = values[keep], lengths[keep]
    if not len(values):
        raise ValueError("no scored, non-empty replies to fit a length baseline on")
    edges = np.unique(np.quantile(lengths, np.linspace(0, 1, bins + 1)[1:-1]))
    which = np.digitize(lengths, edges, right=True)
    centres, means, counts = [], [], []
    for b in np.unique(which):
        inside = which == b
        centres.append(float(lengths[inside].mean()))
        means.append(float(values[inside].mean()))
        counts.append(int(inside.sum()))
    if len(centres) < min(bins, MIN_BINS):
        logger.warning(
            "length baseline: %d length bin(s) from %d replies of %d to %d words (%d bins asked): nearly a constant, "
            "it leaves the reward about as length-biased as raw PMI; fit it on replies of varied lengths",
            len(centres),
            len(values),
            int(lengths.min()),
            int(lengths.max()),
            bins,
        )
    return LengthBaseline(tuple(centres), tuple(means), tuple(counts), dict(source or {}, replies=int(len(values))))

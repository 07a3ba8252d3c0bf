"""Engagement-gain metrics: bootstrap CIs over contexts, win-rate, distinct-n, generic and copied replies.

The unit of resampling is the context (each holds several sampled replies), so CIs reflect which
conversations were drawn, not just sampling noise. Text checks work on normalised words (lower case,
punctuation and apostrophes dropped).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np

from .. import metrics

__all__ = ["words", "distinct_n", "copies_context", "is_generic", "bootstrap_ci", "paired_bootstrap_ci", "win_rate",
           "GENERIC_REPLIES"]

_PUNCT = re.compile(r"[^\w\s]+")

# Stock replies that fit any context (normalised form); a reply is generic if it is one of these.
GENERIC_REPLIES = frozenset((
    "ok", "okay", "k", "kk", "lol", "lmao", "haha", "hahaha", "yes", "yeah", "yep", "yup", "ya", "no", "nope", "nah",
    "cool", "nice", "wow", "oh", "ah", "hmm", "same", "true", "right", "sure", "good", "great", "awesome", "thanks",
    "thank you", "really", "interesting", "i see", "me too", "me neither", "same here", "agreed", "i agree",
    "sounds good", "oh nice", "oh cool", "oh wow", "oh ok", "oh okay", "thats cool", "thats nice", "thats great",
    "thats good", "thats awesome", "thats interesting", "that is interesting", "thats true", "thats right",
    "i dont know", "idk", "not sure", "i know", "of course", "fair enough", "good for you", "hello", "hi", "hey",
    "how are you", "im good", "im fine", "good thanks", "fine thanks",
))


def words(text: str) -> list[str]:
    """Lower-case words with punctuation and apostrophes removed."""
    return _PUNCT.sub("", text.lower().replace("'", "").replace("\u2019", "")).split()


def distinct_n(replies: Sequence[str], n: int) -> float:
    """Distinct word n-grams over all n-grams in ``replies`` (corpus level); 0 when there are none."""
    grams = [tuple(w[i:i + n]) for w in map(words, replies) for i in range(len(w) - n + 1)]
    return len(set(grams)) / len(grams) if grams else 0.0


def copies_context(reply: str, context: str, threshold: float = 0.8) -> bool:
    """Whether the reply is (mostly) a copy of the context: at least 3 words, and at least ``threshold`` of its
    word trigrams occur in the context."""
    w = words(reply)
    if len(w) < 3:
        return False
    c = words(context)
    seen = {tuple(c[i:i + 3]) for i in range(len(c) - 2)}
    grams = [tuple(w[i:i + 3]) for i in range(len(w) - 2)]
    return sum(g in seen for g in grams) / len(grams) >= threshold


def is_generic(reply: str) -> bool:
    """Whether the reply is empty or a stock phrase that fits any context (``GENERIC_REPLIES``)."""
    return " ".join(words(reply)) in GENERIC_REPLIES or not words(reply)


def bootstrap_ci(values: np.ndarray, n_boot: int = 2000, alpha: float = 0.05,
                 seed: int = 0) -> tuple[float, float, float]:
    """(mean, low, high): percentile CI of the mean over rows (contexts); a row's value is its mean."""
    per_row = np.asarray(values, dtype=np.float64).reshape(len(values), -1).mean(1)
    lo, hi = metrics.bootstrap_ci(np.mean, per_row, n_boot=n_boot, level=1 - alpha, seed=seed)
    return float(per_row.mean()), lo, hi


def paired_bootstrap_ci(a: np.ndarray, b: np.ndarray, n_boot: int = 2000, alpha: float = 0.05,
                        seed: int = 0) -> tuple[float, float, float]:
    """Mean and CI of ``a - b`` where row i of both belongs to context i (contexts resampled together)."""
    diff = np.asarray(a, dtype=np.float64).reshape(len(a), -1).mean(1) - np.asarray(b, dtype=np.float64).reshape(
        len(b), -1).mean(1)
    return bootstrap_ci(diff, n_boot, alpha, seed)


def win_rate(a: np.ndarray, b: np.ndarray) -> float:
    """P(a reply of ``a`` beats a reply of ``b`` to the same context), ties count half; rows are contexts."""
    a = np.asarray(a, dtype=np.float64).reshape(len(a), -1)
    b = np.asarray(b, dtype=np.float64).reshape(len(b), -1)
    diff = a[:, :, None] - b[:, None, :]
    return float(((diff > 0) + 0.5 * (diff == 0)).mean())

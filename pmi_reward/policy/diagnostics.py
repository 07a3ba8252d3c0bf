"""Reward-hacking diagnostics of a policy's replies: is a judge's gain bought by length or by sameness?

Rows are contexts, columns the replies sampled for each (the same layout as ``evaluation.metrics``). Lengths
are in words (``metrics.words``, the shared splitter ``data.words.split_words``): in Chinese, Japanese and Thai each
letter is a word, as the reward's length baseline counts (``rewards.length.reply_words``), so a reply in those scripts
has a length, n-grams and an opening (split on whitespace alone, each was one "word"); Korean, written with spaces,
is split at them (the length baseline counts its syllables).

- ``length_adjusted_gain``: the policy's gain over base after a linear length effect, from a regression of
  judge PMI on a policy indicator and reply length with one intercept per context (so, as the plain gain, it
  compares replies to the same context); a bootstrap CI over contexts. With equal lengths it is the plain gain.
- ``binned_gain``: the gain inside reply-length bins (edges from the base's length quartiles), and their
  average weighted by the pooled replies in each bin: a gain that lives only in the long bins is length.
- ``text_diagnostics``: distinct-1/2 within the samples of one context (does the policy say the same thing
  every time?) and across contexts (one reply each: does it say the same thing to everyone?), the share of
  replies that open with one of the 20 most frequent openings (first 3 words: templates), and the question rate
  (a question mark of any script: ``data.words.QUESTION_MARKS``, "？" and "؟" included).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np

from ..data.words import asks_question
from ..evaluation.metrics import Estimate, distinct_n, words

__all__ = [
    "reply_lengths",
    "length_edges",
    "binned_gain",
    "length_adjusted_gain",
    "opening_share",
    "question_rate",
    "text_diagnostics",
]


def reply_lengths(replies: Sequence[Sequence[str]]) -> np.ndarray:
    """(contexts, samples) reply lengths in words."""
    return np.array([[len(words(r)) for r in row] for row in replies], dtype=np.float64)


def length_edges(lengths: np.ndarray, bins: int = 4) -> list[float]:
    """Inner bin edges at the quantiles of ``lengths`` (duplicates, and edges that would leave the top bin empty,
    dropped): ``bins`` bins at most, one when every length is the same."""
    flat = np.ravel(lengths)
    if not len(flat):
        return []
    top = float(flat.max())
    return sorted({float(q) for q in np.quantile(flat, np.linspace(0, 1, bins + 1)[1:-1]) if q < top})


def _bin_label(edges: list[float], b: int) -> str:
    lo = f">{edges[b - 1]:g}" if b else ""
    hi = f"<={edges[b]:g}" if b < len(edges) else ""
    return f"{lo} {hi}".strip() + " words" if (lo or hi) else "all"


def binned_gain(
    policy: np.ndarray, base: np.ndarray, policy_len: np.ndarray, base_len: np.ndarray, edges: list[float]
) -> dict:
    """Gain (mean policy PMI - mean base PMI) inside each length bin, and their pooled-count-weighted mean over
    the bins where both have replies (``gain``; NaN when no bin has both)."""
    p_bin, b_bin = (
        np.digitize(np.ravel(policy_len), edges, right=True),
        np.digitize(np.ravel(base_len), edges, right=True),
    )
    p, b = np.ravel(policy), np.ravel(base)
    rows, total, weight = [], 0.0, 0
    for k in range(len(edges) + 1):
        pk, bk = p[p_bin == k], b[b_bin == k]
        gain = float(pk.mean() - bk.mean()) if len(pk) and len(bk) else float("nan")
        rows.append({"bin": _bin_label(edges, k), "n_policy": int(len(pk)), "n_base": int(len(bk)), "gain": gain})
        if np.isfinite(gain):
            total, weight = total + gain * (len(pk) + len(bk)), weight + len(pk) + len(bk)
    return {"bins": rows, "gain": total / weight if weight else float("nan")}


def _context_stats(policy, base, policy_len, base_len) -> np.ndarray:
    """Per context: the within-context sums of squares and products of (indicator, length, PMI)."""
    y = np.concatenate([np.asarray(policy, float), np.asarray(base, float)], axis=1)
    length = np.concatenate([np.asarray(policy_len, float), np.asarray(base_len, float)], axis=1)
    d = np.concatenate([np.ones_like(np.asarray(policy, float)), np.zeros_like(np.asarray(base, float))], axis=1)
    y, length, d = (v - v.mean(1, keepdims=True) for v in (y, length, d))
    return np.stack(
        [(d * d).sum(1), (d * length).sum(1), (length * length).sum(1), (d * y).sum(1), (length * y).sum(1)], 1
    )


def _solve(s: np.ndarray) -> np.ndarray:
    """The policy coefficient of the two-regressor least squares from summed statistics (..., 5)."""
    sdd, sdl, sll, sdy, sly = np.moveaxis(s, -1, 0)
    det = sdd * sll - sdl * sdl
    with np.errstate(divide="ignore", invalid="ignore"):
        joint = (sll * sdy - sdl * sly) / det
        alone = sdy / sdd  # length constant within every context: no length term to fit
    # length a linear function of the policy indicator within every context: the coefficient is not identified
    # (det is 0 up to rounding, and the ratio of two rounding errors is no estimate)
    joint = np.where(det > 1e-9 * sdd * sll, joint, np.nan)
    return np.where(sll > 1e-9 * np.maximum(sdd, 1.0), joint, alone)


def length_adjusted_gain(
    policy: np.ndarray,
    base: np.ndarray,
    policy_len: np.ndarray,
    base_len: np.ndarray,
    n_boot: int = 2000,
    seed: int = 0,
) -> Estimate:
    """The policy indicator's coefficient in PMI ~ context + policy + length (rows: contexts), with a bootstrap
    CI over contexts."""
    stats = _context_stats(policy, base, policy_len, base_len)
    value = float(_solve(stats.sum(0)))
    if len(stats) < 2:
        return Estimate(value, float("nan"), float("nan"))
    idx = np.random.default_rng(seed).integers(0, len(stats), size=(n_boot, len(stats)))
    draws = _solve(stats[idx].sum(1))
    draws = draws[np.isfinite(draws)]
    low, high = np.percentile(draws, [2.5, 97.5]) if len(draws) else (float("nan"), float("nan"))
    return Estimate(value, float(low), float(high))


def opening_share(replies: Sequence[str], top: int = 20, n_words: int = 3) -> float:
    """Share of replies whose first ``n_words`` words are one of the ``top`` most frequent openings (an empty reply
    opens with none: it counts in the share's denominator, not as a template)."""
    openings = [" ".join(words(r)[:n_words]) for r in replies if words(r)]
    if not openings:
        return 0.0
    return sum(c for _, c in Counter(openings).most_common(top)) / len(replies)


def _has_ngram(replies: Sequence[str], n: int) -> bool:
    return any(len(words(r)) >= n for r in replies)


def question_rate(replies: Sequence[str]) -> float:
    """Share of replies that ask something: that hold a question mark of any script (``asks_question``: "？", "؟")."""
    return float(np.mean([asks_question(r) for r in replies])) if len(replies) else 0.0


def text_diagnostics(replies: Sequence[Sequence[str]]) -> dict[str, float]:
    """Diversity within and across contexts, template openings and the question rate of one policy's replies."""
    flat = [r for row in replies for r in row]
    # a context whose replies hold no n-gram (one-word replies have no bigram) says nothing about repetition
    within = [[distinct_n(row, n) for row in replies if len(row) > 1 and _has_ngram(row, n)] for n in (1, 2)]
    first = [row[0] for row in replies if row]
    across = [distinct_n(first, n) if _has_ngram(first, n) else float("nan") for n in (1, 2)]  # as within: no n-gram
    return {
        "distinct_1_within": float(np.mean(within[0])) if within[0] else float("nan"),
        "distinct_2_within": float(np.mean(within[1])) if within[1] else float("nan"),
        "distinct_1_across": across[0],
        "distinct_2_across": across[1],
        "top20_openings": opening_share(flat),
        "questions": question_rate(flat),
    }

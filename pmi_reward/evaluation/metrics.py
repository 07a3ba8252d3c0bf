"""Every metric the project reports: scorer quality (ROC-AUC, rank and linear correlation, MSE), bootstrap CIs,
mean ± std over rounds, and the text statistics of a policy's replies (distinct-n, generic and copied replies,
win-rate).

Thin, NaN-safe wrappers over scipy so every recipe reports the same quantities the same way: a degenerate input
(one class only, a constant or nearly constant vector; for a correlation, also a non-finite value) gives NaN rather
than a warning or a crash, and bootstrap resampling skips such draws. For a policy, the unit of resampling is the
context (each holds several sampled replies), so CIs reflect which conversations were drawn, not just sampling noise;
text checks work on normalised words (``data.words``: lower case, punctuation and apostrophes dropped, each letter
of a script written without spaces a word).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.stats import ConstantInputWarning, NearConstantInputWarning, pearsonr, rankdata, spearmanr

from ..data.words import split_words
from ..progress import progress_bar

__all__ = [
    "roc_auc",
    "spearman",
    "pearson",
    "mse",
    "bootstrap_ci",
    "mean_std",
    "Estimate",
    "format_mean_std",
    "row_means",
    "mean_ci",
    "win_rate",
    "words",
    "distinct_n",
    "copies_context",
    "is_generic",
    "GENERIC_REPLIES",
]


def roc_auc(pos: np.ndarray, neg: np.ndarray) -> float:
    """Probability that a positive outscores a negative (ties count half); NaN if either side is empty."""
    pos, neg = np.ravel(pos).astype(np.float64), np.ravel(neg).astype(np.float64)
    if not len(pos) or not len(neg):
        return float("nan")
    # Mann-Whitney U from mid-ranks: equal to sklearn's roc_auc_score, and fast enough to bootstrap
    ranks = rankdata(np.r_[pos, neg])
    return float((ranks[: len(pos)].sum() - len(pos) * (len(pos) + 1) / 2) / (len(pos) * len(neg)))


def _auc_of_weights(pos: np.ndarray, neg: np.ndarray) -> Callable[[np.ndarray], float] | None:
    """``roc_auc`` of a resample of rows given by how often each row was drawn, with the scores sorted once.

    ``roc_auc(pos[idx], neg[idx])`` ranks every score again, O(n log n) for each of a bootstrap's resamples (39
    minutes of them at 200,000 rows with 9 negatives each, review 29). Here the negatives are sorted once, and each
    positive knows how many of them score below it and how many up to it; a resample is then only its row weights.
    A running sum of the negatives' weights in score order gives each positive its weighted negatives below and up
    to it, whose sum, weighted by the positives' weights, is twice the Mann-Whitney U (ties count half): O(n). All
    of it is whole numbers, so U and the pair count are exact, as ``roc_auc``'s mid-rank sums are (below 2**53),
    and their quotient is the same float to the last bit. None (rank each resample) when a score is NaN or a side
    is empty: ``roc_auc`` is NaN there, and ``bootstrap_ci`` returns before resampling such data."""
    n = len(pos)
    p = np.asarray(pos, dtype=np.float64).reshape(n, -1)
    q = np.asarray(neg, dtype=np.float64).reshape(n, -1)
    if not p.size or not q.size or np.isnan(p).any() or np.isnan(q).any():
        return None
    order = np.argsort(q.ravel(), kind="stable")
    ascending = q.ravel()[order]
    neg_rows = order // q.shape[1]  # the row of each negative, in ascending order of score
    pos_rows = np.repeat(np.arange(n), p.shape[1])
    below = np.searchsorted(ascending, p.ravel(), side="left")  # negatives that score less than each positive
    up_to = np.searchsorted(ascending, p.ravel(), side="right")  # ... less or the same
    running = np.zeros(len(order) + 1, dtype=np.int64)  # [i]: weighted negatives among the first i in score order

    def auc(weights: np.ndarray) -> float:
        np.cumsum(np.take(weights, neg_rows), out=running[1:])  # np.take and out=: 40% faster at 200,000 rows
        pos_w = weights if p.shape[1] == 1 else weights[pos_rows]
        twice_u = int(pos_w @ (running[below] + running[up_to]))
        return twice_u / (2 * int(pos_w.sum()) * int(running[-1]))

    return auc


def _paired(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    x, y = np.asarray(x, dtype=np.float64).ravel(), np.asarray(y, dtype=np.float64).ravel()
    if x.shape != y.shape:
        raise ValueError(f"paired metrics need equal lengths, got {len(x)} and {len(y)}")
    return x, y


def _correlation(fn, x: np.ndarray, y: np.ndarray) -> float:
    x, y = _paired(x, y)
    if len(x) < 3 or not (np.isfinite(x).all() and np.isfinite(y).all()) or np.ptp(x) == 0 or np.ptp(y) == 0:
        return float("nan")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConstantInputWarning)
        # scipy's "nearly constant" is a spread at rounding level (below ~1e-12 of the mean): its coefficient is
        # rounding noise, degenerate as a constant input is
        warnings.simplefilter("error", NearConstantInputWarning)
        try:
            return float(fn(x, y)[0])
        except NearConstantInputWarning:
            return float("nan")


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman rank correlation; NaN for fewer than 3 points, a non-finite value or a (nearly) constant input."""
    return _correlation(spearmanr, x, y)


def pearson(x: np.ndarray, y: np.ndarray) -> float:
    """Pearson correlation; NaN for fewer than 3 points, a non-finite value or a (nearly) constant input."""
    return _correlation(pearsonr, x, y)


def mse(pred: np.ndarray, target: np.ndarray) -> float:
    """Mean squared error of ``pred`` against ``target``."""
    pred, target = _paired(pred, target)
    return float(np.mean((pred - target) ** 2)) if len(pred) else float("nan")


def _centred_mid_ranks(values: np.ndarray) -> Callable[[np.ndarray, int], np.ndarray]:
    """Twice the centred mid-rank (``rankdata``'s average rank, less the mean rank) of each value within a
    resample given by each value's weight (how often it was drawn), with the values sorted once.

    A value's mid-rank among N drawn values is (weight of the values below it + weight of those up to it + 1) / 2,
    and the mean rank is (N + 1) / 2, so twice the difference is below + up_to - N: whole numbers, exact in float64
    (below 2**53), O(n) from a running sum of the weights in sorted order, read at the last of each distinct
    value (ties share it)."""
    order = np.argsort(values, kind="stable")
    ascending = values[order]
    change = ascending[1:] != ascending[:-1]  # -0.0 ties 0.0, as in rankdata
    tie = np.empty(len(values), dtype=np.int64)
    tie[order] = np.r_[0, np.cumsum(change)]  # the distinct value (in ascending order) of each value
    last = None if change.all() else np.r_[np.flatnonzero(change), len(values) - 1]  # its last sorted position

    def ranks(weights: np.ndarray, total: int) -> np.ndarray:
        up_to = np.cumsum(np.take(weights, order))  # int64: exact, and far faster than a float running sum
        if last is not None:
            up_to = up_to[last]  # drawn values up to each distinct value
        drawn = np.diff(up_to, prepend=0)
        return np.take((2 * up_to - drawn - total).astype(np.float64), tie)

    return ranks


def _spearman_of_weights(x: np.ndarray, y: np.ndarray) -> Callable[[np.ndarray], float] | None:
    """``spearman`` of a resample of rows given by how often each row was drawn, with ``x`` and ``y`` sorted once.

    ``spearman(x[idx], y[idx])`` ranks both again, O(n log n) for each of a bootstrap's resamples (about 3.5
    minutes an interval at 200,000 rows, review 30). Here each resample's mid-ranks come from its row weights in O(n)
    (``_centred_mid_ranks``), and Spearman's rho is their Pearson correlation with each value counted as often as
    its row was drawn: ``np.corrcoef`` of the resample's ranks, as ``spearmanr`` computes it, up to float rounding.
    ``spearman``'s NaN rules hold exactly: fewer than 3 values drawn, or an input constant over the drawn rows (the
    drawn values' centred ranks are then all 0, whole numbers with no rounding, so its sum of squares is 0; no
    other resample has a sum of squares of 0, and ``spearmanr`` has no "nearly constant" rule). Rows of several
    values pair up value by value, as ``spearman`` ravels them. None (rank each resample) when ``x`` and ``y`` do
    not pair up so, or hold a non-finite value: ``spearman`` is NaN or raises there, and ``bootstrap_ci`` returns
    or raises before resampling such data."""
    n = len(x)
    p = np.asarray(x, dtype=np.float64).reshape(n, -1)
    q = np.asarray(y, dtype=np.float64).reshape(n, -1)
    if p.shape != q.shape or not p.size or not (np.isfinite(p).all() and np.isfinite(q).all()):
        return None
    per_row = p.shape[1]
    rank_x, rank_y = _centred_mid_ranks(p.ravel()), _centred_mid_ranks(q.ravel())

    def rho(weights: np.ndarray) -> float:
        each = weights if per_row == 1 else np.repeat(weights, per_row)  # row-major: a row's values are adjacent
        total = int(each.sum())
        if total < 3:
            return float("nan")
        dx, dy = rank_x(each, total), rank_y(each, total)
        counted = each.astype(np.float64)
        wx = counted * dx
        sxx, syy, sxy = float(wx @ dx), float((counted * dy) @ dy), float(wx @ dy)
        if sxx == 0 or syy == 0:
            return float("nan")
        return float(np.clip(sxy / np.sqrt(sxx) / np.sqrt(syy), -1.0, 1.0))  # as np.corrcoef divides and clips

    return rho


# the statistics whose bootstrap scores each resample from its row weights, with the builders of their scorers
_WEIGHTED = ((roc_auc, _auc_of_weights), (spearman, _spearman_of_weights))

_LONG_BOOTSTRAP = 2_000_000  # rows × resamples from which a bootstrap shows its progress bar (a second or more)


def bootstrap_ci(
    statistic: Callable[..., float],
    *arrays: np.ndarray,
    n_boot: int = 1000,
    level: float = 0.95,
    seed: int = 0,
    groups: np.ndarray | None = None,
    progress: bool = False,
) -> tuple[float, float]:
    """Percentile bootstrap interval of ``statistic(*arrays)``, resampling rows (axis 0) of all arrays jointly.

    Rows are the independent units: for AUC pass positives (n,) with their negatives (n, K), so a
    positive travels with its own negatives. With ``groups`` (one id per row, e.g. its context) the groups are
    the units instead: each resample draws as many group ids as there are groups, with replacement, and takes all
    the rows of each (rows that share a context are not independent, and resampling them one by one gives too
    narrow an interval). Groups are numbered in order of first appearance, so that when every row is its own
    group the draws pick the same rows as without ``groups``. Draws where the statistic is NaN (a degenerate
    resample: one class, a constant vector) are skipped. When the statistic of the data themselves is not finite
    (e.g. NaN for a NaN row), both bounds are NaN: the draws that happen to miss that row would otherwise give a
    finite interval around no value. One resample's indices are drawn at a time (an (n_boot, n) matrix of them
    took 1.5 GiB at 200,000 rows); the draws are the same. For ``roc_auc`` of (positives, negatives) the scores
    are sorted once and each resample is scored from how often it drew each row (``_auc_of_weights``: the same
    draws and the same values, O(n) rather than O(n log n) a resample); so are ``spearman``'s x and y, each
    resample's mid-ranks then coming from its row weights (``_spearman_of_weights``: the same draws, the same
    values up to float rounding, the same NaN resamples; about 6x faster at 200,000 rows). Only these functions
    themselves take the fast path; a wrapper of them ranks each resample. With ``progress``, a bootstrap of at
    least ``_LONG_BOOTSTRAP`` rows × resamples shows a bar (one of a large file ran for minutes without output).
    """
    if not arrays:
        raise ValueError("bootstrap_ci needs at least one array")
    n = len(arrays[0])
    if any(len(a) != n for a in arrays):
        raise ValueError("all arrays must have the same number of rows")
    if groups is not None and len(groups) != n:
        raise ValueError(f"groups holds {len(groups)} ids for {n} rows")
    if n == 0 or not np.isfinite(statistic(*arrays)):
        return float("nan"), float("nan")
    units, rows, label = n, None, None
    if groups is not None:
        _, first, label = np.unique(np.asarray(groups), return_index=True, return_inverse=True)
        rank = np.empty(len(first), dtype=np.int64)
        rank[np.argsort(first)] = np.arange(len(first))  # group numbers in order of first appearance
        label = rank[label.ravel()]
        units, rows = len(first), np.argsort(label, kind="stable")  # the rows of group 0, of group 1, ...
        counts = np.bincount(label, minlength=units)
        start = np.cumsum(counts) - counts
    fast = next((build for known, build in _WEIGHTED if known is statistic), None) if len(arrays) == 2 else None
    weighted = fast(*arrays) if fast is not None else None
    rng = np.random.default_rng(seed)
    values = np.empty(n_boot, dtype=np.float64)
    name = getattr(statistic, "__name__", "statistic")
    short = not progress or n_boot * n < _LONG_BOOTSTRAP
    for b in progress_bar(range(n_boot), desc=f"bootstrap {name}", unit="resample", leave=False, disable=short):
        idx = rng.integers(0, units, size=units)
        if weighted is not None:  # how often each row was drawn (a group's rows as often as the group)
            drawn = np.bincount(idx, minlength=units)
            values[b] = weighted(drawn if label is None else drawn[label])
            continue
        if rows is not None:  # the rows of each drawn group, one group after another
            sizes = counts[idx]
            ends = np.cumsum(sizes)
            idx = rows[np.arange(ends[-1]) + np.repeat(start[idx] - (ends - sizes), sizes)]
        values[b] = statistic(*(a[idx] for a in arrays))
    values = values[np.isfinite(values)]
    if not len(values):
        return float("nan"), float("nan")
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(values, [tail, 100 - tail])
    return float(low), float(high)


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (ddof=1; 0 for a single value) over rounds/seeds, NaNs ignored."""
    v = np.asarray(values, dtype=np.float64)
    v = v[np.isfinite(v)]
    if not len(v):
        return float("nan"), float("nan")
    return float(v.mean()), float(v.std(ddof=1)) if len(v) > 1 else 0.0


def format_mean_std(values: Sequence[float], digits: int = 3) -> str:
    """``"0.912 ± 0.004"`` over rounds (just the value for one round, ``"–"`` for none). The mean and std are of the
    finite values; NaN ones are named, ``"0.905 ± 0.007 (1 of 3 missing)"``, so that a table whose rounds or seeds
    column counts them does not pass a mean of fewer off as a mean of all."""
    mean, std = mean_std(values)
    if not np.isfinite(mean):
        return "–"
    finite = int(np.isfinite(np.asarray(values, dtype=np.float64)).sum())
    text = f"{mean:.{digits}f}" if finite == 1 else f"{mean:.{digits}f} ± {std:.{digits}f}"
    return text if finite == len(values) else f"{text} ({len(values) - finite} of {len(values)} missing)"


@dataclass(frozen=True)
class Estimate:
    """A point estimate with its bootstrap interval."""

    value: float
    low: float
    high: float

    @classmethod
    def of(
        cls,
        statistic: Callable[..., float],
        *arrays: np.ndarray,
        n_boot: int = 1000,
        seed: int = 0,
        groups: np.ndarray | None = None,
        progress: bool = False,
    ) -> Estimate:
        """``statistic(*arrays)`` with its ``bootstrap_ci`` (over ``groups`` of rows when given; a progress bar for
        a long one with ``progress``)."""
        value = statistic(*arrays)
        return cls(value, *bootstrap_ci(statistic, *arrays, n_boot=n_boot, seed=seed, groups=groups, progress=progress))

    def to_dict(self) -> dict:
        return {"value": self.value, "ci95": [self.low, self.high]}

    def __str__(self) -> str:
        return f"{self.value:.3f} [{self.low:.2f}, {self.high:.2f}]"


# -- a policy's replies: rows are contexts, columns the replies sampled for each -------------------------------
def row_means(values: np.ndarray) -> np.ndarray:
    """Per-row means of (rows, samples) values: a context's score is the mean over its replies."""
    return np.asarray(values, dtype=np.float64).reshape(len(values), -1).mean(1)


def mean_ci(values: np.ndarray, n_boot: int = 2000, seed: int = 0) -> Estimate:
    """The mean over rows (contexts) of their row means, with the percentile bootstrap CI over rows."""
    return Estimate.of(np.mean, row_means(values), n_boot=n_boot, seed=seed)


def win_rate(a: np.ndarray, b: np.ndarray) -> float:
    """P(a reply of ``a`` beats a reply of ``b`` to the same context), ties count half; rows are contexts.
    Pairs with a NaN (unscored) reply are left out; NaN when no pair is left."""
    a = np.asarray(a, dtype=np.float64).reshape(len(a), -1)
    b = np.asarray(b, dtype=np.float64).reshape(len(b), -1)
    if len(a) != len(b):
        raise ValueError(f"win_rate compares replies to the same contexts, got {len(a)} and {len(b)} contexts")
    diff = a[:, :, None] - b[:, None, :]
    scored = ~np.isnan(diff)
    if not scored.any():
        return float("nan")
    return float(((diff > 0) + 0.5 * (diff == 0))[scored].mean())


# Stock replies that fit any context (normalised form: ``words`` joined with spaces); a reply is generic if it is one
# of these. An English list: a reply in another language is generic only when empty (no word).
GENERIC_REPLIES = frozenset(
    (
        "ok",
        "okay",
        "k",
        "kk",
        "lol",
        "lmao",
        "haha",
        "hahaha",
        "yes",
        "yeah",
        "yep",
        "yup",
        "ya",
        "no",
        "nope",
        "nah",
        "cool",
        "nice",
        "wow",
        "oh",
        "ah",
        "hmm",
        "same",
        "true",
        "right",
        "sure",
        "good",
        "great",
        "awesome",
        "thanks",
        "thank you",
        "really",
        "interesting",
        "i see",
        "me too",
        "me neither",
        "same here",
        "agreed",
        "i agree",
        "sounds good",
        "oh nice",
        "oh cool",
        "oh wow",
        "oh ok",
        "oh okay",
        "thats cool",
        "thats nice",
        "thats great",
        "thats good",
        "thats awesome",
        "thats interesting",
        "that is interesting",
        "thats true",
        "thats right",
        "i dont know",
        "idk",
        "not sure",
        "i know",
        "of course",
        "fair enough",
        "good for you",
        "hello",
        "hi",
        "hey",
        "how are you",
        "im good",
        "im fine",
        "good thanks",
        "fine thanks",
    )
)


def words(text: str) -> list[str]:
    """Lower-case words with punctuation, symbols and apostrophes removed: ``data.words.split_words``, the shared
    splitter (each letter of a script written without spaces is a word; combining marks stay in their word)."""
    return split_words(text)


def distinct_n(replies: Sequence[str], n: int) -> float:
    """Distinct word n-grams over all n-grams in ``replies`` (corpus level); 0 when there are none."""
    grams = [tuple(w[i : i + n]) for w in map(words, replies) for i in range(len(w) - n + 1)]
    return len(set(grams)) / len(grams) if grams else 0.0


def copies_context(reply: str, context: str, threshold: float = 0.8) -> bool:
    """Whether the reply is (mostly) a copy of the context: at least 3 words (in Chinese, 3 characters), and at least
    ``threshold`` of its word trigrams occur in the context."""
    w = words(reply)
    if len(w) < 3:
        return False
    c = words(context)
    seen = {tuple(c[i : i + 3]) for i in range(len(c) - 2)}
    grams = [tuple(w[i : i + 3]) for i in range(len(w) - 2)]
    return sum(g in seen for g in grams) / len(grams) >= threshold


def is_generic(reply: str) -> bool:
    """Whether the reply is empty (no word) or a stock phrase that fits any context (``GENERIC_REPLIES``, English)."""
    w = words(reply)
    return not w or " ".join(w) in GENERIC_REPLIES

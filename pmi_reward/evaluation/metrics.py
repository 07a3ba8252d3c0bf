"""Evaluation metrics for scorers: ROC-AUC, rank and linear correlation, MSE, bootstrap CIs, mean ± std.

Thin, NaN-safe wrappers over scipy so every recipe reports the same quantities the same
way: a degenerate input (one class only, a constant vector) gives NaN rather than a warning or a crash,
and bootstrap resampling skips such draws.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.stats import ConstantInputWarning, pearsonr, rankdata, spearmanr

__all__ = ["roc_auc", "spearman", "pearson", "mse", "bootstrap_ci", "mean_std", "Estimate", "format_mean_std"]


def roc_auc(pos: np.ndarray, neg: np.ndarray) -> float:
    """Probability that a positive outscores a negative (ties count half); NaN if either side is empty."""
    pos, neg = np.ravel(pos).astype(np.float64), np.ravel(neg).astype(np.float64)
    if not len(pos) or not len(neg):
        return float("nan")
    # Mann-Whitney U from mid-ranks: equal to sklearn's roc_auc_score, and fast enough to bootstrap
    ranks = rankdata(np.r_[pos, neg])
    return float((ranks[:len(pos)].sum() - len(pos) * (len(pos) + 1) / 2) / (len(pos) * len(neg)))


def _paired(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    x, y = np.asarray(x, dtype=np.float64).ravel(), np.asarray(y, dtype=np.float64).ravel()
    if x.shape != y.shape:
        raise ValueError(f"paired metrics need equal lengths, got {len(x)} and {len(y)}")
    return x, y


def _correlation(fn, x: np.ndarray, y: np.ndarray) -> float:
    x, y = _paired(x, y)
    if len(x) < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return float("nan")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConstantInputWarning)
        return float(fn(x, y)[0])


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman rank correlation; NaN for fewer than 3 points or a constant input."""
    return _correlation(spearmanr, x, y)


def pearson(x: np.ndarray, y: np.ndarray) -> float:
    """Pearson correlation; NaN for fewer than 3 points or a constant input."""
    return _correlation(pearsonr, x, y)


def mse(pred: np.ndarray, target: np.ndarray) -> float:
    """Mean squared error of ``pred`` against ``target``."""
    pred, target = _paired(pred, target)
    return float(np.mean((pred - target) ** 2)) if len(pred) else float("nan")


def bootstrap_ci(statistic: Callable[..., float], *arrays: np.ndarray, n_boot: int = 1000, level: float = 0.95,
                 seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of ``statistic(*arrays)``, resampling rows (axis 0) of all arrays jointly.

    Rows are the independent units: for AUC pass positives (n,) with their negatives (n, K), so a
    positive travels with its own negatives. Draws where the statistic is NaN are skipped.
    """
    if not arrays:
        raise ValueError("bootstrap_ci needs at least one array")
    n = len(arrays[0])
    if any(len(a) != n for a in arrays):
        raise ValueError("all arrays must have the same number of rows")
    if n == 0:
        return float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    values = np.array([statistic(*(a[idx] for a in arrays))
                       for idx in rng.integers(0, n, size=(n_boot, n))], dtype=np.float64)
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
    """``"0.912 ± 0.004"`` over rounds (just the value for one round, ``"–"`` for none)."""
    mean, std = mean_std(values)
    if not np.isfinite(mean):
        return "–"
    finite = int(np.isfinite(np.asarray(values, dtype=np.float64)).sum())
    return f"{mean:.{digits}f}" if finite == 1 else f"{mean:.{digits}f} ± {std:.{digits}f}"


@dataclass(frozen=True)
class Estimate:
    """A point estimate with its bootstrap interval."""

    value: float
    low: float
    high: float

    @classmethod
    def of(cls, statistic: Callable[..., float], *arrays: np.ndarray, n_boot: int = 1000, seed: int = 0) -> "Estimate":
        return cls(statistic(*arrays), *bootstrap_ci(statistic, *arrays, n_boot=n_boot, seed=seed))

    def to_dict(self) -> dict:
        return {"value": self.value, "ci95": [self.low, self.high]}

    def __str__(self) -> str:
        return f"{self.value:.3f} [{self.low:.2f}, {self.high:.2f}]"

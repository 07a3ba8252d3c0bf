"""The bootstrap CI of Spearman's rho sorts x and y once (review 30).

``bootstrap_ci(spearman, x, y)`` re-ranked x and y with scipy for each resample: O(n log n) each, about 3.5
minutes an interval at 200,000 rows. It now sorts them once and takes each resample's mid-ranks from how often it
drew each row, and must give the same draws and the same value of every resample as ranking it did (to float
rounding), with the same NaN resamples (fewer than 3 values, a constant input) skipped, and NaN bounds when the
statistic of the data is not finite.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import resampled_rows

from pmi_reward.evaluation import metrics
from pmi_reward.evaluation.metrics import Estimate, bootstrap_ci, spearman


def ranked_values(x: np.ndarray, y: np.ndarray, n_boot: int, seed: int = 0, groups=None) -> np.ndarray:
    """Every resample's rho as the code before the fix computed it: ``spearman`` (scipy) of the resampled rows."""
    return np.array([spearman(x[idx], y[idx]) for idx in resampled_rows(len(x), n_boot, seed, groups)])


def percentile_ci(values: np.ndarray) -> tuple[float, float]:
    """The interval ``bootstrap_ci`` takes from its resamples' finite values."""
    tail = (1 - 0.95) / 2 * 100
    low, high = np.percentile(values[np.isfinite(values)], [tail, 100 - tail])
    return float(low), float(high)


def tied(n: int, k: int, seed: int, levels: int = 5) -> tuple[np.ndarray, np.ndarray]:
    """Correlated scores on a few levels (ties everywhere), with -0.0 beside 0.0 (one value to ``rankdata``)."""
    rng = np.random.default_rng(seed)
    x = rng.integers(-levels // 2, levels // 2 + 1, (n, k)).astype(np.float64)
    y = np.round(0.5 * x + rng.normal(0, 1, (n, k)))
    x[x == 0] = np.where(rng.random(int((x == 0).sum())) < 0.5, -0.0, 0.0)
    return (x[:, 0], y[:, 0]) if k == 1 else (x, y)


def same(fast: float, slow: float) -> bool:
    """Both NaN, or equal to float rounding."""
    return (np.isnan(fast) and np.isnan(slow)) or abs(fast - slow) < 1e-9


@pytest.mark.parametrize(
    ("n", "k", "levels", "degenerate"),
    [(400, 1, 5, False), (300, 3, 3, False), (6, 1, 3, True), (5, 2, 2, False), (200, 1, 10**9, False)],
)
def test_each_resample_has_the_rho_of_ranking_it(n, k, levels, degenerate):
    """For resamples drawn as ``bootstrap_ci`` draws them, rho from the row weights equals ``spearman`` of the
    resampled rows to 1e-9, with heavy ties, several values per row, and tiny data whose resamples are often
    constant (NaN on both paths)."""
    x, y = tied(n, k, seed=n + k, levels=levels)
    rho = metrics._spearman_of_weights(x, y)
    assert same(rho(np.ones(n, dtype=np.int64)), spearman(x, y))
    nans = 0
    for idx in resampled_rows(n, 300, seed=1):
        fast, slow = rho(np.bincount(idx, minlength=n)), spearman(x[idx], y[idx])
        assert same(fast, slow), (idx, fast, slow)
        nans += np.isnan(slow)
    assert (nans > 0) == degenerate  # the tiny data of one value a row do test the NaN rule


def test_nearly_constant_and_two_value_inputs_keep_spearmans_rules():
    """``spearman`` ranks, so a spread at rounding level is no NaN for it (only Pearson has that rule): the weighted
    path gives the same finite values; two rows drawn of three (a group of one drawn twice) are too few (NaN)."""
    x = 1.0 + np.finfo(np.float64).eps * (np.arange(40) % 3)  # three values a rounding step apart
    y = np.sin(np.arange(40.0))
    rho = metrics._spearman_of_weights(x, y)
    for idx in resampled_rows(40, 200, seed=2):
        assert same(rho(np.bincount(idx, minlength=40)), spearman(x[idx], y[idx]))
    assert np.isfinite(spearman(x, y))
    few = metrics._spearman_of_weights(np.array([1.0, 2.0, 3.0]), np.array([1.0, 3.0, 2.0]))
    assert np.isnan(few(np.array([2, 0, 0])))
    assert few(np.array([0, 2, 2])) == pytest.approx(-1.0) and few(np.array([1, 1, 1])) == pytest.approx(0.5)


@pytest.mark.parametrize("grouped", [False, True])
@pytest.mark.parametrize("k", [1, 3])
def test_bootstrap_of_spearman_matches_ranking_every_resample(grouped, k):
    """The interval ``bootstrap_ci`` gives for ``spearman`` is the one of ranking every resample: the same draws
    (rows, or whole groups of rows) and the same values to rounding; ``Estimate.of`` too."""
    x, y = tied(300, k, seed=20 + k)
    groups = np.random.default_rng(k).integers(0, 120, 300) if grouped else None
    for seed in (7, 0):
        expected = percentile_ci(ranked_values(x, y, 300, seed=seed, groups=groups))
        got = bootstrap_ci(spearman, x, y, n_boot=300, seed=seed, groups=groups)
        assert got == pytest.approx(expected, abs=1e-9, rel=0)
    est = Estimate.of(spearman, x, y, n_boot=300, groups=groups)  # seed 0, the last one above
    assert est.value == spearman(x, y) and (est.low, est.high) == pytest.approx(expected, abs=1e-9, rel=0)


def test_degenerate_resamples_are_skipped_as_before():
    """Tiny tied data (many constant resamples) and groups with a group of one (resamples of 2 rows): the NaN
    resamples are the same ones, so the finite ones, and the interval, are those of ranking each resample."""
    x, y = np.array([0.0, 1.0, 1.0, 2.0, 2.0]), np.array([1.0, 1.0, 2.0, 2.0, 3.0])
    values = ranked_values(x, y, 500, seed=3)
    assert np.isnan(values).sum() > 10
    assert bootstrap_ci(spearman, x, y, n_boot=500, seed=3) == pytest.approx(percentile_ci(values), abs=1e-9, rel=0)
    x, y, groups = np.array([1.0, 2.0, 3.0]), np.array([1.0, 3.0, 2.0]), np.array(["a", "b", "b"])
    values = ranked_values(x, y, 200, seed=4, groups=groups)
    assert np.isnan(values).any() and np.isfinite(values).any()
    got = bootstrap_ci(spearman, x, y, n_boot=200, seed=4, groups=groups)
    assert got == pytest.approx(percentile_ci(values), abs=1e-9, rel=0)


def test_non_finite_data_give_nan_bounds_and_no_weighted_path():
    """A NaN or an infinity makes ``spearman`` of the data NaN, so both bounds are NaN, as before."""
    x, y = tied(100, 1, seed=9)
    for bad in (np.nan, np.inf):
        broken = x.copy()
        broken[4] = bad
        assert np.isnan(bootstrap_ci(spearman, broken, y, n_boot=50)).all()
        assert metrics._spearman_of_weights(broken, y) is None


def test_bootstrap_of_spearman_ranks_once_not_once_per_resample(monkeypatch):
    """The old bootstrap called scipy's ``spearmanr`` once per resample (201 times for 200 resamples); now only the
    point estimate ranks, with the same interval. A wrapper of ``spearman`` still ranks each resample."""
    calls = []
    real = metrics.spearmanr

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    rng = np.random.default_rng(0)
    x = rng.normal(size=2000).astype(np.float32)
    y = np.round(0.3 * x + rng.normal(size=2000), 1)
    groups = rng.integers(0, 1000, 2000)
    expected = percentile_ci(ranked_values(x, y, 200, groups=groups))
    monkeypatch.setattr(metrics, "spearmanr", counted)
    assert bootstrap_ci(spearman, x, y, n_boot=200, groups=groups) == pytest.approx(expected, abs=1e-9, rel=0)
    assert len(calls) == 1
    wrapped = bootstrap_ci(lambda a, b: spearman(a, b), x, y, n_boot=20)
    assert len(calls) == 1 + 1 + 20 and wrapped == pytest.approx(percentile_ci(ranked_values(x, y, 20)), abs=1e-12)

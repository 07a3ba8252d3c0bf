import numpy as np
import pytest

from pmi_reward.evaluation.metrics import (
    Estimate,
    bootstrap_ci,
    format_mean_std,
    mean_std,
    mse,
    pearson,
    roc_auc,
    spearman,
)


def test_roc_auc_known_values():
    assert roc_auc([2.0, 3.0], [0.0, 1.0]) == 1.0
    assert roc_auc([0.0, 1.0], [2.0, 3.0]) == 0.0
    assert roc_auc([1.0, 1.0], [1.0, 1.0]) == 0.5  # ties count half
    # 3 of the 4 (pos, neg) pairs are ordered right: 0.75
    assert roc_auc([0.2, 0.9], [0.1, 0.5]) == pytest.approx(0.75)
    assert np.isnan(roc_auc([], [1.0]))


def test_roc_auc_accepts_negatives_matrix():
    pos = np.array([1.0, 2.0])
    neg = np.array([[0.0, 3.0], [0.5, 1.5]])  # 1 beats 0 and 0.5; 2 beats all but 3
    assert roc_auc(pos, neg) == pytest.approx((2 + 3) / 8)


def test_correlations_and_mse_known_values():
    x = np.arange(10.0)
    assert spearman(x, x**3) == pytest.approx(1.0)
    assert pearson(x, 2 * x + 1) == pytest.approx(1.0)
    assert spearman(x, -x) == pytest.approx(-1.0)
    assert pearson([1.0, 2.0, 3.0], [1.0, 3.0, 2.0]) == pytest.approx(0.5)
    assert mse([1.0, 2.0], [0.0, 4.0]) == pytest.approx(2.5)
    assert np.isnan(spearman(x, np.ones(10)))  # constant input: undefined, not a warning
    with pytest.raises(ValueError):
        pearson([1.0, 2.0], [1.0])


def test_bootstrap_ci_contains_estimate_and_narrows_with_data():
    rng = np.random.default_rng(0)
    small, large = rng.normal(size=(50, 2)), rng.normal(size=(2000, 2))
    small[:, 1] += small[:, 0]
    large[:, 1] += large[:, 0]
    widths = []
    for data in (small, large):
        est = Estimate.of(pearson, data[:, 0], data[:, 1], n_boot=300)
        assert est.low <= est.value <= est.high
        widths.append(est.high - est.low)
    assert widths[1] < widths[0] / 3
    # true correlation 1/sqrt(2): the large-sample interval covers it
    est = Estimate.of(pearson, large[:, 0], large[:, 1], n_boot=300)
    assert est.low < 2**-0.5 < est.high


def test_bootstrap_resamples_rows_jointly_and_is_seeded():
    pos = np.array([1.0, 2.0, 3.0, 4.0])
    neg = pos[:, None] - 0.5  # each positive beats its own negatives
    low, high = bootstrap_ci(lambda p, n: roc_auc(p, n), pos, neg, n_boot=200)
    assert 0.5 < low <= high <= 1.0
    assert bootstrap_ci(np.mean, pos, n_boot=50, seed=3) == bootstrap_ci(np.mean, pos, n_boot=50, seed=3)
    with pytest.raises(ValueError):
        bootstrap_ci(np.mean, pos, neg[:2])


def test_mean_std_and_format():
    assert mean_std([1.0, 3.0]) == pytest.approx((2.0, 2**0.5))
    assert mean_std([5.0]) == (5.0, 0.0)
    assert mean_std([1.0, float("nan"), 3.0])[0] == pytest.approx(2.0)
    assert format_mean_std([0.5, 0.7]) == "0.600 ± 0.141"
    assert format_mean_std([0.5]) == "0.500"
    assert format_mean_std([]) == "–"


def test_format_mean_std_names_the_values_it_left_out():
    """A NaN round or seed is counted out loud: the mean and std are of the finite values, and the text says how many
    are missing (it printed 0.905 ± 0.007 for three seeds, one NaN, beside a seeds column of 3)."""
    nan = float("nan")
    assert format_mean_std([0.9, nan, 0.91]) == "0.905 ± 0.007 (1 of 3 missing)"
    assert format_mean_std([nan, 0.5, nan], digits=2) == "0.50 (2 of 3 missing)"
    assert format_mean_std([nan, nan]) == "–"  # no value at all reads as none
    assert format_mean_std([0.9, 0.91]) == "0.905 ± 0.007"  # finite values: the text of before


def test_bootstrap_ci_of_an_undefined_statistic_is_undefined():
    """A statistic that is NaN on the data (a NaN row) gets NaN bounds, not an interval from the draws that missed
    that row; a statistic that is NaN only on degenerate draws (one class) keeps the finite draws' interval."""
    values = np.random.default_rng(0).normal(size=100)
    values[5] = np.nan
    low, high = bootstrap_ci(np.mean, values, n_boot=200)
    assert np.isnan(low) and np.isnan(high)
    est = Estimate.of(np.mean, values, n_boot=200)
    assert np.isnan(est.value) and np.isnan(est.low) and np.isnan(est.high)
    x = np.arange(5.0)  # 5 rows: some draws repeat one row 5 times (a constant input: NaN), and are skipped
    rho_low, rho_high = bootstrap_ci(spearman, x, x, n_boot=2000)
    assert rho_low == pytest.approx(1.0) and rho_high == pytest.approx(1.0)


def test_roc_auc_matches_sklearn_with_ties():
    from sklearn.metrics import roc_auc_score

    rng = np.random.default_rng(1)
    pos, neg = rng.integers(0, 5, 200).astype(float), rng.integers(0, 4, 300).astype(float)
    expected = roc_auc_score(np.r_[np.ones(200), np.zeros(300)], np.r_[pos, neg])
    assert roc_auc(pos, neg) == pytest.approx(expected, abs=1e-12)

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


def test_bootstrap_over_groups_draws_whole_groups_and_keeps_row_draws_when_every_row_is_its_own():
    """Rows that share a context were resampled one by one: three copies of each row gave an interval about
    sqrt(3) too narrow. Over groups, the copies move together, so they give the interval of the rows once; and with
    every id distinct (the FED file: one reply per context) the draws are the row draws, whatever the ids are."""
    x = np.random.default_rng(0).normal(size=40)
    ids = np.array([f"c{i}" for i in range(40)])  # sorted as text c0, c1, c10, ...: numbered by first appearance
    rows = bootstrap_ci(np.mean, x, n_boot=300)
    assert bootstrap_ci(np.mean, x, n_boot=300, groups=ids) == rows
    assert bootstrap_ci(np.mean, x, n_boot=300, groups=np.arange(40)) == rows
    tripled = np.tile(x, 3)  # each context's three rows are apart in the file: rows 0, 40 and 80 are context c0
    assert bootstrap_ci(np.mean, tripled, n_boot=300, groups=np.tile(ids, 3)) == pytest.approx(rows, abs=1e-12)
    narrow = bootstrap_ci(np.mean, tripled, n_boot=300)
    assert narrow[1] - narrow[0] < 0.7 * (rows[1] - rows[0])
    est = Estimate.of(spearman, tripled, -tripled, n_boot=100, groups=np.tile(ids, 3))
    assert est.value == pytest.approx(-1.0) and est.high == pytest.approx(-1.0)
    with pytest.raises(ValueError, match="groups holds 3 ids for 40 rows"):
        bootstrap_ci(np.mean, x, groups=ids[:3])


def test_evaluate_resamples_contexts_not_rows(spread_scorer):
    """`pmi-reward evaluate` on a file where each context of a dialogue holds several rated rows: its CI is that of
    the contexts (here three copies of each row, under one dialogue key, give the CI of the rows once), not sqrt(3)
    narrower. Without keys the rows were drawn one by one, so a ratings file of several replies per context and no
    key column (USR-style) got that narrower CI: rows that share a context text are now drawn together, as under one
    key. Under other keys (dialogues that open alike) rows are still drawn one by one."""
    from pmi_reward.data.negatives import NegativeSpec
    from pmi_reward.data.pairs import PairSet
    from pmi_reward.evaluation.scorer_report import EvaluateArguments, evaluate_scorer

    contexts = [f"I like topic number {i}.\nTell me more." for i in range(15)]
    replies = [f"Sure, {'very ' * (i % 4)}much about {i * 7 % 15}." for i in range(15)]
    ratings = [float(r) for r in np.random.default_rng(1).permutation(15)]
    args = EvaluateArguments(scorer="tiny", input="pairs.csv", targets=["rating"], n_boot=300, progress=False)
    none = NegativeSpec(0, 0, 0)

    def report(copies: int, keys: list[str] | None) -> dict:
        pairs = PairSet.from_pairs(contexts * copies, replies * copies, keys, extras={"rating": ratings * copies})
        return evaluate_scorer(spread_scorer, pairs, none, args)["rating"]

    once = report(1, [f"d{i}" for i in range(15)])
    thrice = report(3, [f"d{i}" for i in range(15)] * 3)
    keyless = report(3, None)
    apart = report(3, [f"d{i}" for i in range(45)])
    for name in ("spearman", "pearson"):
        # the same texts, embedded in other batches: the scores agree to float32 rounding
        for same in (thrice, keyless):
            assert same[name]["value"] == pytest.approx(once[name]["value"], abs=1e-5)
            assert same[name]["ci95"] == pytest.approx(once[name]["ci95"], abs=1e-5)
        assert thrice[name]["rows"] == keyless[name]["rows"] == apart[name]["rows"] == 45
        assert np.diff(apart[name]["ci95"]) < 0.8 * np.diff(once[name]["ci95"])


def test_bootstrap_draws_one_resample_at_a_time_with_the_draws_of_the_index_matrix():
    """Every resample's indices were drawn at once, an (n_boot, n) int64 matrix (1.5 GiB at 200,000 rows, 1,000
    draws); now one resample at a time, from the same stream: the intervals already recorded do not move."""
    import tracemalloc

    x = np.random.default_rng(0).normal(size=50_000)
    tracemalloc.start()
    bootstrap_ci(np.mean, x, n_boot=200)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 10 * 2**20  # the matrix alone was 200 * 50,000 * 8 bytes = 76 MiB
    tail = (1 - 0.95) / 2 * 100  # as bootstrap_ci computes it (2.500000000000002)
    for n, n_boot, seed in ((7, 50, 0), (375, 300, 3), (1001, 20, 1)):
        y = np.random.default_rng(n).normal(size=n)
        matrix = np.random.default_rng(seed).integers(0, n, size=(n_boot, n))
        expected = np.percentile([np.mean(y[idx]) for idx in matrix], [tail, 100 - tail])
        assert bootstrap_ci(np.mean, y, n_boot=n_boot, seed=seed) == tuple(expected)


def test_correlations_of_non_finite_or_nearly_constant_input_are_nan_without_a_warning():
    """The docstring's promise: a degenerate input gives NaN, not a warning. An infinity made Pearson warn
    (RuntimeWarning) and a spread at rounding level made scipy warn that its coefficient may be inaccurate (it was:
    0.833 for a true 0.866)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for fn in (pearson, spearman):
            assert np.isnan(fn([1.0, 2.0, 3.0, np.inf], [1.0, 2.0, 3.0, 4.0]))
            assert np.isnan(fn([1.0, 2.0, 3.0, 4.0], [1.0, -np.inf, 3.0, 4.0]))
            assert np.isnan(fn([1.0, 2.0, np.nan], [1.0, 2.0, 3.0]))
        assert np.isnan(pearson([1.0, 1.0, 1.0 + 1e-15], [1.0, 2.0, 3.0]))
        assert np.isnan(pearson([1e9, 1e9, 1e9 + 1e-6], [1.0, 2.0, 3.0]))
        assert pearson([0.0, 0.0, 1e-15], [1.0, 2.0, 3.0]) == pytest.approx(3**0.5 / 2)  # small, but not rounding

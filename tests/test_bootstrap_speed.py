"""The bootstrap CI of the ROC-AUC sorts the scores once (review 29, finding 3).

``bootstrap_ci(roc_auc, pos, neg)`` re-ranked every positive and negative for each of its 1,000 resamples: O(n log
n) each, 39 silent minutes after the last progress bar of ``pmi-reward evaluate`` on 200,000 rows. It now sorts
once and scores each resample from how often it drew each row, and must give the same draws and the same AUC of
every resample, to the last bit, as ranking each resample did; a long bootstrap shows a progress bar.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import resampled_rows
from sklearn.metrics import roc_auc_score

from pmi_reward.evaluation import metrics
from pmi_reward.evaluation.metrics import Estimate, bootstrap_ci, roc_auc


def ranked_values(
    pos: np.ndarray, neg: np.ndarray, n_boot: int, seed: int = 0, groups: np.ndarray | None = None
) -> np.ndarray:
    """Every resample's AUC as the code before the fix computed it: the same draws, ``roc_auc`` (mid-ranks of the
    resampled rows) of each resample."""
    assert len(pos) == len(neg)
    return np.array([roc_auc(pos[idx], neg[idx]) for idx in resampled_rows(len(pos), n_boot, seed, groups)])


def percentile_ci(values: np.ndarray) -> tuple[float, float]:
    """The interval ``bootstrap_ci`` takes from its resamples' values."""
    tail = (1 - 0.95) / 2 * 100
    low, high = np.percentile(values[np.isfinite(values)], [tail, 100 - tail])
    return float(low), float(high)


def tied_scores(n: int, k: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """float32 scores on a coarse grid (many ties, between and within the two sides), with infinities and -0.0."""
    rng = np.random.default_rng(seed)
    pos = np.round(rng.normal(0.5, 1, n), 1).astype(np.float32)
    neg = np.round(rng.normal(0, 1, (n, k)), 1).astype(np.float32)
    pos[:3], neg[:2, 0], neg[2, :] = np.inf, -np.inf, 0.0
    pos[3] = -0.0
    return pos, neg


@pytest.mark.parametrize("k", [1, 3, 9])
def test_each_resample_has_the_auc_of_ranking_it_to_the_last_bit(k):
    """For resamples drawn as ``bootstrap_ci`` draws them, the AUC from the row weights equals ``roc_auc`` of the
    resampled rows exactly (``==``), with ties everywhere, and equals sklearn's ``roc_auc_score`` (ties count
    half) to rounding."""
    pos, neg = tied_scores(500, k, seed=k)
    auc = metrics._auc_of_weights(pos, neg)
    rng = np.random.default_rng(0)
    assert auc(np.ones(500, dtype=np.int64)) == roc_auc(pos, neg)
    for _ in range(50):
        idx = rng.integers(0, 500, size=500)
        value = auc(np.bincount(idx, minlength=500))
        assert value == roc_auc(pos[idx], neg[idx])
    labels = np.r_[np.ones(500), np.zeros(500 * k)]
    finite_pos, finite_neg = np.nan_to_num(pos[idx], posinf=1e30), np.nan_to_num(neg[idx], neginf=-1e30)
    assert value == pytest.approx(roc_auc_score(labels, np.r_[finite_pos, finite_neg.ravel()]), abs=1e-12)


@pytest.mark.parametrize("grouped", [False, True])
@pytest.mark.parametrize("k", [1, 4])
def test_bootstrap_of_the_auc_matches_ranking_every_resample(grouped, k):
    """The interval ``bootstrap_ci`` gives for ``roc_auc`` is the one of ranking every resample, exactly: the same
    draws (rows, or whole groups of rows) and the same values. A 1-D negatives array (one per row) too."""
    pos, neg = tied_scores(300, k, seed=10 + k)
    neg = neg[:, 0] if k == 1 else neg
    groups = np.random.default_rng(k).integers(0, 120, 300) if grouped else None
    for seed in (0, 7):
        expected = percentile_ci(ranked_values(pos, neg, 400, seed=seed, groups=groups))
        assert bootstrap_ci(roc_auc, pos, neg, n_boot=400, seed=seed, groups=groups) == expected


def test_bootstrap_of_the_auc_sorts_once_not_once_per_resample(monkeypatch):
    """The old bootstrap called ``rankdata`` once per resample (201 times for 200 resamples); now only the point
    estimate ranks. Random scores as the scorer gives them, rows drawn in groups (contexts) as ``evaluate`` does."""
    calls = []
    real = metrics.rankdata

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(metrics, "rankdata", counted)
    rng = np.random.default_rng(0)
    pos, neg = rng.normal(1, 1, 2000).astype(np.float32), rng.normal(0, 1, (2000, 9)).astype(np.float32)
    groups = rng.integers(0, 1000, 2000)
    monkeypatch.setattr(metrics, "rankdata", real)
    expected = percentile_ci(ranked_values(pos, neg, 200, groups=groups))
    monkeypatch.setattr(metrics, "rankdata", counted)
    assert bootstrap_ci(roc_auc, pos, neg, n_boot=200, groups=groups) == expected
    assert len(calls) == 1


def test_other_statistics_and_undefined_aucs_still_resample_rows():
    """Only ``roc_auc`` itself takes the sorted path: a wrapper of it (the study's mean over rounds) or another
    statistic resamples rows as before, with the same result; a NaN score still gives a NaN interval."""
    pos, neg = tied_scores(200, 3, seed=5)
    wrapped = bootstrap_ci(lambda p, q: roc_auc(p, q), pos, neg, n_boot=100)
    assert wrapped == bootstrap_ci(roc_auc, pos, neg, n_boot=100) == percentile_ci(ranked_values(pos, neg, 100))
    with_nan = pos.copy()
    with_nan[5] = np.nan
    assert np.isnan(bootstrap_ci(roc_auc, with_nan, neg, n_boot=50)).all()
    assert metrics._auc_of_weights(with_nan, neg) is None
    assert metrics._auc_of_weights(pos, neg[:, :0]) is None


def test_a_long_bootstrap_shows_a_progress_bar_and_a_short_one_does_not(capsys, monkeypatch):
    """``progress=True`` draws a bar for a bootstrap of at least ``_LONG_BOOTSTRAP`` rows × resamples (on stderr,
    gone when done), none for a shorter one or without ``progress``; the values do not change."""
    pos, neg = tied_scores(100, 2, seed=3)
    quiet = bootstrap_ci(roc_auc, pos, neg, n_boot=50)
    assert capsys.readouterr().err == ""
    assert bootstrap_ci(roc_auc, pos, neg, n_boot=50, progress=True) == quiet  # 5,000 rows × resamples: short
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(metrics, "_LONG_BOOTSTRAP", 5000)
    assert Estimate.of(roc_auc, pos, neg, n_boot=50, progress=True).low == quiet[0]
    err = capsys.readouterr().err
    assert "bootstrap roc_auc" in err and "resample" in err
    bootstrap_ci(roc_auc, pos, neg, n_boot=50, progress=False)
    assert capsys.readouterr().err == ""


def test_evaluate_passes_its_progress_flag_to_the_bootstrap(spread_scorer, capsys, monkeypatch):
    """``pmi-reward evaluate --progress`` (the default) shows the bootstrap's bar too; ``--progress false`` does
    not. A file with random negatives, its AUC bootstrapped."""
    from pmi_reward.data.negatives import NegativeSpec
    from pmi_reward.data.pairs import PairSet
    from pmi_reward.evaluation.scorer_report import EvaluateArguments, evaluate_scorer

    monkeypatch.setattr(metrics, "_LONG_BOOTSTRAP", 1, raising=False)  # fail on the bar, not here, without it
    contexts = [f"I like topic number {i}.\nTell me more." for i in range(12)]
    replies = [f"Sure, {'very ' * (i % 4)}much about {i * 7 % 12}." for i in range(12)]
    pairs = PairSet.from_pairs(contexts, replies, [f"d{i}" for i in range(12)])
    spec = NegativeSpec(k_random=2, k_context=0)
    shown = {}
    for progress in (True, False):
        args = EvaluateArguments(scorer="tiny", input="pairs.csv", n_boot=40, progress=progress)
        report = evaluate_scorer(spread_scorer, pairs, spec, args)
        shown[progress] = "bootstrap roc_auc" in capsys.readouterr().err
        assert np.isfinite(report["auc"]["ci95"]).all()
    assert shown == {True: True, False: False}

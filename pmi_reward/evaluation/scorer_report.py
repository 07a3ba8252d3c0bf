"""How good is a saved scorer on a pair file? ROC-AUC against seeded negatives and correlations, with 95% CIs.

Scores every (context, response) row; with a non-empty negative mix, also scores seeded negatives and reports
the ROC-AUC of the rows against them (overall and per kind); against ``targets`` columns (e.g. human ratings)
it reports Spearman and Pearson; against ``pmi_columns`` (``p_xy p_x p_y`` of a synthetic file) Spearman,
Pearson and MSE with the analytic PMI. ``pmi-reward evaluate`` prints the result.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..data.negatives import NegativeSpec
from ..data.pairs import PairSet
from ..data.records import DataError
from ..data.synthetic import true_pmi
from ..scoring.scorer import PMIScorer
from ..training.fit import score_with_negatives
from .metrics import Estimate, mse, pearson, roc_auc, spearman

__all__ = ["EvaluateArguments", "evaluate_scorer"]


@dataclass
class EvaluateArguments:
    """The scorer, the pair file and what to compare with (the negatives' mix is a ``NegativeSpec``)."""

    scorer: str = field(metadata={"help": "a directory written by `pmi-reward train`"})
    input: str = field(metadata={"help": "CSV/TSV/JSONL/JSON pair file"})
    context_column: str = "context"
    response_column: str = "response"
    key_column: str = field(default="dialog_key", metadata={"help": "dialogue id column (in-dialogue negatives)"})
    targets: list[str] = field(default_factory=list, metadata={"help": "columns to correlate with (e.g. ratings)"})
    pmi_columns: list[str] = field(default_factory=list, metadata={"help": "p_xy p_x p_y: compare with true PMI"})
    n_boot: int = 1000
    seed: int = 0
    no_cache: bool = False
    progress: bool = True
    output: str | None = field(default=None, metadata={"help": "also write the report to this .json file"})
    overwrite: bool = field(default=False, metadata={"help": "replace --output if it exists"})


def _numeric(values: list, name: str, path: str) -> np.ndarray:
    out = np.array([v if isinstance(v, float) else np.nan for v in values], dtype=np.float64)
    if not np.isfinite(out).any():
        raise DataError(f"{path}: column {name!r} has no numeric values")
    return out


def evaluate_scorer(scorer: PMIScorer, pairs: PairSet, negatives: NegativeSpec, args: EvaluateArguments) -> dict:
    """The report: rows, mean score, AUC (overall and per kind of negative), correlations, fit to true PMI."""
    if args.pmi_columns and len(args.pmi_columns) != 3:
        raise ValueError("pmi_columns takes three columns: p_xy p_x p_y")
    pos, neg = score_with_negatives(scorer, pairs, negatives if negatives.k else None, args.seed, args.progress)
    report: dict = {"rows": len(pairs), "mean_score": float(pos.mean())}

    def estimate(fn: Callable[..., float], *arrays: np.ndarray) -> dict:
        keep = np.all([np.isfinite(a.reshape(len(a), -1)).all(1) for a in arrays], axis=0)
        return {
            **Estimate.of(fn, *(a[keep] for a in arrays), n_boot=args.n_boot, seed=args.seed).to_dict(),
            "rows": int(keep.sum()),
        }

    if neg is not None:
        report["auc"] = estimate(roc_auc, pos, neg)
        start = 0
        for kind, k in negatives.counts().items():
            if k and k < neg.shape[1]:
                report[f"auc_{kind}"] = estimate(roc_auc, pos, neg[:, start : start + k])
            start += k
    extras = pairs.extras or {}
    for column in args.targets:
        y = _numeric(extras[column], column, args.input)
        report[column] = {"spearman": estimate(spearman, pos, y), "pearson": estimate(pearson, pos, y)}
    if args.pmi_columns:
        truth = true_pmi(*(_numeric(extras[c], c, args.input) for c in args.pmi_columns))
        named: Sequence[tuple[str, Callable[..., float]]] = (("spearman", spearman), ("pearson", pearson), ("mse", mse))
        report["true_pmi"] = {name: estimate(fn, pos, truth) for name, fn in named}
    return report

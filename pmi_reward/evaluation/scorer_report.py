"""How good is a saved scorer on a pair file? ROC-AUC against seeded negatives and correlations, with 95% CIs.

Scores every (context, response) row; with a non-empty negative mix, also scores seeded negatives and reports
the ROC-AUC of the rows against them (overall and per kind); against ``targets`` columns (e.g. human ratings)
it reports Spearman and Pearson; against ``pmi_columns`` (``p_xy p_x p_y`` of a synthetic file) Spearman,
Pearson and MSE with the analytic PMI. The CIs resample contexts: rows that share a dialogue key and a context
(several rated replies to one) are drawn together, and in a file without keys rows that share a context text.
``pmi-reward evaluate`` prints the result.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..data.negatives import NegativeSpec
from ..data.pairs import PairSet
from ..data.records import DataError
from ..data.synthetic import true_pmi
from ..scoring.models import NO_CACHE_HELP
from ..scoring.scorer import DEFAULT_SCORER, PMIScorer
from ..training.fit import check_negative_draws, score_with_negatives
from .metrics import Estimate, mse, pearson, roc_auc, spearman

__all__ = ["EvaluateArguments", "evaluate_scorer", "evaluation_columns"]


@dataclass
class EvaluateArguments:
    """The pair file, the scorer (``DEFAULT_SCORER``, as ``score``, ``rerank`` and ``serve`` default to) and what
    to compare with (the negatives' mix is a ``NegativeSpec``)."""

    input: str = field(metadata={"help": "CSV/TSV/JSONL/JSON pair file"})
    scorer: str = field(
        default=DEFAULT_SCORER,
        metadata={
            "help": "a directory written by `pmi-reward train`, or a Hub repo id org/name; by default the recommended "
            "scorer, where `pmi-reward train --config scorer/recommended` (or `make scorer` in a checkout) saves it"
        },
    )
    context_column: str = field(
        default="context", metadata={"help": "--input's context column (turns one per line, oldest first)"}
    )
    response_column: str = field(default="response", metadata={"help": "--input's response column"})
    key_column: str = field(
        default="dialog_key",
        metadata={
            "help": "dialogue id column (in-dialogue negatives); the CIs resample contexts of a dialogue (rows that "
            "share a key and a context are drawn together) or, in a file without it, contexts (rows that share a "
            "context text)"
        },
    )
    targets: list[str] = field(default_factory=list, metadata={"help": "columns to correlate with (e.g. ratings)"})
    pmi_columns: list[str] = field(default_factory=list, metadata={"help": "p_xy p_x p_y: compare with true PMI"})
    context_turns: int | None = field(
        default=None,
        metadata={
            "help": "newest context lines (turns) scored: default as the scorer was trained (its config's "
            "context_turns), as PMIReward reads them; 0 scores every line (how evaluate read them before 2026-11-28)"
        },
    )
    n_boot: int = field(default=1000, metadata={"help": "bootstrap resamples for each 95%% confidence interval"})
    seed: int = field(default=0, metadata={"help": "seed for the negatives' draw and the bootstrap"})
    no_cache: bool = field(default=False, metadata={"help": NO_CACHE_HELP})
    progress: bool = field(default=True, metadata={"help": "show progress bars"})
    output: str | None = field(default=None, metadata={"help": "also write the report to this .json file"})
    overwrite: bool = field(default=False, metadata={"help": "replace --output if it exists"})

    def __post_init__(self) -> None:
        if self.n_boot < 0:  # checked before the scorer loads, not after every row is scored
            raise ValueError(f"n_boot must be >= 0, got {self.n_boot}")
        if self.context_turns is not None and self.context_turns < 0:
            raise ValueError(f"context_turns must be >= 0 (0: every line), got {self.context_turns}")


MISSING = ("", "na", "n/a", "null", "none")  # cells that say "no value" (case and spaces aside; "nan" reads as NaN)


def _numeric(values: list, name: str, path: str, positive: bool = False) -> np.ndarray:
    """A column as floats, NaN where a value is missing (None, NaN or a ``MISSING`` cell: those rows are left out
    of its metrics, and the report counts the rows kept). Any other value that is not a finite number (text,
    infinity; with ``positive``, a number <= 0, whose log is undefined) is a DataError naming its row: a row is
    never dropped silently."""
    out = np.full(len(values), np.nan)
    for row, value in enumerate(values, 1):
        if value is None or (isinstance(value, str) and value.strip().lower() in MISSING):
            continue
        if isinstance(value, float) and math.isnan(value):
            continue
        if not isinstance(value, float) or not math.isfinite(value) or (positive and value <= 0):
            kind = "a positive number" if positive else "a number"
            raise DataError(f"{path}, row {row}, field {name!r}: {value!r} is not {kind} (leave it blank if unknown)")
        out[row - 1] = value
    if not np.isfinite(out).any():
        raise DataError(f"{path}: column {name!r} has no numeric values")
    return out


def evaluation_columns(
    pairs: PairSet, negatives: NegativeSpec, args: EvaluateArguments
) -> tuple[dict[str, np.ndarray], np.ndarray | None]:
    """The ``targets`` columns and the true PMI of ``pmi_columns`` (None without them) as numbers, once the pairs
    are known to give the negatives' mix: whatever is wrong with the input file, found before a scorer is loaded
    or anything is scored."""
    if args.pmi_columns and len(args.pmi_columns) != 3:
        raise ValueError("pmi_columns takes three columns: p_xy p_x p_y")
    extras = pairs.extras or {}
    targets = {column: _numeric(extras[column], column, args.input) for column in args.targets}
    truth = None
    if args.pmi_columns:
        truth = true_pmi(*(_numeric(extras[c], c, args.input, positive=True) for c in args.pmi_columns))
    check_negative_draws(pairs, negatives, args.input)
    return targets, truth


def evaluate_scorer(scorer: PMIScorer, pairs: PairSet, negatives: NegativeSpec, args: EvaluateArguments) -> dict:
    """The report: rows, mean score, AUC (overall and per kind of negative), correlations, fit to true PMI."""
    targets, truth = evaluation_columns(pairs, negatives, args)
    pos, neg = score_with_negatives(scorer, pairs, negatives if negatives.k else None, args.seed, args.progress)
    report: dict = {"rows": len(pairs), "mean_score": float(pos.mean())}

    # one id per (dialogue, context); without keys each row is a dialogue of its own, so one per context text: the
    # rated replies to one context are not independent draws (drawn one by one, their CI was too narrow), and
    # unrelated rows that open alike ("Hi!") drawn together only widen it
    units = pairs.group * (int(pairs.ctx.max(initial=0)) + 1) + pairs.ctx if pairs.keyed else pairs.ctx

    def estimate(fn: Callable[..., float], *arrays: np.ndarray) -> dict:
        """``fn`` on the rows where every array is finite; the bootstrap resamples contexts of a dialogue (rows that
        share a dialogue key and a context text; without keys, rows that share a context text), so that the replies
        rated for one context move together, while rows of other dialogues that open alike ("Hi!") are drawn one by
        one."""
        keep = np.all([np.isfinite(a.reshape(len(a), -1)).all(1) for a in arrays], axis=0)
        kept = (a[keep] for a in arrays)
        return {
            **Estimate.of(
                fn, *kept, n_boot=args.n_boot, seed=args.seed, groups=units[keep], progress=args.progress
            ).to_dict(),
            "rows": int(keep.sum()),
        }

    if neg is not None:
        report["auc"] = estimate(roc_auc, pos, neg)
        start = 0
        for kind, k in negatives.counts().items():
            if k and k < neg.shape[1]:
                report[f"auc_{kind}"] = estimate(roc_auc, pos, neg[:, start : start + k])
            start += k
    for column, y in targets.items():
        report[column] = {"spearman": estimate(spearman, pos, y), "pearson": estimate(pearson, pos, y)}
    if truth is not None:
        named: Sequence[tuple[str, Callable[..., float]]] = (("spearman", spearman), ("pearson", pearson), ("mse", mse))
        report["true_pmi"] = {name: estimate(fn, pos, truth) for name, fn in named}
    return report

"""``pmi-reward evaluate``: how good is a saved scorer on a pair file? AUC and correlations, with 95% CIs.

Scores every (context, response) row; with a negative mix, also scores seeded negatives and reports the
ROC-AUC of the rows against them (overall and per kind); with ``--targets`` (e.g. human ratings)
reports Spearman and Pearson against each column; with ``--pmi_columns p_xy p_x p_y`` (synthetic
files) reports Spearman, Pearson and MSE against the analytic PMI. Prints one JSON object.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np
from trl import TrlParser

from ..data.negatives import NegativeSpec
from ..data.pairs import load_pairs
from ..data.records import DataError
from ..data.synthetic import true_pmi
from ..evaluation.metrics import Estimate, mse, pearson, roc_auc, spearman
from ..scoring.cache import EmbeddingCache
from ..scoring.models import cache_root
from ..scoring.scorer import PMIScorer
from ..training.fit import score_with_negatives


@dataclass
class EvaluateArguments:
    scorer: str = field(metadata={"help": "a directory written by `pmi-reward train`"})
    input: str = field(metadata={"help": "CSV/TSV/JSONL/JSON pair file"})
    context_column: str = "context"
    response_column: str = "response"
    key_column: str = field(default="dialog_key", metadata={"help": "dialogue id column (in-dialogue negatives)"})
    k_random: int = field(default=5, metadata={"help": "random negatives per row for the AUC (0 with the others: "
                                                        "no AUC)"})
    k_in_dialogue: int = 0
    k_context: int = 0
    targets: list[str] = field(default_factory=list, metadata={"help": "columns to correlate with (e.g. ratings)"})
    pmi_columns: list[str] = field(default_factory=list, metadata={"help": "p_xy p_x p_y: compare with true PMI"})
    n_boot: int = 1000
    seed: int = 0
    no_cache: bool = False
    progress: bool = True


def _numeric(values: list, name: str, path: str) -> np.ndarray:
    out = np.array([v if isinstance(v, float) else np.nan for v in values], dtype=np.float64)
    if not np.isfinite(out).any():
        raise DataError(f"{path}: column {name!r} has no numeric values")
    return out


def main(argv: list[str] | None = None) -> int:
    (args,) = TrlParser((EvaluateArguments,), prog="pmi-reward evaluate").parse_args_and_config(argv)
    if args.pmi_columns and len(args.pmi_columns) != 3:
        raise SystemExit("--pmi_columns takes three columns: p_xy p_x p_y")
    pairs = load_pairs(args.input, args.context_column, args.response_column, args.key_column or None,
                       [*args.targets, *args.pmi_columns])
    scorer = PMIScorer.from_pretrained(args.scorer, cache_dir=None if args.no_cache else cache_root() / "embeddings")
    counts = (args.k_random, args.k_in_dialogue, args.k_context)
    spec = NegativeSpec(*counts) if sum(counts) else None
    pos, neg = score_with_negatives(scorer, pairs, spec, args.seed, args.progress)
    report: dict = {"rows": len(pairs), "mean_score": float(pos.mean())}

    def estimate(fn, *arrays) -> dict:
        keep = np.all([np.isfinite(a.reshape(len(a), -1)).all(1) for a in arrays], axis=0)
        return {**Estimate.of(fn, *(a[keep] for a in arrays), n_boot=args.n_boot, seed=args.seed).to_dict(),
                "rows": int(keep.sum())}

    if neg is not None:
        report["auc"] = estimate(roc_auc, pos, neg)
        start = 0
        for kind, k in zip(("random", "in_dialogue", "in_context"), counts):
            if k and k < neg.shape[1]:
                report[f"auc_{kind}"] = estimate(roc_auc, pos, neg[:, start:start + k])
            start += k
    for column in args.targets:
        y = _numeric(pairs.extras[column], column, args.input)
        report[column] = {"spearman": estimate(spearman, pos, y), "pearson": estimate(pearson, pos, y)}
    if args.pmi_columns:
        truth = true_pmi(*(_numeric(pairs.extras[c], c, args.input) for c in args.pmi_columns))
        report["true_pmi"] = {name: estimate(fn, pos, truth)
                              for name, fn in (("spearman", spearman), ("pearson", pearson), ("mse", mse))}
    print(json.dumps({"scorer": args.scorer, "input": args.input, **report}, indent=2))
    return 0

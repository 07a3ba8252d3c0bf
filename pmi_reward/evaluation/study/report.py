"""Study reports: metrics over rounds with bootstrap intervals and the paper's rows (tables and plots are
``pmi_reward.evaluation.report``'s).

A cell reads ``mean ± std`` over rounds, then the 95% bootstrap interval of that mean over evaluation
rows (rows resampled once for all rounds, so the interval reflects the finite evaluation set).
"""

from __future__ import annotations

import csv
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from ..metrics import bootstrap_ci, format_mean_std
from .methods import MethodScores

__all__ = ["METHOD_NAMES", "paper_method", "cell", "cell_text", "read_paper_table", "group_runs", "run_label"]

# our method names -> the paper's (its tables add _Pair / _Prompt)
METHOD_NAMES = {
    "nwj": "PMI",
    "mine": "MINE",
    "infonce": "InfoNCE",
    "kde": "KDE",
    "meep": "Direct_MEEP",
    "js": "JS",
    "chi2": "Chi2",
    "hellinger": "Hellinger",
    "tv": "TV",
}


def paper_method(method: str, input_mode: str) -> str:
    """The paper's name for a method row, e.g. ``PMI_Pair``."""
    name = METHOD_NAMES.get(method, method)
    return name if input_mode == "text" else f"{name}_{input_mode.capitalize()}"


def run_label(run: MethodScores) -> str:
    rounds = "avg of rounds" if run.round < 0 else ""
    return " ".join(x for x in (paper_method(run.method, run.input_mode), rounds) if x)


def group_runs(runs: Sequence[MethodScores]) -> dict[tuple[str, str, str, bool], list[MethodScores]]:
    """Runs grouped by (encoder, method, input mode, is-average), rounds in order."""
    groups: dict[tuple[str, str, str, bool], list[MethodScores]] = {}
    for run in sorted(runs, key=lambda r: r.round):
        groups.setdefault((run.encoder, run.method, run.input_mode, run.round < 0), []).append(run)
    return groups


def cell(
    statistic: Callable[..., float], per_round: Sequence[Sequence[np.ndarray]], n_boot: int = 1000, seed: int = 0
) -> dict:
    """A metric over rounds: per-round values, ``mean ± std``, and the bootstrap CI of the mean.

    ``per_round[r]`` are the arrays ``statistic`` takes for round r (rows on axis 0, same rows in every
    round); rows where any array is NaN (e.g. not scored by a subset-only method) are dropped.
    """
    keep = np.ones(len(per_round[0][0]), dtype=bool)
    for arrays in per_round:
        for a in arrays:
            keep &= np.isfinite(np.asarray(a, dtype=np.float64).reshape(len(a), -1)).all(1)
    values = [statistic(*(a[keep] for a in arrays)) for arrays in per_round]
    stacked = [np.stack([arrays[j][keep] for arrays in per_round], axis=1) for j in range(len(per_round[0]))]

    def mean_over_rounds(*cols: np.ndarray) -> float:
        return float(np.nanmean([statistic(*(c[:, r] for c in cols)) for r in range(len(per_round))]))

    low, high = bootstrap_ci(mean_over_rounds, *stacked, n_boot=n_boot, seed=seed) if keep.sum() > 2 else (np.nan,) * 2
    return {"rounds": values, "text": format_mean_std(values), "ci95": [low, high], "rows": int(keep.sum())}


def cell_text(c: dict, with_ci: bool = True) -> str:
    if not with_ci or not np.isfinite(c["ci95"][0]):
        return c["text"]
    return f"{c['text']} [{c['ci95'][0]:.2f}, {c['ci95'][1]:.2f}]"


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(str(x) for x in row) + " |" for row in rows]
    return "\n".join(lines)


def read_paper_table(path: str | Path) -> list[dict]:
    """Rows of one of the paper's result tables (``paper_tables/*.csv``); missing file: no rows."""
    path = Path(path)
    if not path.is_file():
        return []
    with path.open(newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))

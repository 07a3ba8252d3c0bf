"""Study reports: metrics over rounds with bootstrap intervals, markdown tables, the paper's rows, plots.

A cell reads ``mean ± std`` over rounds, then the 95% bootstrap interval of that mean over evaluation
rows (rows resampled once for all rounds, so the interval reflects the finite evaluation set).
"""

from __future__ import annotations

import csv
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from ..metrics import bootstrap_ci, format_mean_std
from .methods import MethodScores

__all__ = ["provenance", "METHOD_NAMES", "paper_method", "cell", "markdown_table", "read_paper_table", "scatter_plot",
           "bar_plot", "group_runs", "run_label"]

# our method names -> the paper's (its tables add _Pair / _Prompt)
METHOD_NAMES = {"nwj": "PMI", "mine": "MINE", "infonce": "InfoNCE", "kde": "KDE", "meep": "Direct_MEEP",
                "js": "JS", "chi2": "Chi2", "hellinger": "Hellinger", "tv": "TV"}


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


def cell(statistic: Callable[..., float], per_round: Sequence[Sequence[np.ndarray]], n_boot: int = 1000,
         seed: int = 0) -> dict:
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


def provenance() -> str:
    """Command, code version and machine of this run, for the top of a results file."""
    import torch

    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                timeout=10).stdout.strip() or "unknown"
    except OSError:
        commit = "unknown"
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    machine = (f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPU cores "
               f"(torch threads {torch.get_num_threads()}), {gpu}")
    command = " ".join(["python", *sys.argv])
    return (f"Command: `{command}`  \nCommit: `{commit}`; machine: {machine}; "
            f"finished {time.strftime('%Y-%m-%d %H:%M %Z')}.")


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


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def scatter_plot(path: str | Path, x: np.ndarray, y: np.ndarray, title: str, xlabel: str = "true PMI",
                 ylabel: str = "estimated PMI") -> None:
    """Estimated against true values with the identity line (one PNG)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(4.2, 4.2))
    ax.scatter(x, y, s=6, alpha=0.35)
    finite = np.isfinite(y)
    lo = float(min(np.min(x), np.min(y[finite]) if finite.any() else 0))
    hi = float(max(np.max(x), np.max(y[finite]) if finite.any() else 0))
    ax.plot([lo, hi], [lo, hi], "k--", lw=1, label="identity")
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    ax.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def bar_plot(path: str | Path, labels: Sequence[str], values: Sequence[float], errors: Sequence[float],
             title: str, ylabel: str, reference: dict[str, float] | None = None) -> None:
    """Horizontal bars with error bars, and optional reference lines (e.g. the paper's numbers)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 0.32 * len(labels) + 1.2))
    ax.barh(range(len(labels)), values, xerr=errors, color="#4c72b0", alpha=0.85)
    ax.set_yticks(range(len(labels)), labels, fontsize=7)
    for i, (name, value) in enumerate((reference or {}).items()):
        ax.axvline(value, color=f"C{i + 1}", ls="--", lw=1, label=name)
    if reference:
        ax.legend(fontsize=7, loc="lower right")
    ax.set(title=title, xlabel=ylabel)
    ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)

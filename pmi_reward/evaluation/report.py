"""How results are shown: markdown tables, the provenance line of a results file, and plots (PNG, no display).

Every recipe and report writes its tables with ``markdown_table`` and its plots with the functions here.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

__all__ = ["markdown_table", "provenance", "scatter_plot", "bar_plot", "plot_distributions"]


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A GitHub markdown table: a header row, a rule, one line per row."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(str(x) for x in row) + " |" for row in rows]
    return "\n".join(lines)


def provenance() -> str:
    """Command, code version and machine of this run, for the top of a results file."""
    import torch

    try:
        commit = (
            subprocess.run(
                ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10
            ).stdout.strip()
            or "unknown"
        )
    except OSError:
        commit = "unknown"
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    machine = (
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPU cores "
        f"(torch threads {torch.get_num_threads()}), {gpu}"
    )
    command = " ".join(["python", *sys.argv])
    return (
        f"Command: `{command}`  \nCommit: `{commit}`; machine: {machine}; "
        f"finished {time.strftime('%Y-%m-%d %H:%M %Z')}."
    )


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def scatter_plot(
    path: str | Path, x: np.ndarray, y: np.ndarray, title: str, xlabel: str = "true PMI", ylabel: str = "estimated PMI"
) -> None:
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


def bar_plot(
    path: str | Path,
    labels: Sequence[str],
    values: Sequence[float],
    errors: Sequence[float],
    title: str,
    ylabel: str,
    reference: dict[str, float] | None = None,
) -> None:
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


def plot_distributions(scores: dict[str, list], path: str | Path) -> Path:
    """Overlaid histograms of reply PMI per policy (evaluation scorer). With no score at all (the judge scored no
    reply) the plot is drawn empty and says so: a run's report is written before it and must not end in an error."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    flat = {name: np.ravel(np.asarray(v, dtype=float)) for name, v in scores.items()}
    flat = {name: v for name, v in flat.items() if len(v)}
    if flat:
        lo, hi = min(v.min() for v in flat.values()), max(v.max() for v in flat.values())
        bins = np.linspace(lo, hi if hi > lo else lo + 1, 40)
        for name, values in flat.items():
            ax.hist(values, bins=bins, alpha=0.45, label=f"{name} (mean {values.mean():+.2f})")
        ax.legend()
    else:
        ax.text(0.5, 0.5, "no scored reply", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("PMI of reply (nats, evaluation scorer)")
    ax.set_ylabel("replies")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)

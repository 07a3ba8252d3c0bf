"""Do the judges agree on which reply is better? Among the base's own replies to a context (``--base_samples`` draws
of it), the one a SELECTOR judge scores highest, read by an EVALUATOR judge: its gain over the evaluator's mean of
all the context's replies, with a bootstrap CI over contexts. This is what a policy that picked, every time, the
selector's favourite of the base's replies would gain by the evaluator: by another judge, the most that choosing by
the selector can show; by the selector itself, an upper bound read with the selection's own luck (winner's curse).
Beside it, the mean over contexts of the two judges' Spearman correlation between a context's replies.

python recipes/smollm2-135m/judge_agreement.py outputs/eval/tune/protocol17/samples.jsonl
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from scipy.stats import spearmanr

from pmi_reward.data.records import read_records
from pmi_reward.evaluation.metrics import bootstrap_ci
from pmi_reward.evaluation.report import markdown_table
from pmi_reward.policy.samples import judge_scores

sys.path.append(str(Path(__file__).resolve().parents[1]))  # recipes/: the scripts' shared input check (run by path)
from recipe_inputs import require_samples  # noqa: E402


def base_grid(rows: list[dict], policy: str = "base") -> dict[str, np.ndarray]:
    """Per judge, the (contexts, replies) PMI of ``policy``'s replies (every context with as many replies)."""
    if not rows:
        raise ValueError("no samples")
    judges = sorted(rows[0][policy][0]["pmi"])
    widths = {len(r[policy]) for r in rows}
    if len(widths) != 1 or widths == {1}:
        raise ValueError(f"{policy} needs the same number (>= 2) of replies per context, got {sorted(widths)}")
    return {j: judge_scores(rows, policy, j) for j in judges}


def pick_gain(selector: np.ndarray, evaluator: np.ndarray) -> np.ndarray:
    """Per context: the evaluator's score of the selector's top reply minus the evaluator's mean over the replies.
    A reply the selector left unscored (NaN) is never its pick (np.argmax would take the first NaN); NaN where the
    evaluator left any of the context's replies unscored (its mean would read other replies) or the selector all."""
    top = np.argmax(np.where(np.isnan(selector), -np.inf, selector), axis=1)
    gain = evaluator[np.arange(len(evaluator)), top] - evaluator.mean(1)
    return np.where(np.isnan(selector).all(1), np.nan, gain)


def within_spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Mean over contexts of the Spearman correlation of two judges' scores of that context's replies (contexts
    where either judge gives every reply one score, or left any reply unscored, are left out)."""
    values = [
        spearmanr(x, y).statistic
        for x, y in zip(a, b, strict=True)
        if not (np.isnan(x).any() or np.isnan(y).any()) and np.ptp(x) > 0 and np.ptp(y) > 0
    ]
    return float(np.mean(values)) if values else float("nan")


def _ci(gain: np.ndarray) -> str:
    """The mean gain with its bootstrap CI over the contexts that have one ("–" without any)."""
    gain = gain[~np.isnan(gain)]
    if not gain.size:
        return "–"
    low, high = bootstrap_ci(np.mean, gain)
    return f"{gain.mean():+.2f} [{low:+.2f}, {high:+.2f}]"


def agreement(path: Path, policy: str = "base") -> str:
    """The table: every (selector, evaluator) pair of judges."""
    grid = base_grid(read_records(path), policy)
    rows = []
    for sel in grid:
        for ev in grid:
            rho = "" if sel == ev else f"{within_spearman(grid[sel], grid[ev]):+.2f}"
            rows.append([sel, ev, _ci(pick_gain(grid[sel], grid[ev])), rho])
    n, k = next(iter(grid.values())).shape
    text = f"{n} contexts, {k} replies of {policy} each"
    unscored = {j: int(np.isnan(g).any(1).sum()) for j, g in grid.items()}
    if any(unscored.values()):
        counts = ", ".join(f"{j} {c}" for j, c in unscored.items() if c)
        text += (
            f"; contexts with a reply left unscored (null), by judge: {counts} (a context counts out of a pair's "
            "gain where its evaluator left any of its replies unscored or its selector all, and out of its Spearman "
            "where either left any)"
        )
    header = ["selector", "evaluator", "evaluator's gain of the selector's pick [95% CI]", "within-context Spearman"]
    return f"{text}\n\n" + markdown_table(header, rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("samples", type=Path, help="an evaluation's samples.jsonl with several base replies a context")
    parser.add_argument("--policy", default="base", help="whose replies to choose among")
    args = parser.parse_args()
    require_samples(parser.prog, [args.samples])
    print(agreement(args.samples, args.policy))


if __name__ == "__main__":
    main()

"""How lucky the base's replies were: every tuning trial's gain is measured against ONE draw of the base's replies
(the evaluation's seed), so a draw that happened to score low on those contexts lifts every trial's gain alike.
This compares that draw with a fresh draw of the same base model on the same contexts (another ``evaluate-policy``
run, another ``--seed``, as many ``--samples`` as wanted): per judge, the mean over contexts of the fresh draw's mean
PMI minus the fixed draw's, with a bootstrap CI over contexts. A difference above 0 is a "gain" that every trial
judged against the fixed draw receives for nothing.

python recipes/smollm2-135m/base_draw.py outputs/eval/tune/dpo-j/samples.jsonl \
    outputs/eval/tune/base-redraw/samples.jsonl
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from pmi_reward.data.records import read_records
from pmi_reward.evaluation.metrics import bootstrap_ci, row_means
from pmi_reward.evaluation.report import markdown_table
from pmi_reward.policy.samples import judge_scores

sys.path.append(str(Path(__file__).resolve().parents[1]))  # recipes/: the scripts' shared input check (run by path)
from recipe_inputs import require_samples  # noqa: E402


def base_scores(path: Path) -> tuple[list[str], dict[str, np.ndarray]]:
    """The contexts of a samples file and, per judge, the mean PMI of the base's replies to each context."""
    rows = read_records(path)
    judges = sorted(rows[0]["base"][0]["pmi"]) if rows else []
    return [r["context"] for r in rows], {j: row_means(judge_scores(rows, "base", j)) for j in judges}


def compare(fixed: Path, fresh: Path) -> str:
    """Per judge of both files: the fixed draw's mean PMI, the fresh draw's, and their paired difference."""
    contexts, a = base_scores(fixed)
    other, b = base_scores(fresh)
    if contexts != other:
        raise ValueError(f"{fixed} and {fresh} hold different contexts: draw the base again on the same ones")
    rows = []
    for judge in sorted(set(a) & set(b)):
        diff = b[judge] - a[judge]
        low, high = bootstrap_ci(np.mean, diff)
        rows.append(
            [
                judge,
                f"{a[judge].mean():+.2f}",
                f"{b[judge].mean():+.2f}",
                f"{diff.mean():+.2f} [{low:+.2f}, {high:+.2f}]",
            ]
        )
    header = ["judge", "fixed draw (mean PMI)", "fresh draw", "fresh minus fixed [95% CI over contexts]"]
    return f"{len(contexts)} contexts\n\n" + markdown_table(header, rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("fixed", type=Path, help="samples.jsonl of the evaluation whose base draw the trials share")
    parser.add_argument("fresh", type=Path, help="samples.jsonl of the base drawn again on the same contexts")
    args = parser.parse_args()
    require_samples(parser.prog, [args.fixed, args.fresh], "FIXED and FRESH")
    print(compare(args.fixed, args.fresh))


if __name__ == "__main__":
    main()

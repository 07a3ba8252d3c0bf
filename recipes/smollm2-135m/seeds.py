"""Gains over seeds, from one evaluation (``evaluate-policy``'s output directory): the issue's target is a mean
over >= 3 seeds with a 95% CI over contexts that excludes 0.

Policies named ``<stem>-s<seed>`` form one group. Per group and judge: each seed's paired gain over the base (as
in results.md), their mean ± std (sample std over seeds), and the seed-averaged gain with a bootstrap CI over
contexts (each context's gain averaged over the seeds first, so contexts stay the unit resampled); beside them
the group's mean reward PMI, reply length, distinct-2 and KL per reply against the base's, for the length and
diversity gates.

python recipes/smollm2-135m/seeds.py outputs/eval/final/grpo
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

from pmi_reward.evaluation.metrics import mean_ci, row_means
from pmi_reward.evaluation.report import markdown_table
from pmi_reward.policy.samples import judge_scores

sys.path.append(str(Path(__file__).resolve().parents[1]))  # recipes/: the scripts' shared input check (run by path)
from recipe_inputs import require_inputs  # noqa: E402

_SEED = re.compile(r"^(?P<stem>.+)-s(?P<seed>\d+)$")
_NOT_POLICIES = ("context", "reference", "human reference")


def seed_groups(policies: list[str]) -> dict[str, list[str]]:
    """``{stem: [stem-s0, stem-s1, ...]}`` for stems with at least two seeds."""
    groups: dict[str, list[str]] = defaultdict(list)
    for p in policies:
        m = _SEED.match(p)
        if m:
            groups[m["stem"]].append(p)
    return {stem: sorted(ps) for stem, ps in groups.items() if len(ps) >= 2}


def _signed(value: float | None) -> str:
    return "–" if value is None else f"{value:+.2f}"


def group_gain(rows: list[dict], members: list[str], judge: str) -> dict[str, float | list[float]]:
    """Each seed's gain over the base, their mean and sample std, and the seed-averaged gain with its CI."""
    base = row_means(judge_scores(rows, "base", judge))
    per_context = np.stack([row_means(judge_scores(rows, p, judge)) - base for p in members], axis=1)
    seeds = per_context.mean(0)
    pooled = mean_ci(per_context.mean(1))
    return {
        "seeds": [float(g) for g in seeds],
        "mean": float(seeds.mean()),
        "std": float(seeds.std(ddof=1)),
        "pooled": pooled.value,
        "low": pooled.low,
        "high": pooled.high,
    }


def summary(directory: Path) -> str:
    """The markdown table of every seed group in an evaluation directory."""
    samples = directory / "samples.jsonl"
    # lines end at \n only: str.splitlines() also splits at U+2028, U+2029 and \x85, which replies hold raw
    text = samples.read_text(encoding="utf-8") if samples.exists() else ""
    rows = [json.loads(line) for line in text.split("\n") if line.strip()]
    if not rows:
        raise SystemExit(f"{samples}: no samples (expected evaluate-policy's samples.jsonl)")
    results = json.loads((directory / "results.json").read_text())
    diag = {r["policy"]: r for r in results["rows"]}
    judges = list(rows[0]["base"][0]["pmi"])
    groups = seed_groups([p for p in rows[0] if p not in _NOT_POLICIES])
    if not groups:
        raise SystemExit(f"{directory}: no policies named <stem>-s<seed> with two or more seeds")
    b = diag["base"]
    table = []
    for stem, members in groups.items():
        rewards = [diag[p].get("reward_pmi") for p in members]  # None: the reward scorer left replies unscored
        reward_text = "–" if None in rewards else f"{np.mean(rewards):+.2f}"
        words = np.mean([diag[p]["words"] for p in members])
        d2 = np.mean([diag[p]["distinct_2"] for p in members])
        kl = [diag[p].get("kl_reply") for p in members]
        kl_text = f"{np.mean(kl):.2f}" if None not in kl else ""
        for judge in judges:
            g = group_gain(rows, members, judge)
            table.append(
                [
                    stem,
                    judge,
                    len(members),
                    " / ".join(f"{v:+.2f}" for v in g["seeds"]),
                    f"{g['mean']:+.2f} ± {g['std']:.2f}",
                    f"{g['pooled']:+.2f} [{g['low']:+.2f}, {g['high']:+.2f}]",
                    f"{reward_text} (base {_signed(b.get('reward_pmi'))})",
                    f"{words:.1f} ({words / b['words'] - 1:+.0%})",
                    f"{d2:.3f} (base {b['distinct_2']:.3f})",
                    kl_text,
                ]
            )
    head = [
        "policy",
        "judge",
        "seeds",
        "gain per seed",
        "mean ± std over seeds",
        "seed-averaged gain [95% CI over contexts]",
        "reward PMI",
        "words (vs base)",
        "distinct-2",
        "KL/reply",
    ]
    return markdown_table(head, table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory", type=Path, help="an evaluate-policy output directory")
    args = parser.parse_args()
    expected = "DIRECTORY should be an evaluate-policy --output_dir (its samples.jsonl and results.json)"
    require_inputs(parser.prog, expected, ["samples.jsonl", "results.json"], folder=args.directory)
    print(summary(args.directory))


if __name__ == "__main__":
    main()

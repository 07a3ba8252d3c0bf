"""How far each policy's replies moved from the base's, from evaluation samples (``samples.jsonl`` of
``evaluate-policy``).

The evaluation draws every policy's replies with the same seeds as the base's (when it draws as many for each: not
with ``--base_samples``, which ``tune/evaluate-all.yaml`` sets), so a policy that barely moved
returns many of the base's replies word for word, and its gain is measured on the replies it changed. This table
gives, per policy, the share of replies identical to the base's reply drawn with the same seed, and the mean share
of the base reply's words that the policy's reply repeats from the start (the shared opening, in words).

python recipes/smollm2-135m/overlap.py outputs/eval/tune/dpo-a/samples.jsonl outputs/eval/tune/rft-h/samples.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from pmi_reward.evaluation.report import markdown_table

sys.path.append(str(Path(__file__).resolve().parents[1]))  # recipes/: the scripts' shared input check (run by path)
from recipe_inputs import require_samples  # noqa: E402

NOT_POLICIES = ("context", "reference", "base", "human reference")


def shared_opening(base: str, reply: str) -> float:
    """Share of ``base``'s words that ``reply`` repeats from its first word on (1.0: the same words)."""
    a, b = base.split(), reply.split()
    if not a:
        return float(not b)
    k = 0
    while k < min(len(a), len(b)) and a[k] == b[k]:
        k += 1
    return k / len(a)


def overlap_stats(base: list[str], replies: list[str]) -> dict[str, float]:
    """Replies compared with the base's of the same seed: count, share identical, mean shared opening."""
    if len(base) != len(replies):
        raise ValueError(f"{len(replies)} replies against {len(base)} of the base: not drawn with the same seeds")
    return {
        "replies": len(replies),
        "identical": float(np.mean([a == b for a, b in zip(base, replies, strict=True)])),
        "shared_opening": float(np.mean([shared_opening(a, b) for a, b in zip(base, replies, strict=True)])),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("samples", nargs="+", type=Path, help="samples.jsonl files with a base and its policies")
    args = parser.parse_args()
    require_samples(parser.prog, args.samples, "each SAMPLES")
    table = []
    for path in args.samples:
        # lines end at \n only: str.splitlines() also splits at U+2028, U+2029 and \x85, which replies hold raw
        rows = [json.loads(line) for line in path.read_text(encoding="utf-8").split("\n") if line.strip()]
        if not rows or "base" not in rows[0]:
            parser.error(f"{path}: no base samples (expected one JSON object per context, as evaluate-policy writes)")
        base = [s["reply"] for row in rows for s in row["base"]]
        for policy in (p for p in rows[0] if p not in NOT_POLICIES):
            if len(rows[0][policy]) != len(rows[0]["base"]):  # each batch is seeded by its position: seeds differ
                parser.error(
                    f"{path}: the base drew {len(rows[0]['base'])} replies per context and {policy} "
                    f"{len(rows[0][policy])} (--base_samples), so no reply of one shares its seed with the other's: "
                    "compare an evaluation with equal counts (e.g. tune/evaluate.yaml)"
                )
            stats = overlap_stats(base, [s["reply"] for row in rows for s in row[policy]])
            table.append([policy, stats["replies"], f"{stats['identical']:.3f}", f"{stats['shared_opening']:.3f}"])
    print(markdown_table(["policy", "replies", "identical to the base's", "shared opening (words)"], table))


if __name__ == "__main__":
    main()

"""Repetition inside replies, per policy, from evaluation samples (``samples.jsonl`` of ``evaluate-policy``).

Distinct-2 over a policy's replies falls when replies repeat themselves and when replies to different contexts
resemble each other; this table separates the first: the mean share of a reply's word 3-grams that repeat an
earlier one (what the diversity reward penalises), the share of replies with any such repeat, and the mean
distinct-2 of one reply.

python recipes/smollm2-135m/repetition.py outputs/eval/tune/grpo-e/samples.jsonl outputs/eval/tune/grpo-f/samples.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from pmi_reward.evaluation.report import markdown_table
from pmi_reward.rewards.diversity import repeated_ngram_share

sys.path.append(str(Path(__file__).resolve().parents[1]))  # recipes/: the scripts' shared input check (run by path)
from recipe_inputs import require_samples  # noqa: E402


def reply_stats(replies: list[str]) -> dict[str, float]:
    """Mean repeated 3-gram share, share of replies with a repeat, mean per-reply distinct-2 (1 - repeated 2-grams)."""
    rep3 = np.array([repeated_ngram_share(r, 3) for r in replies])
    rep2 = np.array([repeated_ngram_share(r, 2) for r in replies])
    return {
        "replies": len(replies),
        "repeated_3grams": float(rep3.mean()),
        "with_repeat": float((rep3 > 0).mean()),
        "distinct2_in_reply": float(1.0 - rep2.mean()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("samples", nargs="+", type=Path, help="samples.jsonl files; a policy seen twice is kept once")
    args = parser.parse_args()
    require_samples(parser.prog, args.samples, "each SAMPLES")
    replies: dict[str, list[str]] = {}
    for path in args.samples:
        # lines end at \n only: str.splitlines() also splits at U+2028, U+2029 and \x85, which replies hold raw
        rows = [json.loads(line) for line in path.read_text(encoding="utf-8").split("\n") if line.strip()]
        if not rows:
            parser.error(f"{path}: no samples (expected one JSON object per context, as evaluate-policy writes)")
        for policy in rows[0]:
            if policy in ("context", "reference", "human reference") or policy in replies:
                continue
            replies[policy] = [s["reply"] for row in rows for s in row[policy]]
    headers = ["policy", "replies", "repeated 3-grams", "replies with a repeat", "distinct-2 in a reply"]
    table = [[p, len(r), *(f"{v:.3f}" for v in list(reply_stats(r).values())[1:])] for p, r in replies.items() if r]
    print(markdown_table(headers, table))


if __name__ == "__main__":
    main()

"""How a truncation penalty compares with the spread of finished replies' PMI (issue 10; chooses the penalty of
trial dpo-l, "Nineteenth tuning round" in RESULTS.md). Reads the base's draws on the tuning contexts from an
evaluation's samples.jsonl, scores them with the reward scorer, and prints, over contexts: the spread (std) of
finished replies' PMI, cut replies' PMI against finished ones, and for candidate penalties how often a context's best
and worst reply (by PMI plus the penalty) would be a cut one.

python recipes/smollm2-135m/cut_spread.py outputs/eval/tune/dpo-k-pilot/samples.jsonl outputs/scorers/reward-minilm-s0
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from pmi_reward import PMIReward
from pmi_reward.policy.samples import read_samples

sys.path.append(str(Path(__file__).resolve().parents[1]))  # recipes/: the scripts' shared input check (run by path)
from recipe_inputs import require_samples, require_scorer  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("samples", help="an evaluation's samples.jsonl (the base drawn several times per context)")
    parser.add_argument("scorer", help="the reward scorer")
    parser.add_argument("--policy", default="base")
    parser.add_argument("--penalties", type=float, nargs="+", default=[0, -1, -2, -3, -5, -10])
    args = parser.parse_args()
    require_samples(parser.prog, [args.samples])
    require_scorer(parser.prog, args.scorer)
    contexts, _, replies = read_samples(args.samples)
    rows = replies[args.policy]
    reward = PMIReward.from_pretrained(args.scorer, empty_score=-5.0)
    texts = [t for row in rows.texts for t in row]
    prompts = [c for c, row in zip(contexts, rows.texts, strict=True) for _ in row]
    pmi = np.array(reward(prompts, texts), dtype=float).reshape(len(rows.texts), -1)
    cut = np.array(rows.truncated, dtype=bool).reshape(pmi.shape)
    finished_std = [np.std(p[~c], ddof=1) for p, c in zip(pmi, cut, strict=True) if (~c).sum() >= 2]
    print(f"{pmi.shape[0]} contexts x {pmi.shape[1]} draws of {args.policy!r}; {cut.mean():.1%} cut")
    print(f"PMI finished {pmi[~cut].mean():+.2f} (std {pmi[~cut].std():.2f}), cut {pmi[cut].mean():+.2f}")
    print(
        f"within a context, std of finished replies' PMI: median {np.median(finished_std):.2f}, "
        f"mean {np.mean(finished_std):.2f} ({len(finished_std)} contexts with 2+ finished)"
    )
    mixed = cut.any(axis=1) & (~cut).any(axis=1)
    print(f"contexts holding both cut and finished replies: {mixed.sum()}")
    print("| penalty | best is cut | worst is cut | (share of those contexts) |\n|---|---|---|---|")
    for penalty in args.penalties:
        score = pmi + penalty * cut
        best = cut[np.arange(len(cut)), score.argmax(axis=1)][mixed]
        worst = cut[np.arange(len(cut)), score.argmin(axis=1)][mixed]
        print(f"| {penalty:+g} | {best.mean():.1%} | {worst.mean():.1%} | |")


if __name__ == "__main__":
    main()

"""Whether a scorer pays for word salad: each reply against the same words in a random order.

A policy that loses its fluency (tuning trial dpo-e, seed 1: "... spell divine love spells divine love love love
...") was rated near the base by every judge. A reply and a scramble of its own words share every content word, so a
scorer that reads bags of words gives both the same PMI; one that reads language puts the reply above its scramble.
This prints, per scorer, the share of replies that score above their scramble (0.5: blind to word order) and the
mean PMI of both, for the replies of a ``samples.jsonl`` (one evaluation's contexts, nothing sampled). The scrambles
are ``pmi_reward.data.mining.scramble``'s, the ``k_scrambled`` negatives' (replies of fewer than three words have none).

python recipes/smollm2-135m/scrambled.py outputs/eval/tune/dpo-e/samples.jsonl \
    --scorers reward=outputs/scorers/reward-minilm-s0 smollm2-en=outputs/scorers/judge-smollm2-en \
    minilm-en=outputs/scorers/judge-minilm-en mpnet-en=outputs/scorers/judge-mpnet-en
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from pmi_reward.data.mining import scramble
from pmi_reward.data.records import read_records
from pmi_reward.evaluation.report import markdown_table
from pmi_reward.policy.panel import parse_judge
from pmi_reward.scoring.scorer import PMIScorer

sys.path.append(str(Path(__file__).resolve().parents[1]))  # recipes/: the scripts' shared input check (run by path)
from recipe_inputs import require_samples, require_scorer  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("samples", type=Path, help="an evaluation's samples.jsonl")
    parser.add_argument("--scorers", nargs="+", required=True, help="name=scorer_dir")
    parser.add_argument("--policies", nargs="+", default=["base", "human reference"], help="whose replies")
    parser.add_argument("--seed", type=int, default=0, help="seed of the scrambles")
    args = parser.parse_args(argv)
    require_samples(parser.prog, [args.samples])
    for _, directory in map(parse_judge, args.scorers):
        require_scorer(parser.prog, directory, "--scorers")
    records = read_records(args.samples)
    for policy in args.policies:
        if not all(policy in r for r in records):
            raise SystemExit(f"{args.samples}: policy {policy!r} is missing from some rows")
    pairs = [(r["context"], x["reply"], p) for p in args.policies for r in records for x in r[p]]
    pairs = [(c, x, s, p) for c, x, p in pairs if (s := scramble(x, args.seed)) is not None]
    contexts = [c for c, *_ in pairs]
    rows = []
    for spec in args.scorers:
        name, directory = parse_judge(spec)
        scorer = PMIScorer.from_pretrained(directory)
        written = np.asarray(scorer.score(contexts, [x for _, x, _, _ in pairs]), dtype=float)
        shuffled = np.asarray(scorer.score(contexts, [s for _, _, s, _ in pairs]), dtype=float)
        for policy in args.policies:
            m = np.array([p == policy for *_, p in pairs])
            above = (written[m] > shuffled[m]).mean() + 0.5 * (written[m] == shuffled[m]).mean()
            rows.append(
                [name, policy, int(m.sum()), f"{above:.2f}", f"{written[m].mean():+.2f}", f"{shuffled[m].mean():+.2f}"]
            )
    print(markdown_table(["scorer", "replies of", "replies", "above their scramble", "PMI", "PMI scrambled"], rows))


if __name__ == "__main__":
    main()

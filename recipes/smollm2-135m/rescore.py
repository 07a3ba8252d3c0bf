"""Whether a rebuilt scorer is the scorer that judged an earlier evaluation: the PMI it gives the same replies.

A scorer retrained from the same command and seed on another CPU can reach the same validation AUC and still be
another function (its floating-point sums differ, so its training path does). This re-scores the base's replies of
the first contexts of a ``samples.jsonl`` (whose ``pmi`` fields the earlier copies wrote) with today's copies and
prints, per judge, the correlation and the mean of the two, so that absolute PMIs are compared across sessions only
where they carried over.

python recipes/smollm2-135m/rescore.py recipes/smollm2-135m/samples.jsonl --contexts 40 \
    --judges smollm2-en=outputs/scorers/judge-smollm2-en minilm-en=outputs/scorers/judge-minilm-en \
    mpnet-en=outputs/scorers/judge-mpnet-en
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from pmi_reward.data.records import read_records
from pmi_reward.evaluation.report import markdown_table
from pmi_reward.policy.panel import parse_judge
from pmi_reward.scoring.scorer import PMIScorer

sys.path.append(str(Path(__file__).resolve().parents[1]))  # recipes/: the scripts' shared input check (run by path)
from recipe_inputs import require_samples, require_scorer  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("samples", type=Path, help="an evaluation's samples.jsonl")
    parser.add_argument("--judges", nargs="+", required=True, help="name=scorer_dir, a name the file's pmi fields use")
    parser.add_argument("--contexts", type=int, default=40, help="the first contexts whose base replies are scored")
    parser.add_argument("--policy", default="base", help="whose replies are scored again")
    args = parser.parse_args(argv)
    require_samples(parser.prog, [args.samples])
    for _, directory in map(parse_judge, args.judges):
        require_scorer(parser.prog, directory, "--judges")
    records = read_records(args.samples)[: args.contexts]
    replies = [(r["context"], x) for r in records for x in r[args.policy]]
    rows = []
    for spec in args.judges:
        name, directory = parse_judge(spec)
        if not all(name in x["pmi"] for _, x in replies):
            raise SystemExit(f"{args.samples}: no PMI by judge {name!r} for every {args.policy} reply")
        before = np.array([x["pmi"][name] for _, x in replies])
        texts = [x["reply"] for _, x in replies]
        shown = [i for i, t in enumerate(texts) if t.strip()]
        now = np.zeros(len(texts))  # an empty reply: 0.0, as the evaluation scored it (its judges' empty_score)
        now[shown] = PMIScorer.from_pretrained(directory).score(
            [replies[i][0] for i in shown], [texts[i] for i in shown]
        )
        corr = float(np.corrcoef(before, now)[0, 1])
        rows.append([name, len(before), f"{corr:.3f}", f"{before.mean():+.2f}", f"{now.mean():+.2f}"])
    print(markdown_table(["judge", "replies", "correlation", "mean PMI before", "mean PMI now"], rows))


if __name__ == "__main__":
    main()

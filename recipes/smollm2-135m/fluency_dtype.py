"""What the fluency penalty's reading costs in float32 and in bfloat16, and whether the cheaper one decides the same.

The penalty (``--fluency_penalty``) reads every sampled reply under a frozen copy of the starting model; in trial dpo-h
that cost ~30 s of each ~250 s DPO round, so that two of three seeds ran 7 rounds instead of 8 under the same CPU
budget. This reads the same replies of a ``samples.jsonl`` (nothing sampled) once per precision, in the order given,
and prints the seconds each took, the largest difference in NLL per token, and how many replies fall on the other
side of the threshold (``pmi-reward dpo --fluency_dtype bfloat16`` uses the faster one). Run it alone: it is a timing.

python recipes/smollm2-135m/fluency_dtype.py outputs/eval/tune/dpo-h/samples.jsonl \
    --policies dpo-h-s0 dpo-h-s1 dpo-h-s2
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

from pmi_reward.data.records import read_records
from pmi_reward.evaluation.baselines.lm_pmi import LMPMIConfig, LMPMIScorer
from pmi_reward.evaluation.report import markdown_table
from pmi_reward.policy.loading import DEFAULT_POLICY
from pmi_reward.rewards.fluency import BASE_NLL_P95, FLUENCY_DTYPES, reply_nll

sys.path.append(str(Path(__file__).resolve().parents[1]))  # recipes/: the scripts' shared input check (run by path)
from recipe_inputs import require_samples  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("samples", type=Path, help="an evaluation's samples.jsonl")
    parser.add_argument("--policies", nargs="+", required=True, help="whose replies to read")
    parser.add_argument("--model", default=DEFAULT_POLICY, help="the base chat model (name or directory)")
    parser.add_argument("--max_nll", type=float, default=BASE_NLL_P95, help="the penalty's threshold")
    parser.add_argument("--dtypes", nargs="+", default=list(FLUENCY_DTYPES), choices=FLUENCY_DTYPES)
    args = parser.parse_args(argv)
    require_samples(parser.prog, [args.samples])
    records = read_records(args.samples)
    pairs = []
    for policy in args.policies:
        if not all(policy in r for r in records):
            raise SystemExit(f"{args.samples}: policy {policy!r} is missing from some rows")
        pairs += [(r["context"], x["reply"]) for r in records for x in r[policy]]
    contexts, replies = [c for c, _ in pairs], [x for _, x in pairs]
    nll, seconds = {}, {}
    for dtype in args.dtypes:
        lm = LMPMIScorer(LMPMIConfig(model=args.model, dtype=dtype))
        reply_nll(lm, ["Hello there!"], ["Hi, how are you?"])  # warm-up, a pair outside the set (replies are cached)
        start = time.perf_counter()
        nll[dtype] = reply_nll(lm, contexts, replies)
        seconds[dtype] = time.perf_counter() - start
    ref = nll[args.dtypes[0]]
    rows = []
    for dtype in args.dtypes:
        v = nll[dtype]
        flipped = int(((v > args.max_nll) != (ref > args.max_nll)).sum())
        rows.append(
            [
                dtype,
                len(v),
                f"{seconds[dtype]:.1f}",
                f"{np.abs(v - ref).max():.3f}",
                f"{(v > args.max_nll).mean():.1%}",
                flipped,
            ]
        )
    print(f"{len(replies)} replies of {', '.join(args.policies)}; torch threads {torch.get_num_threads()}")
    head = ["dtype", "replies", "seconds", f"max |NLL - {args.dtypes[0]}|", f"above {args.max_nll}", "flipped"]
    print(markdown_table(head, rows))


if __name__ == "__main__":
    main()

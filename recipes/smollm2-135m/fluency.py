"""Whether a policy still writes language: the base chat model's negative log-likelihood per token of its replies.

Trial dpo-g (twelfth tuning round) wrote replies of invented words and another language ("Especially pyrofloakes
haha. They're a lifeskiaerwalk!!"). Distinct-2 rises with such replies and a scramble keeps their words, so neither
the diversity gate nor the scramble-aware scorers flag them. The base model does: a reply it would never write costs
it many nats a token. This prints, per policy of a ``samples.jsonl`` (nothing sampled), the mean and median NLL per
token of its replies under the base model at temperature 1, each read after its context's turns and closed by its
end-of-turn token, as the LM judge reads a reply (``LMPMIScorer.log_likelihoods``), and the share of replies above
the 95th percentile of the base's own replies (the base: 5% by construction). Human replies are typed by people
(typos, slang), so their figure is a reference, not a target.

python recipes/smollm2-135m/fluency.py outputs/eval/tune/dpo-g/samples.jsonl \
    --policies base dpo-g-s0 dpo-g-s1 dpo-g-s2 "human reference"
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from pmi_reward.data.records import read_records
from pmi_reward.evaluation.baselines.lm_pmi import LMPMIConfig, LMPMIScorer
from pmi_reward.evaluation.report import markdown_table
from pmi_reward.policy.loading import DEFAULT_POLICY
from pmi_reward.rewards.fluency import reply_nll

sys.path.append(str(Path(__file__).resolve().parents[1]))  # recipes/: the scripts' shared input check (run by path)
from recipe_inputs import require_samples  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("samples", type=Path, help="an evaluation's samples.jsonl")
    parser.add_argument("--policies", nargs="+", default=["base", "human reference"], help="whose replies")
    parser.add_argument("--base", default="base", help="the policy whose replies set the 95th percentile")
    parser.add_argument("--model", default=DEFAULT_POLICY, help="the base chat model (name or directory)")
    args = parser.parse_args(argv)
    require_samples(parser.prog, [args.samples])
    records = read_records(args.samples)
    for policy in {args.base, *args.policies}:
        if not all(policy in r for r in records):
            raise SystemExit(f"{args.samples}: policy {policy!r} is missing from some rows")
    lm = LMPMIScorer(LMPMIConfig(model=args.model))
    nll = {}
    for policy in dict.fromkeys([args.base, *args.policies]):
        pairs = [(r["context"], x["reply"]) for r in records for x in r[policy]]
        nll[policy] = reply_nll(lm, [c for c, _ in pairs], [x for _, x in pairs])
    edge = float(np.percentile(nll[args.base], 95))
    rows = []
    for policy in args.policies:
        v = nll[policy]
        rows.append([policy, len(v), f"{v.mean():.2f}", f"{np.median(v):.2f}", f"{(v > edge).mean():.1%}"])
    above = f"above the {args.base}'s 95th percentile ({edge:.2f})"
    print(markdown_table(["replies of", "replies", "NLL/token (mean)", "median", above], rows))


if __name__ == "__main__":
    main()

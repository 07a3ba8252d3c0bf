"""Whether a policy still writes language: the base chat model's negative log-likelihood per token of its replies.

Trial dpo-g (twelfth tuning round) wrote replies of invented words and another language ("Especially pyrofloakes
haha. They're a lifeskiaerwalk!!"). Distinct-2 rises with such replies and a scramble keeps their words, so neither
the diversity gate nor the scramble-aware scorers flag them. The base model does: a reply it would never write costs
it many nats a token. This prints, per policy of a ``samples.jsonl`` (nothing sampled), the mean and median NLL per
token of its replies under the base policy at temperature 1, each reply after its context given as one user message
(not the evaluation's exact prompt: the samples file keeps the context text only), and the share of replies above
the 95th percentile of the base's own replies (the base: 5% by construction). Human replies are typed by people
(typos, slang), so their figure is a reference, not a target.

python recipes/smollm2-135m/fluency.py outputs/eval/tune/dpo-g/samples.jsonl \
    --policies base dpo-g-s0 dpo-g-s1 dpo-g-s2 "human reference"
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from pmi_reward.data.records import read_records
from pmi_reward.evaluation.report import markdown_table
from pmi_reward.policy.divergence import reply_logprobs
from pmi_reward.policy.loading import DEFAULT_POLICY, load_policy


def reply_nll(model, tokenizer, contexts: list[str], replies: list[str], batch_size: int = 16) -> np.ndarray:
    """NLL per token (nats) of each reply after its context, as one user message, under ``model`` at temperature 1;
    NaN for a reply with no tokens."""
    ids = [tokenizer(r, add_special_tokens=False)["input_ids"] for r in replies]
    prompts = [[{"role": "user", "content": c}] for c in contexts]
    total = reply_logprobs(model, tokenizer, prompts, [[i] for i in ids], 1.0, batch_size)[:, 0]
    lengths = np.array([len(i) for i in ids], dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(lengths > 0, -total / lengths, np.nan)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("samples", type=Path, help="an evaluation's samples.jsonl")
    parser.add_argument("--policies", nargs="+", default=["base", "human reference"], help="whose replies")
    parser.add_argument("--base", default="base", help="the policy whose replies set the 95th percentile")
    parser.add_argument("--model", default=DEFAULT_POLICY, help="the base chat model (name or directory)")
    parser.add_argument("--batch_size", type=int, default=16)
    args = parser.parse_args(argv)
    records = read_records(args.samples)
    for policy in {args.base, *args.policies}:
        if not all(policy in r for r in records):
            raise SystemExit(f"{args.samples}: policy {policy!r} is missing from some rows")
    model, tokenizer = load_policy(args.model)
    nll = {}
    for policy in dict.fromkeys([args.base, *args.policies]):
        pairs = [(r["context"], x["reply"]) for r in records for x in r[policy]]
        nll[policy] = reply_nll(model, tokenizer, [c for c, _ in pairs], [x for _, x in pairs], args.batch_size)
    edge = float(np.nanpercentile(nll[args.base], 95))
    rows = []
    for policy in args.policies:
        v = nll[policy][~np.isnan(nll[policy])]
        if not v.size:
            raise SystemExit(f"{args.samples}: policy {policy!r} has no reply with a token")
        rows.append([policy, len(v), f"{v.mean():.2f}", f"{np.median(v):.2f}", f"{(v > edge).mean():.1%}"])
    above = f"above the {args.base}'s 95th percentile ({edge:.2f})"
    print(markdown_table(["replies of", "replies", "NLL/token (mean)", "median", above], rows))


if __name__ == "__main__":
    main()

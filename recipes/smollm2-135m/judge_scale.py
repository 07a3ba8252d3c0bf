"""Each judge's scale in nats: how far below the base's replies a fluent reply to ANOTHER context falls. A judge's
gain is a difference of its PMI estimates, and judges differ in how widely they spread them; the issue's target
(+1.0 nat by every judge that shares nothing with the reward) means more to a judge that puts an off-topic reply 1
nat below the base's than to one that puts it 4 below.

This writes a samples file for ``evaluate-policy --from_samples``: the base's replies as they are, the human replies,
and a policy ``mismatched`` whose reply to each context is the base's first reply to another context (a seeded
derangement: no context keeps its own). Judged again, ``mismatched``'s "gain" is each judge's drop from an on-topic
reply of the base to an off-topic one of the same style and length distribution.

python recipes/smollm2-135m/judge_scale.py outputs/eval/tune/protocol17/samples.jsonl outputs/eval/tune/scale.jsonl
pmi-reward evaluate-policy --config recipes/smollm2-135m/tune/evaluate-all.yaml --kl false --log_file "" \
    --from_samples outputs/eval/tune/scale.jsonl --output_dir outputs/eval/tune/judge-scale
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from pmi_reward.data.records import read_records

sys.path.append(str(Path(__file__).resolve().parents[1]))  # recipes/: the scripts' shared input check (run by path)
from recipe_inputs import require_samples  # noqa: E402

MISMATCHED = "mismatched"


def derangement(n: int, seed: int = 0) -> np.ndarray:
    """``donor[i]``: the context whose reply context ``i`` gets; never ``i`` itself (``n`` >= 2)."""
    if n < 2:
        raise ValueError(f"a reply from another context needs at least 2 contexts, got {n}")
    order = np.random.default_rng(seed).permutation(n)
    donor = np.empty(n, dtype=int)
    donor[order] = np.roll(order, -1)
    return donor


def mismatched_records(rows: list[dict], seed: int = 0) -> list[dict]:
    """The rows with only the base, a ``mismatched`` policy (the base's first reply to another context) and the
    human reply."""
    donor = derangement(len(rows), seed)
    out = []
    for i, row in enumerate(rows):
        record = {k: row[k] for k in ("context", "reference") if k in row}
        record["base"] = row["base"]
        record[MISMATCHED] = [rows[donor[i]]["base"][0]]
        if "human reference" in row:
            record["human reference"] = row["human reference"]
        out.append(record)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("samples", type=Path, help="an evaluation's samples.jsonl (its base replies are used)")
    parser.add_argument("output", type=Path, help="the samples file to judge again (--from_samples)")
    parser.add_argument("--seed", type=int, default=0, help="the derangement's seed")
    args = parser.parse_args()
    require_samples(parser.prog, [args.samples])  # not OUTPUT: this writes it
    records = mismatched_records(read_records(args.samples), args.seed)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
    print(f"{len(records)} contexts, policies base and {MISMATCHED}: {args.output}")


if __name__ == "__main__":
    main()

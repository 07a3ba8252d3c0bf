"""One side-by-side sample file for every final policy, from two evaluations of the same held-out contexts.

Each finals evaluation writes its own ``samples.jsonl`` (the base, its seeds, the human reply). Two evaluations with
the same config and seeds draw the base's replies identically, so their files merge into one that compares every
final policy on the same contexts (``pmi_reward.policy.samples.merge_records`` refuses anything else); a judge's PMI
is kept where both ran it.

python recipes/smollm2-135m/merge_samples.py outputs/eval/final/rejudge-mpnet/samples.jsonl \
    outputs/eval/final/dpo/samples.jsonl --output_dir recipes/smollm2-135m
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pmi_reward.data.records import read_records
from pmi_reward.policy.samples import merge_records, write_records

sys.path.append(str(Path(__file__).resolve().parents[1]))  # recipes/: the scripts' shared input check (run by path)
from recipe_inputs import require_samples  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("first", type=Path, help="samples.jsonl whose policies come first")
    parser.add_argument("second", type=Path, help="samples.jsonl whose policies are added")
    parser.add_argument("--output_dir", type=Path, required=True, help="where samples.jsonl and samples.md go")
    parser.add_argument("--contexts", type=int, default=30, help="contexts shown in samples.md")
    args = parser.parse_args(argv)
    require_samples(parser.prog, [args.first, args.second], "FIRST and SECOND")
    merged = merge_records(
        read_records(args.first), read_records(args.second), names=(str(args.first), str(args.second))
    )
    args.output_dir.mkdir(parents=True, exist_ok=True)
    write_records(args.output_dir, merged, args.contexts)
    names = [k for k in merged[0] if k not in ("context", "reference")]
    print(f"{len(merged)} contexts, policies {names}: {args.output_dir / 'samples.md'}")


if __name__ == "__main__":
    main()

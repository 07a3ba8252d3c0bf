"""Does a pair's score depend on the texts encoded beside it? One pair scored alone and beside each of a few others,
per fast path (torch, onnx, onnx + int8, onnx + int8-block), no embedding cache.

    python benchmarks/int8_batch.py --scorer outputs/scorer

Dynamic int8 (``--quantize int8``) scales activations per batch tensor, padding included, so its embeddings, and a
pair's score, move with the batch's other texts; the other paths give each text its own embedding.
"""

from __future__ import annotations

import argparse
import os
import sys

# before the tokenizers are imported or used: their thread pool is otherwise one thread per core
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from pmi_reward.scoring.scorer import PMIScorer

PAIR = ("I just got back from a hiking trip in Yosemite.", "Did you see Half Dome?")
BESIDE = [
    ("Tell me about Paris.\nIt's the capital of France.\nWhat food is it famous for?", "Yes."),
    ("Do you like cats?", "Yes."),
    (" ".join(f"word{i}" for i in range(200)), "Yes."),
]
PATHS = (("torch", "none"), ("onnx", "none"), ("onnx", "int8"), ("onnx", "int8-block"))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scorer", default="outputs/scorer", help="a saved scorer directory")
    args = parser.parse_args(argv)
    # recorded (benchmarks/README.md) on stderr: stdout stays the markdown table
    print(f"TOKENIZERS_PARALLELISM={os.environ.get('TOKENIZERS_PARALLELISM')}", file=sys.stderr)
    print("| backend | quantize | alone | beside each other pair | largest move (nat) |\n|---|---|---|---|---|")
    for backend, quantize in PATHS:
        # on the CPU: the default device of a GPU machine is its GPU, where the onnx backend is refused
        scorer = PMIScorer.from_pretrained(
            args.scorer, device="cpu", backend=backend, quantize=quantize, cache_dir=None
        )
        alone = float(scorer.score([PAIR[0]], [PAIR[1]])[0])
        beside = [float(scorer.score([PAIR[0], c], [PAIR[1], r])[0]) for c, r in BESIDE]
        moved = max(abs(b - alone) for b in beside)
        print(f"| {backend} | {quantize} | {alone:+.3f} | {', '.join(f'{b:+.3f}' for b in beside)} | {moved:.3f} |")


if __name__ == "__main__":
    main()

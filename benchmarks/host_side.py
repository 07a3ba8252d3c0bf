"""The host side of a scoring call: ``PMIScorer.score`` with the encoder's forward replaced by a constant.

The encoder's ``_forward`` (a padded token batch in, its embeddings out) returns one constant unit vector per text,
so the model's forward, the pooling and the normalisation are all left out of the time. What is timed is everything
the scorer does around them, with the embedding cache off: cutting texts to their token budget, tokenizing,
length-sorting, batching and padding (and each batch's copy to the encoder's device), and the head. That is the
part of a call that a GPU does not speed up, and on a GPU the larger part (``benchmarks/RESULTS.md``, "On a GPU");
the pooling, which runs on the GPU there, is not in it. Scores the first ``--pairs`` pairs of ``--input`` (each
context, its reply and, for a scorer with line features, its newest lines) ``--repeats`` times; prints the texts
embedded per call and the seconds of each call. The HF tokenizers run on one thread
(``TOKENIZERS_PARALLELISM=false``, as the Makefile sets it) unless the environment says otherwise, so that
``--threads 1`` holds for the tokenizing too; the result records the setting.

    python benchmarks/host_side.py --scorer outputs/scorers/reward-minilm-s0 --pairs 1000 --repeats 7
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

# before the tokenizers are imported or used: their thread pool is otherwise one thread per core
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch

from pmi_reward.data.pairs import load_pairs
from pmi_reward.scoring.scorer import PMIScorer


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scorer", required=True, help="a scorer directory or Hub repo id")
    parser.add_argument("--input", default="../shared/data/pmiscore/datasets/empirical/en/test.csv")
    parser.add_argument("--pairs", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    scorer = PMIScorer.from_pretrained(args.scorer)
    encoder = scorer.encoder
    encoder.cache = None
    pairs = load_pairs(args.input)
    contexts = [pairs.contexts[i] for i in pairs.ctx[: args.pairs]]
    replies = [pairs.responses[i] for i in pairs.resp[: args.pairs]]
    constant = torch.nn.functional.normalize(torch.ones(1, encoder.dim), dim=-1)
    encoder._forward = lambda batch, runtime=True: constant.expand(batch["input_ids"].shape[0], -1)
    seconds = []
    for _ in range(args.repeats):
        texts = encoder.stats.texts
        start = time.perf_counter()
        scorer.score(contexts, replies)
        seconds.append(round(time.perf_counter() - start, 3))
    result = {
        "scorer": args.scorer,
        "pairs": len(contexts),
        "threads": args.threads,
        "tokenizers_parallelism": os.environ.get("TOKENIZERS_PARALLELISM"),
        "texts_per_call": encoder.stats.texts - texts,
        "seconds": seconds,
        "min_s": min(seconds),
        "median_s": statistics.median(seconds),
    }
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

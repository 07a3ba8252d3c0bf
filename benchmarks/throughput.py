"""Scoring throughput: ``PMIScorer.score`` against a bare forward of the same encoder, in one run.

Both sides embed the same texts at the same batch size and token lengths: the bare side gets them
pre-tokenized (contexts keep their end, responses their start, as the scorer cuts them) and sorted by
length, and times only ``model(**batch)``; the scorer side times the whole public call (cutting,
tokenizing, batching, pooling, the head) with the embedding cache off, so nothing is skipped. Runs
alternate, after one untimed call of each side (allocator, kernels); the fastest run of each is compared (on
a shared machine the minimum is the run least disturbed by other load), the medians are printed too. Prints
pairs/s for both, the ratio, peak memory. The HF tokenizers run on one thread (``TOKENIZERS_PARALLELISM=false``,
as the Makefile sets it) unless the environment says otherwise, so that ``--threads 1`` means one thread on the
scorer side too, the only side that tokenizes while timed; the result records the setting.

    python benchmarks/throughput.py --model minilm --input_mode pair --pairs 512 --batch_size 64 --threads 1 --repeats 5
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

# before the tokenizers are imported or used: their thread pool is otherwise one thread per core
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch
from trl import TrlParser

from pmi_reward.data.pairs import load_pairs
from pmi_reward.memory import peak_rss_mib
from pmi_reward.scoring.encoder import EncoderSpec, TextEncoder
from pmi_reward.scoring.features import newest_lines
from pmi_reward.scoring.head import HeadConfig, PMIHead
from pmi_reward.scoring.scorer import PMIScorer
from pmi_reward.scoring.templates import TEMPLATES, PromptTemplate, fill


@dataclass
class BenchArguments:
    input: str = field(
        default="../shared/data/pmiscore/datasets/empirical/en/test.csv",
        metadata={"help": "pair file whose first --pairs rows are scored"},
    )
    model: str = "minilm"
    dtype: str = "float32"
    input_mode: str = "pair"
    pairs: int = 512
    batch_size: int = 64
    max_length: int = 256
    repeats: int = 3
    threads: int | None = field(default=None, metadata={"help": "torch threads (default: torch's)"})


def bare_batches(
    encoder: TextEncoder,
    contexts: list[str],
    responses: list[str],
    mode: str,
    template: PromptTemplate,
    line_turns: int = 0,
) -> list[dict]:
    """The token batches the scorer's encoder would run, padded per batch, longest first.

    ``template``: the scorer's own (its pair prompt in prompt mode, its context and reply wrappers in pair mode), so
    that the bare forward embeds the texts the scorer embeds. ``line_turns``: a scorer with line features also embeds
    each context's newest lines, as replies are embedded.
    """
    tok, n = encoder.tokenizer, encoder.spec.max_length
    if mode == "prompt":
        pair = template.pair_template
        texts = [fill(pair, context=c, response=r) for c, r in zip(contexts, responses, strict=True)]
        ids = tok(texts, truncation=True, max_length=n)["input_ids"]
    else:
        tok.truncation_side = "left"
        written = [fill(template.context_template, context=c) for c in contexts]
        ids = tok(written, truncation=True, max_length=n)["input_ids"]
        tok.truncation_side = "right"
        lines = list(dict.fromkeys(line for c in contexts for line in newest_lines(c, line_turns)))
        replies = [fill(template.response_template, response=r) for r in responses + lines]
        ids += tok(replies, truncation=True, max_length=n)["input_ids"]
    ids.sort(key=len, reverse=True)
    bs = encoder.spec.encode_batch_size
    return [tok.pad({"input_ids": ids[s : s + bs]}, return_tensors="pt") for s in range(0, len(ids), bs)]


def main(argv: list[str] | None = None) -> int:  # set-up, two timed loops, one report: read top to bottom
    (args,) = TrlParser((BenchArguments,), prog="benchmarks/throughput.py").parse_args_and_config(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    pairs = load_pairs(Path(args.input))
    # distinct contexts and responses only: the scorer embeds a repeated text once, the bare side would not
    seen_c, seen_r, rows = set(), set(), []
    for c, r in zip(pairs.ctx.tolist(), pairs.resp.tolist(), strict=True):
        if c not in seen_c and r not in seen_r and len(rows) < args.pairs:
            seen_c.add(c), seen_r.add(r), rows.append((pairs.contexts[c], pairs.responses[r]))
    contexts, responses = [c for c, _ in rows], [r for _, r in rows]
    encoder = TextEncoder(
        EncoderSpec(args.model, dtype=args.dtype, max_length=args.max_length, encode_batch_size=args.batch_size),
        cache=None,
    )
    head = PMIHead(HeadConfig(encoder.dim, args.input_mode))
    scorer = PMIScorer(encoder, TEMPLATES["en"], head)
    batches = bare_batches(encoder, contexts, responses, args.input_mode, scorer.template)
    tokens = sum(int(b["attention_mask"].sum()) for b in batches)

    def bare() -> None:
        with torch.inference_mode():
            for batch in batches:
                encoder.model(**batch)

    def scored() -> None:
        scorer.score(contexts, responses)

    bare()  # warm-up (allocator, kernels), both sides, so that neither's first timed run pays it
    scored()
    rss_warm = peak_rss_mib()
    counted = encoder.stats.tokens
    times: dict[str, list[float]] = {"bare": [], "scorer": []}
    for _ in range(args.repeats):
        for name, fn in (("bare", bare), ("scorer", scored)):
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    bare_s, scorer_s = min(times["bare"]), min(times["scorer"])
    n = len(contexts)
    result = {
        "model": args.model,
        "dtype": args.dtype,
        "input_mode": args.input_mode,
        "pairs": n,
        "batch_size": args.batch_size,
        "bare_tokens_per_pass": tokens,
        "scorer_tokens_per_pass": (encoder.stats.tokens - counted) // args.repeats,
        "torch_threads": torch.get_num_threads(),
        "tokenizers_parallelism": os.environ.get("TOKENIZERS_PARALLELISM"),
        "bare_pairs_per_s": round(n / bare_s, 1),
        "scorer_pairs_per_s": round(n / scorer_s, 1),
        "ratio_scorer_over_bare": round(bare_s / scorer_s, 3),
        "ratio_of_medians": round(statistics.median(times["bare"]) / statistics.median(times["scorer"]), 3),
        "peak_rss_mib_after_warmup": round(rss_warm, 1),
        "peak_rss_mib": round(peak_rss_mib(), 1),
        "runs_s": {k: [round(t, 2) for t in v] for k, v in times.items()},
    }
    if torch.cuda.is_available():
        result["peak_cuda_mib"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
    print(json.dumps(result, indent=1))
    print(f"scorer / bare forward throughput: {result['ratio_scorer_over_bare']:.3f} (target >= 0.9)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

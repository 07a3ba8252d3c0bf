"""verl's in-process reward under its reward loop: per-response ``compute_score`` calls from a thread pool, merged
into shared scorer calls (``MergedReward``), against one ``PMIReward`` call per prompt group and against calls made
one at a time (the legacy naive manager). MiniLM with a random head (speed only; the scores are compared, not read).

    python benchmarks/verl_merge.py --threads 1 --wait_ms 2
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

import pmi_reward.rewards.verl as verl  # noqa: E402
from pmi_reward.rewards.reward import PMIReward  # noqa: E402
from pmi_reward.scoring.encoder import EncoderSpec, TextEncoder  # noqa: E402
from pmi_reward.scoring.head import HeadConfig, PMIHead  # noqa: E402
from pmi_reward.scoring.scorer import PMIScorer  # noqa: E402
from pmi_reward.scoring.templates import TEMPLATES  # noqa: E402

WORDS = "the hiking trip was long and we saw bears near the lake before the storm came in over the ridge".split()  # noqa: SIM905


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--wait_ms", type=float, default=verl.MERGE_WAIT_MS, help="the merging worker's wait")
    parser.add_argument("--prompts", type=int, default=32, help="prompts, each with --group responses")
    parser.add_argument("--group", type=int, default=8, help="responses per prompt (verl's rollout.n)")
    parser.add_argument("--pool", type=int, default=8, help="threads calling compute_score at once")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    logging.disable(logging.WARNING)
    verl.MERGE_WAIT_MS = args.wait_ms
    folder = tempfile.mkdtemp() + "/scorer"
    torch.manual_seed(0)
    encoder = TextEncoder(EncoderSpec("minilm"), device="cpu")
    head = PMIHead(HeadConfig(dim=encoder.dim, line_turns=1))
    PMIScorer(encoder, TEMPLATES["en"], head, context_turns=3).save_pretrained(folder)
    contexts = ["\n".join(" ".join(WORDS[(p + t) % 7 :][:12]) + f" {p}" for t in range(3)) for p in range(args.prompts)]
    jobs = [(c, f"wow, what happened next {k}? did you stay at the lake {p}") for p, c in enumerate(contexts)
            for k in range(args.group)]  # fmt: skip
    reward = PMIReward.from_pretrained(folder, device="cpu")
    reward([contexts[0]], ["warm up"])
    start = time.perf_counter()
    for c in contexts:
        reward([c] * args.group, [r for cc, r in jobs if cc == c])
    grouped = time.perf_counter() - start

    def call(job: tuple[str, str]) -> float:
        return verl.compute_score("d", job[1], None, {"context": job[0]}, scorer=folder, device="cpu")["score"]

    call(("warm", "up"))
    start = time.perf_counter()
    with ThreadPoolExecutor(args.pool) as pool:
        merged = list(pool.map(call, jobs))
    threaded = time.perf_counter() - start
    batcher = verl._reward(*verl._settings({"scorer": folder, "device": "cpu"})).batcher  # type: ignore[union-attr]
    start = time.perf_counter()
    for job in jobs[:64]:
        call(job)
    one = (time.perf_counter() - start) / 64
    alone = [reward([c], [r])[0] for c, r in jobs]
    print(json.dumps({
        "responses": len(jobs), "wait_ms": args.wait_ms, "torch_threads": args.threads,
        "pmireward_per_group_s": round(grouped, 2), "verl_threads_s": round(threaded, 2),
        "mean_merged_pairs": batcher.stats.to_dict()["mean_batch_pairs"],
        "one_at_a_time_ms_per_call": round(one * 1000, 1),
        "max_abs_diff_vs_per_call": max(abs(a - b) for a, b in zip(merged, alone, strict=True)),
        "load_average": round(os.getloadavg()[0], 2),
        "tokenizers_parallelism": os.environ.get("TOKENIZERS_PARALLELISM"),
    }))  # fmt: skip


if __name__ == "__main__":
    main()

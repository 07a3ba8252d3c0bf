"""The policy's cost in float32 and bfloat16 on this machine: why ``check_bf16`` warns on CPUs without native bf16.

SmolLM2-135M-Instruct (the default policy) on the CPU, even where there is a GPU, in each dtype: one batch of
``--batch`` chat prompts sampled to ``--new_tokens`` tokens (T 0.8, top-p 0.95, as the recipes sample), then
``--steps`` forward+backward passes of 8 x 150 random tokens (a full-parameter SFT step's compute), after one untimed
warm-up pass. Prints seconds per phase and whether the CPU counts as computing bf16 faster (AMX, or AVX512-BF16 on a
non-Intel CPU; ``native_bf16``). The HF tokenizers run on one thread (``TOKENIZERS_PARALLELISM=false``, as the Makefile
sets it) unless the environment says otherwise; the result records the setting.

    python benchmarks/bf16_cpu.py
"""

from __future__ import annotations

import argparse
import json
import os
import time

# before the tokenizers are imported or used: their thread pool is otherwise one thread per core
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch

from pmi_reward.policy.loading import load_policy
from pmi_reward.scoring.models import native_bf16


def _time(dtype: str, batch: int, new_tokens: int, steps: int) -> dict[str, float]:
    model, tokenizer = load_policy(dtype=dtype, device="cpu")  # load_policy's default is the GPU where there is one
    messages = [
        [{"role": "user", "content": f"I went hiking near lake number {i}. What do you do for fun?"}]
        for i in range(batch)
    ]
    enc = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, return_tensors="pt", padding=True, return_dict=True
    )
    start = time.perf_counter()
    with torch.no_grad():
        model.generate(
            **enc, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=True, temperature=0.8, top_p=0.95
        )
    sample = time.perf_counter() - start
    model.train()
    ids = torch.randint(0, 1000, (8, 150))
    model(input_ids=ids, labels=ids).loss.backward()  # warm-up (allocator, gradient buffers), so no step timed pays it
    start = time.perf_counter()
    for _ in range(steps):
        model(input_ids=ids, labels=ids).loss.backward()
    return {"sample_s": round(sample, 1), "train_s_per_step": round((time.perf_counter() - start) / steps, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--new_tokens", type=int, default=64)
    parser.add_argument("--steps", type=int, default=2)
    args = parser.parse_args()
    torch.manual_seed(0)
    result = {
        "native_bf16": native_bf16(torch.device("cpu")),
        "threads": torch.get_num_threads(),
        "tokenizers_parallelism": os.environ.get("TOKENIZERS_PARALLELISM"),
    }
    for dtype in ("float32", "bfloat16"):
        result[dtype] = _time(dtype, args.batch, args.new_tokens, args.steps)
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()

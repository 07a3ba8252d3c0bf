"""A model with a real model's architecture and tokenizer and random weights, for device checks where the real
weights cannot travel (the GPU machine has no internet, and what travels there is capped at 64 MiB).

    python benchmarks/random_weights.py SOURCE [OUT]

SOURCE: a model folder whose config.json and tokenizer files are read (its weights are not); OUT (default: SOURCE
itself) gets float32 random weights (seed 0) beside a copy of every other file of SOURCE, and loads as the real
model does: a causal LM (its config names a ``...ForCausalLM``) as a policy, any other model as an encoder. A random
policy never chooses its end-of-turn token, so every reply runs to the token limit: its sampling and training times
are those of the longest replies (an upper bound), and a random encoder makes every score meaningless. Such a check
shows where each part runs and how long it takes, nothing about quality.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

WEIGHTS = ("*.safetensors", "*.bin", "*.gguf", "*.onnx")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path, help="model folder: config.json, tokenizer and other files")
    parser.add_argument("out", type=Path, nargs="?", help="folder to write the random model into (default: source)")
    args = parser.parse_args(argv)
    out = args.out or args.source
    if out.resolve() != args.source.resolve():
        shutil.copytree(args.source, out, ignore=shutil.ignore_patterns(*WEIGHTS), dirs_exist_ok=True)
    torch.manual_seed(0)
    config = AutoConfig.from_pretrained(args.source)
    causal = any(a.endswith("ForCausalLM") for a in config.architectures or [])
    model = (AutoModelForCausalLM if causal else AutoModel).from_config(config, dtype=torch.float32)
    model.save_pretrained(out)
    count = sum(p.numel() for p in model.parameters())
    print(f"{out}: {config.model_type} ({'causal LM' if causal else 'encoder'}), {count / 1e6:.1f}M parameters, random")


if __name__ == "__main__":
    main()

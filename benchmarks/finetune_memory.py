"""Peak memory and time of encoder fine-tuning steps, under the options that change them.

``--steps`` training steps of MiniLM (``train_encoder full``) on batches of ``--batch_size`` random Chit-Chat pairs
of the first ``--dialogues`` dialogues (3-turn contexts, each pair with 4 random replies and the 3 context lines of
the line features, as ``make scorer`` embeds them), through the same ``TrainableFeatures`` as ``pmi-reward train``,
with AdamW on the encoder; a stand-in loss on the embeddings (the head's cost is negligible). One setting per
process, so that each peak RSS (``ru_maxrss``) is its own. The HF tokenizers run on one thread
(``TOKENIZERS_PARALLELISM=false``, as the Makefile sets it) unless the environment says otherwise; the result records
the setting:

    python benchmarks/finetune_memory.py --attention_dropout 0.1                          # MiniLM's own dropout
    python benchmarks/finetune_memory.py --attention_dropout 0.1 --activation_checkpointing  # make scorer's setting
    python benchmarks/finetune_memory.py --attention_dropout 0.0
"""

from __future__ import annotations

import argparse
import json
import os
import time

# before the tokenizers are imported or used: their thread pool is otherwise one thread per core
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np
import torch

from pmi_reward.data.dialogues import load_dialogues
from pmi_reward.data.pairs import PairSet
from pmi_reward.memory import peak_rss_mib
from pmi_reward.scoring.encoder import EncoderSpec, TextEncoder
from pmi_reward.scoring.models import native_bf16
from pmi_reward.scoring.templates import TEMPLATES
from pmi_reward.training.trainable import TrainableFeatures, make_trainable


def _rss_mib() -> float:
    """This process's resident memory now, in MiB (``VmRSS``), or where there is no ``/proc`` (macOS) its peak so far
    (``peak_rss_mib``): the steps' figures then only rise."""
    try:
        with open("/proc/self/status") as f:
            return int(next(line for line in f if line.startswith("VmRSS:")).split()[1]) // 1024
    except FileNotFoundError:
        return round(peak_rss_mib(), 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--attention_dropout", type=float, default=None, help="None: the model's own (0.1)")
    parser.add_argument("--activation_checkpointing", action="store_true")
    parser.add_argument("--bf16", choices=["auto", "true", "false"], default="auto")
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--dialogues", type=int, default=600)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    pairs = PairSet.from_dialogues(load_dialogues("chitchat")[: args.dialogues], 3, max_pairs_per_dialogue=8, seed=0)
    encoder = TextEncoder(EncoderSpec(model="minilm", max_length=256, encode_batch_size=64), device="cpu")
    make_trainable(
        encoder,
        "full",
        attention_dropout=args.attention_dropout,
        activation_checkpointing=args.activation_checkpointing,
    )
    bf16 = native_bf16(encoder.device) if args.bf16 == "auto" else args.bf16 == "true"
    features = TrainableFeatures(encoder, TEMPLATES["en"], pairs, line_turns=3, bf16=bf16)
    encoder.model.train()
    optim = torch.optim.AdamW(encoder.model.parameters(), lr=1e-5)
    rng = np.random.default_rng(0)
    start, rss = time.perf_counter(), []
    for _ in range(args.steps):
        batch = rng.choice(len(pairs), args.batch_size, replace=False)
        ctx, negatives = pairs.ctx[batch], pairs.resp[rng.choice(len(pairs), (args.batch_size, 4))]
        u, v = features(np.r_[ctx, np.repeat(ctx, 4)], np.r_[pairs.resp[batch], negatives.ravel()])
        loss = u.square().sum() + v.pow(3).sum()
        optim.zero_grad(set_to_none=True)
        loss.backward()
        optim.step()
        rss.append(_rss_mib())
    result = {
        "attention_dropout": args.attention_dropout,
        "activation_checkpointing": args.activation_checkpointing,
        "bf16": bf16,
        "threads": args.threads,
        "tokenizers_parallelism": os.environ.get("TOKENIZERS_PARALLELISM"),
        "steps": args.steps,
        "batch_size": args.batch_size,
        "seconds": round(time.perf_counter() - start, 1),
        "peak_rss_mib": round(peak_rss_mib(), 1),
        "rss_mib_after_steps": rss[:: max(1, args.steps // 6)],
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()

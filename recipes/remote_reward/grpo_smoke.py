"""GRPO whose reward comes from a ``pmi-reward serve`` server over HTTP: a smoke run of the remote path.

Starts ``pmi-reward serve --scorer DIR --port 0`` in a subprocess (or uses ``--url``), trains a chat policy
for a few GRPO steps with ``RemotePMIReward`` as the only reward function, prints the reward TRL logged at
every step and the server's counters, then stops the server with SIGTERM and checks that it drained and
exited cleanly. ``--policy tiny`` is a randomly initialised 2-layer model on SmolLM2's tokenizer (seconds
per step on a CPU); ``--policy smollm2`` is SmolLM2-135M-Instruct.

    python recipes/remote_reward/grpo_smoke.py --scorer outputs/scorer-minilm --policy tiny --steps 4
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable
from typing import TextIO

from pmi_reward.data.dialogues import load_dialogues
from pmi_reward.rewards.remote import RemotePMIReward, api_key_from_env, request_json
from pmi_reward.scoring.models import load_causal_lm, load_tokenizer


def chat_prompts(n: int, turns: int = 3) -> list[list[dict]]:
    """The first ``turns`` turns of ``n`` Chit-Chat dialogues as chat prompts that end on a user turn."""
    prompts = []
    for dialogue in load_dialogues("chitchat", limit=4 * n):
        history = list(dialogue.turns[:turns])
        if len(history) % 2 == 0:
            history = history[1:]
        roles = ["user", "assistant"] * turns
        prompts.append([{"role": r, "content": t} for r, t in zip(roles, history, strict=False)])
        if len(prompts) == n:
            break
    return prompts


def tiny_policy(tokenizer):
    """A 2-layer Llama with SmolLM2's vocabulary and random weights (generation plumbing, not quality)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=512,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
    )
    return LlamaForCausalLM(config)


def train_grpo(
    url: str,
    policy,
    tokenizer,
    prompts: list[list[dict]],
    steps: int,
    num_generations: int,
    max_completion_length: int,
    output_dir: str,
) -> list[dict]:
    """GRPO for ``steps`` steps with the remote PMI reward; TRL's log history."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    config = GRPOConfig(
        output_dir=output_dir,
        use_cpu=True,
        bf16=False,
        max_steps=steps,
        learning_rate=1e-5,
        per_device_train_batch_size=num_generations,
        num_generations=num_generations,
        max_completion_length=max_completion_length,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        seed=0,
        dataloader_num_workers=0,
        activation_checkpointing=True,  # TRL's GRPO default, by transformers 5's name
    )
    reward = RemotePMIReward(url, name="pmi_remote", timeout=30.0, retries=2)
    trainer = GRPOTrainer(
        model=policy,
        reward_funcs=[reward],
        args=config,
        processing_class=tokenizer,
        train_dataset=Dataset.from_list([{"prompt": p} for p in prompts]),
    )
    trainer.train()
    return trainer.state.log_history


def _copy_lines(source: Iterable[str], sink: TextIO) -> None:
    """Copy ``source`` to ``sink`` line by line until end of file (the server's stderr after its "listening on")."""
    for line in source:
        sink.write(line)


def start_server(scorer: str) -> tuple[subprocess.Popen, str, threading.Thread]:
    """``pmi-reward serve`` on a free loopback port; returns once it listens, with the thread that keeps copying its
    stderr to ours. The server writes an access-log line per request: a pipe nobody reads fills (64 KiB, about 900
    requests) and the server then blocks inside its request handler, so every later reward request times out. Join
    the thread after the server exits to have its last lines."""
    process = subprocess.Popen(
        [sys.executable, "-m", "pmi_reward.cli.main", "serve", "--scorer", scorer, "--port", "0", "--device", "cpu"],
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 300
    for line in process.stderr:
        sys.stderr.write(line)
        match = re.search(r"listening on (http://\S+)", line)
        if match:
            drain = threading.Thread(target=_copy_lines, args=(process.stderr, sys.stderr), daemon=True)
            drain.start()
            return process, match.group(1), drain
        if time.time() > deadline:
            break
    process.kill()
    raise RuntimeError("pmi-reward serve did not start")


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scorer", help="scorer directory to serve (or give --url)")
    parser.add_argument("--url", help="a running pmi-reward serve server")
    parser.add_argument("--policy", default="tiny", help="tiny | smollm2 | any causal LM")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--num_generations", type=int, default=4)
    parser.add_argument("--max_completion_length", type=int, default=24)
    args = parser.parse_args()
    if bool(args.scorer) == bool(args.url):
        parser.error("give --scorer or --url")
    return args


def main() -> int:
    args = _arguments()
    server, url, drain = start_server(args.scorer) if args.scorer else (None, args.url, None)
    try:
        tokenizer = load_tokenizer("smollm2" if args.policy == "tiny" else args.policy)
        policy = tiny_policy(tokenizer) if args.policy == "tiny" else load_causal_lm(args.policy)
        start = time.perf_counter()
        with tempfile.TemporaryDirectory() as out:
            history = train_grpo(
                url,
                policy,
                tokenizer,
                chat_prompts(args.prompts),
                args.steps,
                args.num_generations,
                args.max_completion_length,
                out,
            )
        seconds = time.perf_counter() - start
        steps = [h for h in history if "rewards/pmi_remote/mean" in h]
        for h in steps:
            print(
                json.dumps(
                    {
                        k: round(h[k], 4)
                        for k in (
                            "step",
                            "rewards/pmi_remote/mean",
                            "rewards/pmi_remote/std",
                            "pmi_remote/raw_pmi_mean",
                            "pmi_remote/empty_frac",
                        )
                        if k in h
                    }
                )
            )
        health = request_json(url + "/health", api_key=api_key_from_env())  # the key the server was started with
        print(
            json.dumps(
                {
                    "grpo_steps": len(steps),
                    "train_seconds": round(seconds, 1),
                    "server": url,
                    "server_batcher": health["batcher"],
                    "server_responses": health["responses"],
                }
            )
        )
        ok = len(steps) == args.steps and health["batcher"]["requests"] > 0
    finally:
        if server is not None:
            server.send_signal(signal.SIGTERM)
            code = server.wait(timeout=60)
            drain.join(timeout=60)  # the server's last lines (SIGTERM, draining, stopped) are copied
            print(json.dumps({"server_exit_code": code}))
            ok = ok and code == 0 if "ok" in locals() else False
    return 0 if ok else 1


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.exit(main())

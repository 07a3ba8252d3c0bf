"""Throughput of ``pmi-reward serve`` against in-process ``PMIScorer.score`` on the same pairs.

The inputs are the first ``--pairs`` (context, response) pairs of the Chit-Chat corpus (contexts of up to 3
turns), cut into ``/score`` requests of ``--per_request`` pairs (a GRPO group's worth). The server runs as
its own process (``pmi-reward serve``, no embedding cache), as it would on a reward host; 1, 8 and 32
client threads on keep-alive connections send all requests. The in-process reference scores the same
pairs with one ``PMIScorer.score`` call (the encoder batches them itself: the best an in-process reward can
do) and, for context, one call per request. Each repeat measures every mode in turn, so that a ratio
compares runs under like load; the table gives medians over ``--repeats`` and the machine's 1-minute load average
as each mode's run of each repeat ended, because on a shared machine load moves the figures (``--threads 1``
avoids the worst of it: two torch threads on two busy cores spend their time waiting for each other). The HF
tokenizers, here and in the server (which inherits the environment), run on one thread
(``TOKENIZERS_PARALLELISM=false``, as the Makefile sets it) unless the environment says otherwise, so that
``--threads 1`` holds for the tokenizing too; the summary line records the setting.

    python benchmarks/server_throughput.py --scorer outputs/scorer-minilm --threads 1 --encode_batch_size 8
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from functools import partial
from typing import IO

# before the tokenizers are imported or used: their thread pool is otherwise one thread per core
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch
from loadtest import run_load, score_bodies

from pmi_reward.data.dialogues import load_dialogues
from pmi_reward.data.pairs import PairSet
from pmi_reward.evaluation.report import markdown_table
from pmi_reward.rewards.remote import request_json
from pmi_reward.scoring.scorer import PMIScorer


def chitchat_pairs(n: int) -> tuple[list[str], list[str]]:
    pairs = PairSet.from_dialogues(load_dialogues("chitchat", limit=n), max_context_turns=3)
    return pairs.context_texts[:n], pairs.response_texts[:n]


def load() -> float:
    return round(os.getloadavg()[0], 2)


def start_server(
    scorer: str, max_batch_pairs: int, encode_batch: int | None, runtime: dict[str, str]
) -> tuple[subprocess.Popen, str]:
    extra = ["--encode_batch_size", str(encode_batch)] if encode_batch else []
    for key, value in runtime.items():
        extra += [f"--{key}", value]
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pmi_reward.cli.main",
            "serve",
            "--scorer",
            scorer,
            "--port",
            "0",
            "--device",
            "cpu",
            "--max_batch_pairs",
            str(max_batch_pairs),
            *extra,
        ],
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert process.stderr is not None
    for line in process.stderr:
        if match := re.search(r"listening on (http://\S+)", line):
            threading.Thread(target=forward_log, args=(process.stderr,), daemon=True).start()
            return process, match.group(1)
    raise RuntimeError("pmi-reward serve did not start")


def forward_log(stream: IO[str]) -> None:
    """Read the server's log to its end, passing on all but the access log (a line per request): a pipe nobody reads
    fills up (64 kB), then the server's logging blocks, and with it every request."""
    for line in stream:
        if not re.search(r" INFO .* items=", line):
            sys.stderr.write(line)


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scorer", required=True, help="a scorer directory (pmi-reward train)")
    parser.add_argument("--pairs", type=int, default=512)
    parser.add_argument("--per_request", type=int, default=8)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max_batch_pairs", type=int, default=256)
    parser.add_argument(
        "--encode_batch_size",
        type=int,
        default=None,
        help="encoder batch on both sides (default: the scorer's); on a CPU small batches pad less",
    )
    parser.add_argument("--backend", default=None, help="torch | onnx, on both sides (default: torch)")
    parser.add_argument("--quantize", default=None, help="none | int8, on both sides (onnx only)")
    parser.add_argument("--dtype", default=None, help="float32 | bfloat16 | auto, on both sides (torch backend)")
    parser.add_argument(
        "--threads", type=int, default=None, help="torch threads on both sides (default: torch's choice, one per core)"
    )
    return parser.parse_args()


def print_table(modes: list[str], runs: dict[str, list[dict]]) -> None:
    """Medians over the repeats, one line per mode, with the load average as that mode's run of each repeat ended."""
    rows = []
    for mode in modes:
        med = {
            k: round(statistics.median(r[k] for r in runs[mode]), 3 if k == "ratio" else 1)
            for k in ("pairs_per_s", "p50_ms", "p99_ms", "ratio")
            if k in runs[mode][0]
        }
        loads = [r["load1"] for r in runs[mode]]
        rows.append([mode, med["pairs_per_s"], med.get("p50_ms", ""), med.get("p99_ms", ""), med["ratio"], loads])
    headers = ["mode", "pairs/s", "p50 ms", "p99 ms", "ratio to one in-process call", "load (1 min)"]
    print(markdown_table(headers, rows))


def main() -> int:
    args = _arguments()
    if args.threads:
        torch.set_num_threads(args.threads)
        os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(args.threads)

    contexts, responses = chitchat_pairs(args.pairs)
    bodies = score_bodies(contexts, responses, args.per_request)
    runtime = {k: v for k, v in (("backend", args.backend), ("quantize", args.quantize), ("dtype", args.dtype)) if v}
    scorer = PMIScorer.from_pretrained(args.scorer, device="cpu", **runtime)
    scorer.encoder.set_batch_size(args.encode_batch_size)
    scorer.score(contexts[:64], responses[:64])  # warm up

    def in_process(per_request: bool) -> dict:
        start = time.perf_counter()
        if per_request:
            for body in bodies:
                scorer.score([p["context"] for p in body["pairs"]], [p["response"] for p in body["pairs"]])
        else:
            scorer.score(contexts, responses)
        return {"pairs_per_s": len(contexts) / (time.perf_counter() - start)}

    def served(url: str, clients: int) -> dict:
        result = run_load(url, bodies, clients)
        if result.errors:
            raise RuntimeError(f"{len(result.errors)} errors, e.g. {result.errors[0]}")
        return result.summary()

    server, url = start_server(args.scorer, args.max_batch_pairs, args.encode_batch_size, runtime)
    # the first mode is the reference of every ratio
    measures: dict[str, Callable[[], dict]] = {
        "in-process, one call": partial(in_process, False),
        "in-process, one call per request": partial(in_process, True),
        **{f"server, {c} clients": partial(served, url, c) for c in args.concurrency},
    }
    modes = list(measures)
    runs: dict[str, list[dict]] = {m: [] for m in modes}
    try:
        run_load(url, bodies[:8], clients=2)  # warm up
        for repeat in range(args.repeats):  # every repeat measures all modes, so each ratio compares like load
            # each mode's load average is read as its own run ends, not once for the whole repeat
            measured = [(measure(), load()) for measure in measures.values()]
            reference = measured[0][0]["pairs_per_s"]
            for mode, (m, load1) in zip(modes, measured, strict=True):
                runs[mode].append({**m, "ratio": m["pairs_per_s"] / reference, "load1": load1})
                print(json.dumps({"repeat": repeat, "mode": mode, **runs[mode][-1]}), flush=True)
        batcher = request_json(url + "/health")["batcher"]
    finally:
        server.terminate()
        server.wait(timeout=60)

    threads, spec = args.threads or torch.get_num_threads(), scorer.encoder.spec
    print(
        f"\n{len(contexts)} Chit-Chat pairs, {args.per_request} per request, {os.cpu_count()} CPUs, "
        f"{threads} torch threads, TOKENIZERS_PARALLELISM={os.environ.get('TOKENIZERS_PARALLELISM')}, "
        f"encoder {spec.model} ({spec.backend}, {spec.quantize}, {spec.dtype}) in batches of {spec.encode_batch_size}, "
        f"median of {args.repeats}; server batches: {batcher}"
    )
    print_table(modes, runs)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.exit(main())

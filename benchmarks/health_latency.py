"""``/health`` and 1-pair requests while the reward server scores a maximal request, and how long hostile inputs take.

The server runs as its own process (``pmi-reward serve``, as ``server_throughput.py`` starts it) with its DEFAULT
limits (``ServerConfig()``, ``RewardOptions()``; ``--set NAME=VALUE`` changes one). One maximal ``/score`` request is
sent: ``max_pairs`` distinct pairs holding together as many characters of text as ``max_request_chars`` allows (keys
included, as the server counts them), computed from the limits. While it is being scored, ``GET /health`` is
probed every ``--probe_ms`` on a keep-alive connection of its own, and a 1-pair ``/score`` request is sent every
``--small_s`` on another. Printed: the maximal request's size, wall time and status; the probes' count and
p50/p99/max milliseconds; the 1-pair requests' statuses and p50/max; how long the server's threads ran and waited
for a CPU meanwhile. Then each hostile input of ``tests/test_hostile_server.py`` and issue 11 (the ``"[INST]" *
32000`` query, 160 replies of 100k characters, 16 MiB of ``[0,0,...]``, garbled request lines, smuggling-prone
headers, a maximal ``/get_reward``, ...) is sent alone on a fresh connection once the scorer is idle, with
``/health`` probed meanwhile: its status, its answer time and the slowest probe. ``--output`` writes it all as JSON.
The server inherits this script's environment, in which the HF tokenizers run on one thread
(``TOKENIZERS_PARALLELISM=false``, as the Makefile sets it) unless the environment says otherwise, so that
``--threads 1`` holds for its tokenizing too; the summary records the setting.

    python benchmarks/health_latency.py --scorer outputs/scorer --threads 1 --encode_batch_size 8 --output health.json
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import math
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from functools import partial
from typing import Any
from urllib.parse import urlsplit

# before the tokenizers are imported or used (here: by the server this script starts, which inherits it): their
# thread pool is otherwise one thread per core
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np
from server_throughput import load, start_server

from pmi_reward.rewards.options import RewardOptions
from pmi_reward.serving.config import ServerConfig
from pmi_reward.serving.endpoints import text_chars

JSON = {"Content-Type": "application/json"}
WORDS = " ".join(
    [
        "the of and to in is was for on that with as by at from his her they we you it this be are or not but had",
        "hiking trip Yosemite Half Dome weather music guitar jazz pizza dinner bread tennis match train Paris spring",
        "yesterday tomorrow really maybe think know love like great nice sorry thanks question answer story have",
    ]
).split(" ")


# -- what is sent --------------------------------------------------------------------------------------------------
def prose(n: int, seed: int = 0) -> str:
    """``n`` characters of word-like text (the encoder's tokenizer sees words, not one endless token)."""
    rng = np.random.default_rng(seed)
    out, size = [], 0
    while size < n:
        word = WORDS[int(rng.integers(len(WORDS)))]
        out.append(word)
        size += len(word) + 1
    return " ".join(out)[:n]


def maximal_score_body(config: ServerConfig, options: RewardOptions) -> dict:
    """``max_pairs`` distinct pairs whose strings (keys included) total at most ``max_request_chars``, split evenly
    between contexts and replies (each at most ``max_chars``: the server would cut the rest), under
    ``max_body_bytes`` once encoded: the largest ``/score`` request the limits let through."""
    n = config.max_pairs
    keys = text_chars({"pairs": [{"context": "", "response": ""}] * n})
    per_pair = (config.max_request_chars - keys) // n
    size_c, size_r = min(per_pair - per_pair // 2, options.max_chars), min(per_pair // 2, options.max_chars)
    pool = prose(max(size_c, size_r) + 4 * n + 64)
    pairs = []
    for i in range(n):  # distinct texts: the scorer encodes each distinct text once
        head = f"{i} "
        pairs.append(
            {
                "context": (head + pool[i % 997 :])[:size_c],
                "response": (head + pool[(i * 7) % 991 :])[:size_r],
            }
        )
    body = {"pairs": pairs}
    assert text_chars(body) <= config.max_request_chars, text_chars(body)
    assert len(json.dumps(body).encode()) <= config.max_body_bytes
    return body


def maximal_get_reward_body(config: ServerConfig) -> dict:
    """``max_pairs`` ChatML queries (prompt + reply) with their prompts, within ``max_request_chars``."""
    n = config.max_pairs
    keys = text_chars({"query": [], "prompts": []})
    per_item = (config.max_request_chars - keys) // n  # a query holds its prompt: prompt + query = per_item
    user, assistant = "<|im_start|>user\n", "<|im_end|>\n<|im_start|>assistant\n"
    size_u = max(1, (per_item - 2 * (len(user) + len(assistant)) - len("<|im_end|>")) // 3)
    text = prose(size_u + 64 + 8 * n)
    queries, prompts = [], []
    for i in range(n):
        prompt = user + f"{i} " + text[i % 997 :][: size_u - len(str(i)) - 1] + assistant
        queries.append(prompt + f"{i} " + text[(i * 7) % 991 :][: size_u - len(str(i)) - 1] + "<|im_end|>")
        prompts.append(prompt)
    body = {"query": queries, "prompts": prompts}
    assert text_chars(body) <= config.max_request_chars, text_chars(body)
    assert len(json.dumps(body).encode()) <= config.max_body_bytes
    return body


def post(path: str, body: Any, headers: dict[str, str] | None = None) -> bytes:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    head = {"Host": "x", "Content-Type": "application/json", "Content-Length": str(len(data)), **(headers or {})}
    return (
        f"POST {path} HTTP/1.1\r\n".encode()
        + b"".join(f"{k}: {v}\r\n".encode() for k, v in head.items())
        + (b"\r\n" + data)
    )


def hostile_inputs(config: ServerConfig) -> list[tuple[str, bytes]]:
    """(what, the raw request) for the hostile inputs of issue 11 and ``tests/test_hostile_server.py``, against the
    default limits."""
    over = config.max_body_bytes + 1
    return [
        ('/get_reward, query "[INST]" * 32000 (192 kB)', post("/get_reward", {"query": ["[INST]" * 32000]})),
        (
            '/get_reward, query "[INST]\\n" * 32000 + a turn',
            post("/get_reward", {"query": ["[INST]\n" * 32000 + "hi [/INST] Hello!"]}),
        ),
        (
            "/score, 160 replies x 100k characters (16 MB)",
            post("/score", {"pairs": [{"context": "c", "response": "r" * 100_000}] * 160}),
        ),
        (
            f"/score, {config.max_body_bytes} bytes of [0,0,...] (too many JSON values)",
            post("/score", b'{"pairs": [' + b"0," * ((config.max_body_bytes - 16) // 2) + b"0]}"),
        ),
        (
            f"/score, {config.max_body_bytes} bytes: one reply (parsed, then too many characters)",
            post("/score", {"pairs": [{"context": "c", "response": "r" * (config.max_body_bytes - 48)}]}),
        ),
        (
            f"/score, Content-Length {over} (body not sent)",
            f"POST /score HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: {over}\r\n\r\n".encode(),
        ),
        (
            f"/score, {config.max_pairs + 1} pairs (max_pairs + 1)",
            post("/score", {"pairs": [{"context": "c", "response": "r"}] * (config.max_pairs + 1)}),
        ),
        (
            f"/score, {config.max_pairs} invisible replies (zero-width space)",
            post("/score", {"pairs": [{"context": "hi", "response": "\u200b"}] * config.max_pairs}),
        ),
        ("/score, JSON nested 100000 deep", post("/score", b"[" * 100_000)),
        ("/score, text/plain (cross-origin form)", post("/score", {"pairs": []}, {"Content-Type": "text/plain"})),
        ("garbled request line", b"GARBAGE\r\n\r\n"),
        ("HTTP/0.9 request line", b"GET /health\r\n\r\n"),
        ("TLS ClientHello on the plain port", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(range(40))),
        (
            "two Content-Length headers",
            b"POST /score HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: 2\r\nContent-Length: 3"
            b"\r\n\r\n{}",
        ),
        (
            "Transfer-Encoding: chunked",
            b"POST /score HTTP/1.1\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        ),
        ("70 kB request line", b"GET /" + b"a" * 70000 + b" HTTP/1.1\r\n\r\n"),
        ("120 header lines", b"GET /health HTTP/1.1\r\n" + b"X: y\r\n" * 120 + b"\r\n"),
        (
            f"/get_reward, maximal ({config.max_pairs} ChatML queries with prompts)",
            post("/get_reward", maximal_get_reward_body(config)),
        ),
    ]


# -- what is measured ----------------------------------------------------------------------------------------------
@dataclass
class Prober:
    """Sends ``request`` every ``interval`` seconds on one keep-alive connection, from its own thread, until stopped;
    records each answer's status and milliseconds (a failed request: status None, and a fresh connection)."""

    url: str
    method: str
    path: str
    interval: float
    body: bytes | None = None
    timeout: float = 300.0
    statuses: list[int | None] = field(default_factory=list)
    ms: list[float] = field(default_factory=list)
    at: list[float] = field(default_factory=list)  # seconds from the start of probing
    errors: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _connect(self) -> http.client.HTTPConnection:
        return http.client.HTTPConnection(urlsplit(self.url).netloc, timeout=self.timeout)

    def _run(self) -> None:
        conn, start = self._connect(), time.perf_counter()
        while not self._stop.is_set():
            t0 = time.perf_counter()
            self.at.append(t0 - start)
            try:
                conn.request(self.method, self.path, body=self.body, headers=JSON if self.body else {})
                response = conn.getresponse()
                response.read()
                self.statuses.append(response.status)
            except (OSError, http.client.HTTPException) as err:
                self.statuses.append(None)
                self.errors.append(f"{type(err).__name__}: {err}")
                conn.close()
                conn = self._connect()
            self.ms.append((time.perf_counter() - t0) * 1000)
            self._stop.wait(max(0.0, self.interval - (time.perf_counter() - t0)))
        conn.close()

    def __enter__(self) -> Prober:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(self.timeout)

    def summary(self) -> dict:
        ms = np.array(self.ms) if self.ms else np.full(1, np.nan)
        return {
            "n": len(self.ms),
            "p50_ms": round(float(np.percentile(ms, 50)), 1),
            "p99_ms": round(float(np.percentile(ms, 99)), 1),
            "max_ms": round(float(ms.max()), 1),
            "max_at_s": round(self.at[int(ms.argmax())], 2) if self.ms else None,
            "statuses": {str(s): self.statuses.count(s) for s in sorted(set(self.statuses), key=str)},
            "errors": self.errors[:3],
        }


def exchange(url: str, data: bytes, timeout: float) -> tuple[int | str, str, float]:
    """Send raw bytes on a fresh connection and read one HTTP answer: (status, the error message or '', seconds).
    An answer that is not HTTP (no status line) or a dropped connection is reported as such, not raised."""
    host, port = urlsplit(url).netloc.split(":")
    t0 = time.perf_counter()
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        with contextlib.suppress(OSError):  # the server may answer and close before the body is all sent
            sock.sendall(data)
        response = http.client.HTTPResponse(sock)
        try:
            response.begin()
            payload = response.read()
        except (OSError, http.client.HTTPException) as err:
            return f"no answer ({type(err).__name__})", "", time.perf_counter() - t0
    try:
        message = str(json.loads(payload).get("error") or "")
    except (ValueError, AttributeError):
        message = payload[:100].decode("latin-1")
    return response.status, message[:120], time.perf_counter() - t0


def probed(url: str, send: Callable[[], tuple[int | str, str, float]], probe_s: float, small_s: float | None) -> dict:
    """``send()`` while ``/health`` is probed every ``probe_s`` (and a 1-pair ``/score`` sent every ``small_s``)."""
    small_body = json.dumps({"pairs": [{"context": "How was your trip?", "response": "Great, thanks!"}]}).encode()
    health = Prober(url, "GET", "/health", probe_s)
    small = Prober(url, "POST", "/score", small_s or 1.0, small_body)
    with health:
        if small_s:
            small.__enter__()
        try:
            status, message, seconds = send()
        finally:
            if small_s:
                small.__exit__()
    out = {"status": status, "seconds": round(seconds, 3), "error": message, "health": health.summary()}
    if small_s:
        out["one_pair"] = small.summary()
    return out


def cpu_seconds(pid: int) -> dict[str, float] | None:
    """Seconds the process's threads have run on a CPU and waited for one (Linux ``schedstat``; else None): a server
    that waits for a CPU while probes are slow was starved by other jobs, not stalled by its own work."""
    run = wait = 0.0
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/schedstat", encoding="ascii") as f:
                fields = f.read().split()
            run, wait = run + int(fields[0]) / 1e9, wait + int(fields[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return None
    return {"on_cpu_s": run, "waiting_for_cpu_s": wait}


def since(before: dict[str, float] | None, after: dict[str, float] | None) -> dict[str, float] | None:
    if before is None or after is None:
        return None
    return {k: round(after[k] - before[k], 2) for k in before}


def settle(url: str, timeout: float) -> None:
    """Wait until the scorer is free: a 1-pair request is answered only after any batch in progress (a request that
    timed out leaves its last batch running), so that the next measurement starts on an idle server."""
    exchange(url, post("/score", {"pairs": [{"context": "How are you?", "response": "Fine."}]}), timeout)


def configured(settings: list[str]) -> ServerConfig:
    """``ServerConfig()`` with ``NAME=VALUE`` settings applied (each converted to its field's type)."""
    defaults = ServerConfig()
    changes: dict[str, Any] = {}
    for setting in settings:
        name, _, value = setting.partition("=")
        if name not in {f.name for f in fields(ServerConfig)} or name in ("host", "port", "api_key"):
            raise SystemExit(f"--set {setting}: not a ServerConfig limit")
        changes[name] = type(getattr(defaults, name))(value)
    return replace(defaults, **changes)


def positive(text: str) -> float:
    """A command-line interval: a finite number above 0. The maximal request's report needs the 1-pair requests
    (``probed`` sends none for a ``small_s`` of 0), and an interval of 0 or less would send probes back to back."""
    value = float(text)
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be a finite number above 0, got {text}")
    return value


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scorer", required=True, help="a scorer directory (pmi-reward train) or Hub repo id")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None, help="torch threads in the server (default: torch's)")
    parser.add_argument(
        "--encode_batch_size", type=int, default=None, help="the server's encoder batch (default: the scorer's)"
    )
    parser.add_argument(
        "--set",
        nargs="*",
        default=[],
        metavar="NAME=VALUE",
        help="serve with these ServerConfig values instead of the defaults (e.g. max_batch_pairs=32); the maximal "
        "request is computed from them",
    )
    parser.add_argument("--probe_ms", type=positive, default=50.0, help="milliseconds between /health probes (> 0)")
    parser.add_argument("--small_s", type=positive, default=1.0, help="seconds between 1-pair /score requests (> 0)")
    parser.add_argument("--no_hostile", action="store_true", help="only the maximal request")
    parser.add_argument("--output", default=None, help="write the summary here as JSON")
    return parser.parse_args()


def main() -> int:
    args = _arguments()
    config, options = configured(args.set), RewardOptions()
    env_threads = {"OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads)} if args.threads else {}
    os.environ.update(env_threads)
    timeout = config.request_timeout + config.idle_timeout + 120
    body = json.dumps(maximal_score_body(config, options)).encode()
    hostile = [] if args.no_hostile else hostile_inputs(config)

    summary: dict[str, Any] = {
        "scorer": args.scorer,
        "limits": {k: v for k, v in vars(config).items() if k != "api_key"},
        "cpus": os.cpu_count(),
        "threads": args.threads,
        "tokenizers_parallelism": os.environ.get("TOKENIZERS_PARALLELISM"),
        "encode_batch_size": args.encode_batch_size,
        "load1_before": load(),
    }
    # start_server passes --device cpu; another device goes after it (the last value wins)
    runtime = {"device": args.device} if args.device != "cpu" else {}
    runtime.update({k: str(v) for k, v in vars(config).items() if v != getattr(ServerConfig(), k)})
    previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so that the finally below runs
    server: subprocess.Popen | None = None
    try:
        # start_server reads the server's log to its end (an unread pipe would block the server)
        server, url = start_server(args.scorer, config.max_batch_pairs, args.encode_batch_size, runtime)
        exchange(url, post("/score", {"pairs": [{"context": "hi", "response": "hello"}] * 8}), timeout)  # warm up
        pairs = json.loads(body)["pairs"]
        size = {"pairs": len(pairs), "chars": text_chars({"pairs": pairs}), "bytes": len(body)}
        print(f"maximal /score request: {size['pairs']} pairs, {size['chars']} characters, {size['bytes']} bytes")
        before = cpu_seconds(server.pid)
        result = probed(url, partial(exchange, url, post("/score", body), timeout), args.probe_ms / 1000, args.small_s)
        summary["maximal"] = {**size, **result, "server_cpu": since(before, cpu_seconds(server.pid))}
        summary["load1_after_maximal"] = load()
        health, small = result["health"], result["one_pair"]
        print(
            f"  answered {result['status']} in {result['seconds']:.1f} s {result['error']}\n"
            f"  /health: {health['n']} probes, p50 {health['p50_ms']} ms, p99 {health['p99_ms']} ms, max "
            f"{health['max_ms']} ms (at {health['max_at_s']} s), statuses {health['statuses']}\n"
            f"  1-pair /score: {small['n']} requests, p50 {small['p50_ms']} ms, max {small['max_ms']} ms, statuses "
            f"{small['statuses']}\n  server threads: {summary['maximal']['server_cpu']}",
            flush=True,
        )
        summary["hostile"] = []
        for what, data in hostile:
            settle(url, timeout)
            result = probed(url, partial(exchange, url, data, timeout), args.probe_ms / 1000, None)
            summary["hostile"].append({"input": what, **result})
            print(
                f"{what}: {result['status']} in {result['seconds'] * 1000:.0f} ms "
                f"(health: {result['health']['n']} probes, max {result['health']['max_ms']} ms) {result['error']}",
                flush=True,
            )
        conn = http.client.HTTPConnection(urlsplit(url).netloc, timeout=60)
        conn.request("GET", "/health")
        health = json.loads(conn.getresponse().read())
        conn.close()
        summary["server"] = {k: health[k] for k in ("batcher", "responses")}
        summary["load1_after"] = load()
    finally:
        signal.signal(signal.SIGTERM, previous)
        if server is not None:
            server.terminate()
            try:
                server.wait(timeout=config.drain_timeout + 30)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
    summary["server_exit"] = server.returncode if server is not None else None
    print(json.dumps({k: v for k, v in summary.items() if k not in ("maximal", "hostile")}))
    if args.output:
        with open(args.output, "w", encoding="utf-8") as f:
            json.dump(summary, f, indent=1)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.exit(main())

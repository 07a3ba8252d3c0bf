"""Concurrent clients against a reward server: every answer checked, latencies and throughput measured.

Used by the load test (``tests/test_server.py``) and the throughput benchmark
(``benchmarks/server_throughput.py``), so both measure the same thing: ``clients`` threads, each on its own
keep-alive connection, send their share of the request bodies to ``POST /score`` one after another.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import numpy as np

__all__ = ["LoadResult", "run_load", "score_bodies"]


@dataclass
class LoadResult:
    """Per-request scores (None where the request failed), errors, latencies and wall time."""

    scores: list[list[float | None] | None]
    errors: list[str] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def pairs(self) -> int:
        return sum(len(s) for s in self.scores if s is not None)

    def summary(self) -> dict:
        lat = np.array(self.latencies) * 1000 if self.latencies else np.zeros(1)
        return {
            "requests": len(self.scores),
            "errors": len(self.errors),
            "pairs": self.pairs,
            "seconds": round(self.seconds, 3),
            "pairs_per_s": round(self.pairs / self.seconds, 1),
            "p50_ms": round(float(np.percentile(lat, 50)), 2),
            "p99_ms": round(float(np.percentile(lat, 99)), 2),
        }


def score_bodies(contexts: Sequence[str], responses: Sequence[str], per_request: int) -> list[dict]:
    """``/score`` bodies of ``per_request`` consecutive pairs each."""
    pairs = [{"context": c, "response": r} for c, r in zip(contexts, responses, strict=True)]
    return [{"pairs": pairs[s : s + per_request]} for s in range(0, len(pairs), per_request)]


def run_load(url: str, bodies: Sequence[dict], clients: int, timeout: float = 120.0) -> LoadResult:
    """Send every body to ``url``/score from ``clients`` threads (client k sends bodies k, k + clients, ...),
    all starting together; an answer counts as an error unless it is a 200 with one score per pair."""
    result = LoadResult(scores=[None] * len(bodies))
    lock, start = threading.Lock(), threading.Barrier(clients + 1)
    netloc = urlsplit(url).netloc

    def client(k: int) -> None:
        conn = http.client.HTTPConnection(netloc, timeout=timeout)
        start.wait()
        for i in range(k, len(bodies), clients):
            data = json.dumps(bodies[i]).encode()
            t0 = time.perf_counter()
            try:
                conn.request("POST", "/score", body=data, headers={"Content-Type": "application/json"})
                response = conn.getresponse()
                answer = json.loads(response.read())
                elapsed = time.perf_counter() - t0
                scores = answer.get("scores") if response.status == 200 else None
                if not isinstance(scores, list) or len(scores) != len(bodies[i]["pairs"]):
                    raise ValueError(f"HTTP {response.status}: {str(answer)[:200]}")
            except (OSError, ValueError, http.client.HTTPException) as err:
                conn.close()
                conn = http.client.HTTPConnection(netloc, timeout=timeout)
                with lock:
                    result.errors.append(f"request {i}: {type(err).__name__}: {err}")
                continue
            with lock:
                result.scores[i] = scores
                result.latencies.append(elapsed)
        conn.close()

    threads = [threading.Thread(target=client, args=(k,), daemon=True) for k in range(clients)]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    result.seconds = time.perf_counter() - t0
    return result

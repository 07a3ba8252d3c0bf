"""Micro-batching: concurrent score requests merged into one ``PMIScorer.score`` call.

An encoder forward on 8 pairs costs nearly as much wall time as one on 64, so a server that scored each
request alone would waste most of its throughput. One worker thread owns the scorer: requests queue up
while it works, and each time it is free it takes everything queued (up to ``max_batch_pairs`` pairs,
waiting at most ``max_wait_ms`` for more), scores it in one call and hands each request its slice.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass

import numpy as np

from ..rewards.path import score_robustly
from ..scoring.scorer import PMIScorer

__all__ = ["MicroBatcher", "BatcherClosed", "ScoreTimeout"]

logger = logging.getLogger(__name__)


class BatcherClosed(RuntimeError):
    """The batcher is shutting down and takes no new work."""


class ScoreTimeout(TimeoutError):
    """A request was not scored within its time limit."""


@dataclass
class _Job:
    contexts: list[str]
    responses: list[str]
    future: Future


@dataclass
class BatcherStats:
    requests: int = 0
    pairs: int = 0
    batches: int = 0
    busy_seconds: float = 0.0

    def to_dict(self) -> dict:
        return {
            "requests": self.requests,
            "pairs": self.pairs,
            "batches": self.batches,
            "mean_batch_pairs": round(self.pairs / self.batches, 2) if self.batches else 0.0,
            "busy_seconds": round(self.busy_seconds, 3),
        }


class MicroBatcher:
    """Scores (context, response) lists submitted from many threads, merging concurrent ones into one call."""

    def __init__(self, scorer: PMIScorer, max_batch_pairs: int = 256, max_wait_ms: float = 2.0) -> None:
        if max_batch_pairs < 1:
            raise ValueError("max_batch_pairs must be >= 1")
        self.scorer, self.max_batch_pairs, self.max_wait = scorer, max_batch_pairs, max_wait_ms / 1000
        self.stats = BatcherStats()
        self._queue: deque[_Job] = deque()
        self._cv = threading.Condition()
        self._closing = False
        self._thread = threading.Thread(target=self._run, name="pmi-batcher", daemon=True)
        self._thread.start()

    @property
    def queued(self) -> int:
        return len(self._queue)

    def submit(self, contexts: list[str], responses: list[str]) -> Future:
        """Queue pairs for scoring; the future resolves to float64 scores (NaN for a pair that fails)."""
        job = _Job(list(contexts), list(responses), Future())
        with self._cv:
            if self._closing:
                raise BatcherClosed("the scorer is shutting down")
            self._queue.append(job)
            self._cv.notify()
        return job.future

    def score(self, contexts: list[str], responses: list[str], timeout: float | None = None) -> np.ndarray:
        """Scores of the pairs, waiting at most ``timeout`` seconds (a timed-out request is dropped from the
        queue if it has not started)."""
        future = self.submit(contexts, responses)
        try:
            return future.result(timeout)
        except FutureTimeout:
            future.cancel()
            raise ScoreTimeout(f"not scored within {timeout:g} s (queue: {self.queued} requests)") from None

    def close(self, timeout: float | None = None) -> None:
        """Stop taking work, finish what is queued, stop the worker."""
        with self._cv:
            self._closing = True
            self._cv.notify_all()
        self._thread.join(timeout)

    # -- the worker ---------------------------------------------------------------------------------
    def _take(self) -> list[_Job] | None:
        with self._cv:
            while not self._queue:
                if self._closing:
                    return None
                self._cv.wait()
            jobs = [self._queue.popleft()]
            size = len(jobs[0].contexts)
            deadline = time.monotonic() + self.max_wait
            while size < self.max_batch_pairs:
                if not self._queue:
                    left = deadline - time.monotonic()
                    if left <= 0 or self._closing:
                        break
                    self._cv.wait(left)
                    continue
                if size + len(self._queue[0].contexts) > self.max_batch_pairs:
                    break
                jobs.append(self._queue.popleft())
                size += len(jobs[-1].contexts)
        return jobs

    def _run(self) -> None:
        while (jobs := self._take()) is not None:
            jobs = [j for j in jobs if j.future.set_running_or_notify_cancel()]
            if not jobs:
                continue
            start = time.perf_counter()
            try:
                self._score(jobs)
            except BaseException as err:  # noqa: BLE001 - never leave a waiting request hanging
                logger.exception("pmi-batcher: scoring failed")
                for job in jobs:
                    if not job.future.done():
                        job.future.set_exception(err)
            self.stats.busy_seconds += time.perf_counter() - start

    def _score(self, jobs: list[_Job]) -> None:
        contexts = [c for j in jobs for c in j.contexts]
        responses = [r for j in jobs for r in j.responses]
        try:
            scores = self.scorer.score(contexts, responses).astype(np.float64)
        except Exception as err:  # noqa: BLE001 - one bad request must not fail the others merged with it
            logger.warning(
                "pmi-batcher: merged batch of %d requests failed (%s); scoring them one by one", len(jobs), err
            )
            scores = np.concatenate([score_robustly(self.scorer, j.contexts, j.responses) for j in jobs])
        self.stats.requests += len(jobs)
        self.stats.pairs += len(contexts)
        self.stats.batches += 1
        at = 0
        for job in jobs:
            job.future.set_result(scores[at : at + len(job.contexts)])
            at += len(job.contexts)

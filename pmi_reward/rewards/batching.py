"""Micro-batching with fair queueing: concurrent score requests merged into bounded ``PMIScorer.score`` calls.

An encoder forward on 8 pairs costs nearly as much wall time as one on 64, so a server that scored each
request alone would waste most of its throughput. One worker thread owns the scorer: requests queue up
while it works, and each time it is free it builds one batch (waiting at most ``max_wait_ms`` for more work
when there is little), scores it in one call and hands each request its slice.

A batch is bounded in pairs (``max_batch_pairs``) and in characters (``max_batch_chars``: tokenizing is linear in
them), so no call runs long; and it is filled round-robin, each waiting request giving at most ``chunk_pairs``
pairs per turn. A small request is therefore taken whole into the next batch, even while a request of thousands
of pairs is being scored chunk by chunk: it waits for one bounded batch, not for the large request.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field

import numpy as np

from ..scoring.scorer import PMIScorer
from .path import checked_scores, score_robustly

__all__ = ["MicroBatcher", "BatcherClosed", "ScoreTimeout", "ClientGone"]

ALIVE_CHECK_S = 0.25  # how often a waiting request asks whether its client is still there

logger = logging.getLogger(__name__)


class BatcherClosed(RuntimeError):
    """The batcher is shutting down and takes no new work."""


class ClientGone(Exception):
    """The client closed its connection while its request waited: what is left of it is not scored."""


class ScoreTimeout(TimeoutError):
    """A request was not scored within its time limit."""


@dataclass
class _Job:
    """One request: its pairs, the scores so far, and how far it has been handed out and scored."""

    contexts: list[str]
    responses: list[str]
    future: Future
    scores: np.ndarray = field(init=False)
    started: bool = False  # its future is running (a piece of it was handed out)
    handed: int = 0  # pairs handed to a batch so far
    scored: int = 0  # pairs scored so far
    abandoned: bool = False  # its caller stopped waiting: the rest is not scored

    def __post_init__(self) -> None:
        self.scores = np.full(len(self.contexts), np.nan)

    def chars(self, i: int) -> int:
        return len(self.contexts[i]) + len(self.responses[i])


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


Piece = tuple[_Job, int, int]  # a request's pairs [start, stop) in one batch


class MicroBatcher:
    """Scores (context, response) lists submitted from many threads, merging concurrent ones into bounded calls."""

    def __init__(
        self,
        scorer: PMIScorer,
        max_batch_pairs: int = 256,
        max_wait_ms: float = 2.0,
        max_batch_chars: int = 64 * 1024,
        chunk_pairs: int = 32,
    ) -> None:
        if max_batch_pairs < 1 or max_batch_chars < 1 or chunk_pairs < 1:
            raise ValueError("max_batch_pairs, max_batch_chars and chunk_pairs must be >= 1")
        self.scorer, self.max_batch_pairs, self.max_wait = scorer, max_batch_pairs, max_wait_ms / 1000
        self.max_batch_chars, self.chunk_pairs = max_batch_chars, chunk_pairs
        self.stats = BatcherStats()
        self._queue: deque[_Job] = deque()  # requests with pairs not yet handed out, in round-robin order
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
        # a cancelled caller abandons its job; a failed job (abandoned by _run) stays abandoned
        job.future.add_done_callback(lambda f: setattr(job, "abandoned", job.abandoned or f.cancelled()))
        if not job.contexts:
            job.future.set_result(job.scores)
            return job.future
        with self._cv:
            if self._closing:
                raise BatcherClosed("the scorer is shutting down")
            self._queue.append(job)
            self._cv.notify()
        return job.future

    def score(
        self,
        contexts: list[str],
        responses: list[str],
        timeout: float | None = None,
        alive: Callable[[], bool] | None = None,
    ) -> np.ndarray:
        """Scores of the pairs, waiting at most ``timeout`` seconds, and, with ``alive``, only while it says the
        caller is still there (asked every ``ALIVE_CHECK_S``); either way the rest of the request is dropped, so that
        a client that gave up (and may be resending the same work) does not hold the scorer."""
        future = self.submit(contexts, responses)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            step = left if alive is None else min(ALIVE_CHECK_S, ALIVE_CHECK_S if left is None else left)
            try:
                return future.result(step)
            except FutureTimeout:
                if deadline is not None and time.monotonic() >= deadline:
                    self._abandon(future)
                    raise ScoreTimeout(f"not scored within {timeout:g} s (queue: {self.queued} requests)") from None
                if alive is not None and not alive():
                    self._abandon(future)
                    raise ClientGone("the client closed its connection before its answer") from None

    def _abandon(self, future: Future) -> None:
        future.cancel()
        with self._cv:
            for job in self._queue:
                if job.future is future:
                    job.abandoned = True

    def close(self, timeout: float | None = None) -> None:
        """Stop taking work, finish what is queued within ``timeout`` seconds, stop the worker; requests still queued
        then fail with BatcherClosed (their handlers answer 503) instead of being cut off when the process exits."""
        with self._cv:
            self._closing = True
            self._cv.notify_all()
        self._thread.join(timeout)
        if self._thread.is_alive():
            with self._cv:
                for job in self._queue:
                    job.abandoned = True
                    if not job.future.done():
                        job.future.set_exception(BatcherClosed("the server shut down before this request was scored"))
                self._queue.clear()

    # -- the worker ---------------------------------------------------------------------------------
    def _waiting_pairs(self) -> int:
        return sum(len(j.contexts) - j.handed for j in self._queue)

    def _take(self) -> list[Piece] | None:
        """The next batch: round-robin over waiting requests, ``chunk_pairs`` pairs per request per turn, until
        the batch holds ``max_batch_pairs`` pairs or ``max_batch_chars`` characters (at least one pair)."""
        with self._cv:
            while not self._queue:
                if self._closing:
                    return None
                self._cv.wait()
            deadline = time.monotonic() + self.max_wait
            while self._waiting_pairs() < self.max_batch_pairs and not self._closing:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cv.wait(left)
            pieces: list[Piece] = []
            pairs = chars = 0
            while self._queue and pairs < self.max_batch_pairs:
                job = self._queue.popleft()
                if job.abandoned or not (job.started or job.future.set_running_or_notify_cancel()):
                    continue  # its caller stopped waiting
                job.started = True
                start = stop = job.handed
                end = min(len(job.contexts), start + self.chunk_pairs, start + self.max_batch_pairs - pairs)
                while stop < end and (not pairs or chars + job.chars(stop) <= self.max_batch_chars):
                    chars += job.chars(stop)
                    stop += 1
                    pairs += 1
                if stop == start:  # the character budget is spent: this request goes first next time
                    self._queue.appendleft(job)
                    break
                pieces.append((job, start, stop))
                job.handed = stop
                if job.handed < len(job.contexts):
                    self._queue.append(job)
                if stop < end:  # the character budget is spent
                    break
            return pieces

    def _run(self) -> None:
        while (pieces := self._take()) is not None:
            if not pieces:
                continue
            start = time.perf_counter()
            try:
                self._score(pieces)
            except BaseException as err:  # noqa: BLE001 - never leave a waiting request hanging
                logger.exception("pmi-batcher: scoring failed")
                for job, _, _ in pieces:
                    job.abandoned = True
                    if not job.future.done():
                        job.future.set_exception(err)
            self.stats.busy_seconds += time.perf_counter() - start

    def _score(self, pieces: list[Piece]) -> None:
        contexts = [c for job, a, b in pieces for c in job.contexts[a:b]]
        responses = [r for job, a, b in pieces for r in job.responses[a:b]]
        try:
            scores = checked_scores(self.scorer.score(contexts, responses), len(contexts))
        except Exception as err:  # noqa: BLE001 - one bad request must not fail the others merged with it
            logger.warning(
                "pmi-batcher: merged batch of %d pieces failed (%s); scoring them one by one", len(pieces), err
            )
            scores = np.concatenate(
                [score_robustly(self.scorer, job.contexts[a:b], job.responses[a:b]) for job, a, b in pieces]
            )
        self.stats.pairs += len(contexts)
        self.stats.batches += 1
        at = 0
        for job, a, b in pieces:
            job.scores[a:b] = scores[at : at + b - a]
            job.scored += b - a
            at += b - a
            if job.scored == len(job.contexts) and not job.future.done():
                self.stats.requests += 1
                job.future.set_result(job.scores)

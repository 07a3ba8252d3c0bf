"""Micro-batching with fair queueing: concurrent score requests merged into bounded ``PMIScorer.score`` calls.

An encoder forward on 8 pairs costs nearly as much wall time as one on 64, so a server that scored each
request alone would waste most of its throughput. One worker thread owns the scorer: requests queue up
while it works, and each time it is free it builds one batch (waiting at most ``max_wait_ms`` for more work
when there is little), scores it in one call and hands each request its slice.

A batch is bounded in pairs (``max_batch_pairs``) and in characters (``max_batch_chars``: tokenizing is linear in
them), so no call runs long; and it is filled round-robin, each waiting request giving at most ``chunk_pairs``
pairs per turn. A small request is therefore taken whole into the next batch, even while a request of thousands
of pairs is being scored chunk by chunk: it waits for one bounded batch, not for the large request.

The characters counted are those the scorer tokenizes (``_Reading``): a long text's window where the encoder reads
only that (``encoder.chars_read``), and a text the call holds for several pairs once, as the scorer encodes it once (a
``/rerank`` context is every candidate's). Counted whole, each time, a 100k-character ``/rerank`` context over
``max_batch_chars`` made every candidate a batch of its own, each tokenizing the context again.
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

from ..scoring.encoder import WINDOW_CHARS_PER_TOKEN, chars_read
from ..scoring.features import newest_lines
from ..scoring.scorer import SCORE_BLOCK, PMIScorer, as_trained
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


@dataclass(frozen=True)
class _Reading:
    """How a ``PMIScorer`` reads its pairs, for counting the characters a batch makes it tokenize."""

    tokens: int  # the encoder's max_length, its token budget: a text past its window is read through the window
    prompt: bool  # prompt input: each distinct pair is read as one text, its context with it (no context shared)
    line_turns: int  # pair input: the context's newest lines are read too, each as a reply

    @classmethod
    def of(cls, scorer: object) -> _Reading | None:
        """The scorer's reading, or None for a scorer without an encoder's ``max_length`` (a stand-in): its texts
        are counted whole, once per pair."""
        max_length = getattr(getattr(getattr(scorer, "encoder", None), "spec", None), "max_length", None)
        if not isinstance(max_length, int) or isinstance(max_length, bool) or max_length < 1:
            return None
        line_turns = getattr(getattr(getattr(scorer, "head", None), "config", None), "line_turns", 0)
        prompt = getattr(scorer, "input_mode", "pair") == "prompt"
        return cls(max_length, prompt, line_turns if isinstance(line_turns, int) and not prompt else 0)

    def context(self, text: str) -> int:
        """Characters tokenized for a context (kept from its end): the more of those of the context and those of its
        newest lines (read too, with ``line_turns``), as a short context's own length is the more (its lines are part
        of it) and ``max_batch_chars`` was measured with contexts so counted. Counted apart, a long context read
        through its window could hide an older line of 50k characters read whole."""
        (trained,), _ = as_trained([text], [])
        read = chars_read(trained, self.tokens, keep_end=True)
        return max(read, sum(chars_read(line, self.tokens, keep_end=False) for line in self._lines(trained)))

    def response(self, text: str) -> int:
        """Characters tokenized for a reply (kept from its start)."""
        _, (trained,) = as_trained([], [text])
        return chars_read(trained, self.tokens, keep_end=False)

    def _lines(self, context: str) -> list[str]:
        return newest_lines(context, self.line_turns) if self.line_turns > 0 else []


def _pair_chars(reading: _Reading | None, contexts: list[str], responses: list[str]) -> tuple[list[int], list[int]]:
    """Characters counted for each pair's context and reply (``_Reading``): a text no longer than its window is read
    whole, its length; a longer one's are worked out once per distinct text (a ``/rerank`` context is every pair's)."""
    if reading is None:
        return [len(c) for c in contexts], [len(r) for r in responses]
    limit = WINDOW_CHARS_PER_TOKEN * reading.tokens  # a shorter text is read whole (and so are its lines)
    seen: dict[str, int] = {}
    context_chars = []
    for c in contexts:
        if len(c) <= limit:
            context_chars.append(len(c))
        else:
            if c not in seen:
                seen[c] = reading.context(c)
            context_chars.append(seen[c])
    return context_chars, [len(r) if len(r) <= limit else reading.response(r) for r in responses]


@dataclass
class _Job:
    """One request: its pairs, the scores so far, and how far it has been handed out and scored."""

    contexts: list[str]
    responses: list[str]
    future: Future
    reading: _Reading | None = None  # how the scorer reads the pairs (None: each text whole, once per pair)
    scores: np.ndarray = field(init=False)
    context_chars: list[int] = field(init=False)  # the characters counted for each pair's context (``_pair_chars``)
    response_chars: list[int] = field(init=False)  # and for its reply
    started: bool = False  # its future is running (a piece of it was handed out)
    handed: int = 0  # pairs handed to a batch so far
    scored: int = 0  # pairs scored so far
    abandoned: bool = False  # its caller stopped waiting: the rest is not scored

    def __post_init__(self) -> None:
        self.scores = np.full(len(self.contexts), np.nan)
        self.context_chars, self.response_chars = _pair_chars(self.reading, self.contexts, self.responses)

    def texts(self, i: int) -> list[tuple[object, int]]:
        """The texts pair ``i`` makes the scorer tokenize, as (key, characters): a text whose key is already in a
        call is encoded once there (the scorer's distinct contexts and replies, or distinct pairs in prompt input)."""
        context, response = self.contexts[i], self.responses[i]
        if self.reading is None:  # a stand-in scorer: nothing is known to be shared
            return [((id(self), i), self.context_chars[i] + self.response_chars[i])]
        if self.reading.prompt:
            return [((context, response), self.context_chars[i] + self.response_chars[i])]
        return [(("context", context), self.context_chars[i]), (("response", response), self.response_chars[i])]


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
        self._reading = _Reading.of(scorer)
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
        job = _Job(list(contexts), list(responses), Future(), self._reading)
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
        the batch holds ``max_batch_pairs`` pairs or ``max_batch_chars`` characters (at least one pair): those the
        scorer tokenizes, a text it encodes once in the call (in a block of ``SCORE_BLOCK`` pairs) counted once."""
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
            read: set[object] = set()  # the keys of the texts in the batch's current scoring block
            while self._queue and pairs < self.max_batch_pairs:
                job = self._queue.popleft()
                if job.abandoned or not (job.started or job.future.set_running_or_notify_cancel()):
                    continue  # its caller stopped waiting
                job.started = True
                start = stop = job.handed
                end = min(len(job.contexts), start + self.chunk_pairs, start + self.max_batch_pairs - pairs)
                while stop < end:
                    if pairs % SCORE_BLOCK == 0:
                        read.clear()  # the scorer encodes each block's texts apart
                    new = [(key, n) for key, n in job.texts(stop) if key not in read]
                    cost = sum(n for _, n in new)
                    if pairs and chars + cost > self.max_batch_chars:
                        break
                    read.update(key for key, _ in new)
                    chars += cost
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

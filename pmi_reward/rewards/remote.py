"""``RemotePMIReward``: the PMI reward as a TRL reward callable whose scorer runs in a ``pmi-reward serve`` server.

The GRPO/RLOO process keeps its accelerator for the policy; the scorer lives on another device or host.
It runs the one reward path (``path``) as ``PMIReward`` does: prompts and completions become scorer text
here, only the raw PMI of the readable pairs crosses the wire (``POST /score``), and the answer is shaped
here with the same options. So for the same scorer and options both return the same rewards. ``__call__`` is
a coroutine: TRL detects it and gathers it with the other async reward functions. Requests retry on connection errors,
timeouts and 5xx answers; if the server stays unreachable, the call returns None (unscorable) for every
sample and logs a warning, or raises with ``on_failure="raise"``. Requests go straight to the server, never through
``$http_proxy`` / ``$https_proxy``, so the API key is not handed to a proxy (OpenRLHF >= 0.9.1's aiohttp client
ignores them too; 0.9.0's ``requests`` used them).
"""

from __future__ import annotations

import asyncio
import http.client
import json
import logging
import os
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import numpy as np

from .options import RewardOptions
from .path import RewardPath

__all__ = ["RemotePMIReward", "RemoteRewardError", "request_json", "run_sync", "api_key_from_env"]

API_KEY_ENV = "PMI_REWARD_API_KEY"


def api_key_from_env(api_key: str | None = None) -> str | None:
    """The server's API key: ``api_key`` if given, else ``$PMI_REWARD_API_KEY`` (None when neither is set)."""
    return api_key or os.environ.get(API_KEY_ENV) or None


logger = logging.getLogger(__name__)

# no ProxyHandler from the environment: urlopen sends every request, its bearer token included, to $http_proxy
# (a cluster's egress proxy, typically) when one is set and no_proxy does not name the server
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class RemoteRewardError(RuntimeError):
    """The reward server refused a request, or could not be reached after the retries."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status

    @property
    def retryable(self) -> bool:
        """Worth another try: no answer (connection error, timeout), 429 or a 5xx; not another 4xx."""
        return self.status is None or self.status == 429 or self.status >= 500


def request_json(url: str, payload: dict | None = None, timeout: float = 60.0, api_key: str | None = None) -> dict:
    """POST ``payload`` (or GET when None) as JSON and return the JSON answer, sending ``api_key`` as a bearer
    token, directly (environment proxies are ignored); RemoteRewardError on a non-2xx answer (with the server's
    message) or on a connection failure (status None; also an answer cut short or not HTTP at all)."""
    # UTF-8 as is: escaped, a CJK character took 6 bytes of the server's body limit
    data = None if payload is None else json.dumps(payload, ensure_ascii=False).encode("utf-8")
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    request = urllib.request.Request(url, data=data, headers=headers)
    try:
        with _OPENER.open(request, timeout=timeout) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as err:
        try:
            message = json.loads(err.read()).get("error", err.reason)
        except (ValueError, AttributeError, OSError, http.client.HTTPException):  # also an error body cut short
            message = err.reason
        raise RemoteRewardError(f"{url}: HTTP {err.code}: {message}", err.code) from None
    except (TimeoutError, urllib.error.URLError, OSError, ValueError, http.client.HTTPException) as err:
        raise RemoteRewardError(f"{url}: {getattr(err, 'reason', err)}") from None


def run_sync(coroutine: Any) -> Any:
    """Run a coroutine to completion from synchronous code, even where an event loop is already running."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coroutine).result()


class RemotePMIReward(RewardPath):
    """``await reward(prompts, completions, completion_ids=None, **kwargs) -> list[float | None]`` over HTTP."""

    def __init__(
        self,
        url: str,
        options: RewardOptions | None = None,
        timeout: float = 60.0,
        retries: int = 3,
        backoff: float = 0.5,
        on_failure: str = "none",
        api_key: str | None = None,
        **kwargs: Any,
    ) -> None:
        if options is not None and kwargs:
            raise TypeError("pass either options or keyword options, not both")
        if on_failure not in ("none", "raise"):
            raise ValueError(f"on_failure must be 'none' or 'raise', got {on_failure!r}")
        if retries < 0 or timeout <= 0:
            raise ValueError("retries must be >= 0 and timeout > 0")
        super().__init__(options or RewardOptions(**kwargs))
        self.url = url.rstrip("/")
        for suffix in ("/score", "/get_reward", "/health"):
            self.url = self.url.removesuffix(suffix)
        self.timeout, self.retries, self.backoff, self.on_failure = timeout, retries, backoff, on_failure
        self.api_key = api_key_from_env(api_key)
        self._turns_resolved = self.options.max_context_turns is not None

    async def _request(self, path: str, payload: dict | None = None) -> dict:
        """One request with retries (connection errors, timeouts, 429 and 5xx; not other 4xx)."""
        for attempt in range(self.retries + 1):
            try:
                return await asyncio.to_thread(request_json, self.url + path, payload, self.timeout, self.api_key)
            except RemoteRewardError as err:
                if not err.retryable or attempt == self.retries:
                    raise
                logger.info("pmi_reward remote: %s; retry %d/%d", err, attempt + 1, self.retries)
                await asyncio.sleep(self.backoff * 2**attempt)
        raise AssertionError("unreachable")

    async def _resolve_turns(self) -> None:
        """``max_context_turns=None`` means "as the scorer was trained": ask the server once (into our own copy of
        the options; the caller's are never written)."""
        if not self._turns_resolved:
            health = await self._request("/health")
            scorer = (health.get("scorer") or {}) if isinstance(health, dict) else None
            trained = scorer.get("trained_context_turns") if isinstance(scorer, dict) else ""
            if not (trained is None or (isinstance(trained, int) and not isinstance(trained, bool))):
                raise RemoteRewardError(f"{self.url}/health: not a pmi-reward server's answer: {str(health)[:200]}")
            self.options = replace(self.options, max_context_turns=trained)
            self._turns_resolved = True

    async def _scores(self, contexts: list[str], replies: list[str]) -> np.ndarray:
        """Raw PMI of the readable pairs: one ``/score`` request per ``batch_size`` pairs, sent concurrently."""
        size = self.options.batch_size
        chunks = [(contexts[s : s + size], replies[s : s + size]) for s in range(0, len(replies), size)]
        parts = await asyncio.gather(*(self._score_chunk(c, r) for c, r in chunks))
        return np.concatenate(parts) if parts else np.zeros(0)

    async def _score_chunk(self, contexts: list[str], replies: list[str]) -> np.ndarray:
        """One ``/score`` request; a request the server finds too large (413: pairs, characters or bytes over its
        limits, e.g. a GRPO group repeating a long prompt) is split in halves until each fits."""
        pairs = [{"context": c, "response": r} for c, r in zip(contexts, replies, strict=True)]
        try:
            answer = await self._request("/score", {"pairs": pairs})
        except RemoteRewardError as err:
            if err.status != 413 or len(pairs) == 1:
                raise
            half = len(pairs) // 2
            parts = await asyncio.gather(
                self._score_chunk(contexts[:half], replies[:half]), self._score_chunk(contexts[half:], replies[half:])
            )
            return np.concatenate(parts)
        scores = answer.get("scores") if isinstance(answer, dict) else None
        if not isinstance(scores, list) or len(scores) != len(pairs):
            raise RemoteRewardError(f"{self.url}/score: expected {len(pairs)} scores, got {str(answer)[:200]}")
        try:
            return np.array([np.nan if s is None else float(s) for s in scores], dtype=np.float64)
        except (TypeError, ValueError):
            raise RemoteRewardError(f"{self.url}/score: expected numbers or null, got {str(scores)[:200]}") from None

    # -- the TRL contract ---------------------------------------------------------------------------
    async def __call__(
        self,
        prompts: Sequence[Any],
        completions: Sequence[Any],
        completion_ids: Any = None,
        log_metric: Callable[[str, float], None] | None = None,
        **kwargs: Any,
    ) -> list[float | None]:
        prompts, completions = self.samples(prompts, completions)  # a length mismatch raises before any request
        try:
            await self._resolve_turns()
            result = await self.run_async(prompts, completions, self._scores, log_metric)
        except RemoteRewardError as err:
            if self.on_failure == "raise":
                raise
            logger.warning("pmi_reward remote: %s; returning None (unscorable) for %d samples", err, len(completions))
            if log_metric is not None:
                log_metric(f"{self.__name__}/remote_failures", 1.0)
            return [None] * len(completions)
        return result.rewards

    def score_sync(self, prompts: Sequence[Any], completions: Sequence[Any]) -> list[float | None]:
        """The rewards from synchronous code (verl's reward managers, scripts)."""
        return run_sync(self(prompts, completions))

"""``RemotePMIReward``: the PMI reward as a TRL reward callable whose scorer runs in a ``pmi-reward serve`` server.

The GRPO/RLOO process keeps its accelerator for the policy; the scorer lives on another device or host.
It runs the one reward path (``path``) as ``PMIReward`` does: prompts and completions become scorer text
here, only the raw PMI of the readable pairs crosses the wire (``POST /score``), and the answer is shaped
here with the same options. So for the same scorer and options both return the same rewards (a server that cuts
texts shorter, started with a smaller ``--max_chars``, is refused at the first call). ``__call__`` is
a coroutine: TRL detects it and gathers it with the other async reward functions. A call goes as requests of
``batch_size`` pairs, at most ``CHUNKS_IN_FLIGHT`` (2) of them in flight at once, so that a try waits for about two
requests' scoring whatever the call's size. Each try must be answered within ``timeout`` seconds; requests retry on
connection errors, timeouts, 429 and 5xx answers (waiting as long as a ``Retry-After`` header asks, up to 30 s); if the
server stays unreachable, the call returns None (unscorable) for every sample and logs a warning, or raises with
``on_failure="raise"``. An API key the server refuses (401/403) before any scoring request of the reward has been
answered raises ``RemoteKeyError`` whatever ``on_failure`` says: a key missing or mistyped from the start is a setting
to mend, and each of its calls would give every sample None (zero advantage) for the whole run; once a ``/score``
request has been answered (``/health``'s answer proves nothing: a proxy may answer it without a key), a refusal (a key
rotated mid-run) is a failure like the others, so that a long
run is not stopped by it. A pair the server refuses alone as too large
(413) is unscorable by itself (``empty_score``, as a pair the in-process scorer fails on). Requests go straight to
the server, never through ``$http_proxy`` / ``$https_proxy``, and redirects are not followed, so the API key is not
handed to a proxy or another host (OpenRLHF >= 0.9.1's aiohttp client ignores the proxies too; 0.9.0's ``requests``
used them); a key sent over plain http beyond loopback is warned about.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import http.client
import ipaddress
import json
import logging
import math
import os
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import numpy as np
from typing_extensions import Unpack

from .options import RewardOptions, RewardOptionsKwargs
from .path import RewardPath, Rewards

__all__ = [
    "RemotePMIReward",
    "RemoteKwargs",
    "RemoteRewardError",
    "RemoteKeyError",
    "request_json",
    "run_sync",
    "api_key_from_env",
    "check_api_key",
    "is_loopback",
]

API_KEY_ENV = "PMI_REWARD_API_KEY"


def check_api_key(api_key: str, where: str) -> None:
    """Refuse a key an HTTP header cannot carry as is: it must be printable ASCII without spaces (a newline in one
    made every request fail to be built, and retried). The error names ``where`` the key came from, never the key."""
    if not api_key or not api_key.isascii() or not api_key.isprintable() or any(c.isspace() for c in api_key):
        raise ValueError(f"{where} must be printable ASCII without spaces (the key is not shown)")


def api_key_from_env(api_key: str | None = None) -> str | None:
    """The server's API key: ``api_key`` if given, else ``$PMI_REWARD_API_KEY`` (None when neither is set), without
    its surrounding whitespace (a key read from a secret file ends with a newline); ``check_api_key``'d, so a key
    that is blank or holds spaces or control characters raises a ValueError naming the argument or the variable."""
    where, key = ("api_key", api_key) if api_key else (f"${API_KEY_ENV}", os.environ.get(API_KEY_ENV))
    if not key:
        return None
    if isinstance(key, int) and not isinstance(key, bool):  # YAML/Hydra read a key of digits as a number
        key = str(key)
    if not isinstance(key, str):
        raise ValueError(f"{where} must be a string, got {type(key).__name__}")
    check_api_key(key.strip(), where)
    return key.strip()


logger = logging.getLogger(__name__)

# the longest wait a server's Retry-After gets (a misconfigured one could ask for hours)
MAX_RETRY_AFTER = 30.0


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """Refuses every redirect: urllib followed them to any host, bearer token included, and turned a POST into a
    GET; the 3xx comes back as an HTTPError instead."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None


# no ProxyHandler from the environment: urlopen sends every request, its bearer token included, to $http_proxy
# (a cluster's egress proxy, typically) when one is set and no_proxy does not name the server
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}), _NoRedirect)


def _retry_after(value: str | None) -> float | None:
    """A ``Retry-After`` header in seconds (delta-seconds or an HTTP date); None when absent or unreadable."""
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            seconds = email.utils.parsedate_to_datetime(value).timestamp() - time.time()
        except (TypeError, ValueError, IndexError, OverflowError):
            return None
    return max(seconds, 0.0) if math.isfinite(seconds) else None


def is_loopback(host: str) -> bool:
    """Whether ``host`` only accepts connections from this machine (127.0.0.0/8, ::1, localhost): the server warns
    when it listens elsewhere without a key, the client when it sends a key in clear text elsewhere."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _read_within(response: Any, deadline: float) -> bytes:
    """The answer's body, read in pieces until ``deadline`` (each piece bounded by the socket timeout): an answer
    sent a byte at a time held its thread, its socket and a server slot for as long as the server kept sending."""
    chunks = []
    while chunk := response.read1(1 << 16):
        chunks.append(chunk)
        if time.monotonic() > deadline:
            raise TimeoutError(f"the answer took longer than the timeout to arrive ({sum(map(len, chunks))} bytes)")
    return b"".join(chunks)


class RemoteRewardError(RuntimeError):
    """The reward server refused a request, or could not be reached after the retries."""

    def __init__(self, message: str, status: int | None = None, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.retry_after = retry_after  # seconds, from the answer's Retry-After header

    @property
    def retryable(self) -> bool:
        """Worth another try: no answer (connection error, timeout), 429 or a 5xx; not another 4xx."""
        return self.status is None or self.status == 429 or self.status >= 500


class RemoteKeyError(RemoteRewardError):
    """The server refused this client's API key (HTTP 401 or 403) before any of its scoring requests had been answered:
    a key missing or mistyped from the start, raised whatever ``on_failure`` says. The message names where the key
    comes from (``api_key`` or ``$PMI_REWARD_API_KEY``), never the key."""


# the statuses of a refused key: 401 (none or a wrong one sent, as ``pmi-reward serve`` answers) and 403 (a gateway)
KEY_REFUSED = (401, 403)


def request_json(url: str, payload: dict | None = None, timeout: float = 60.0, api_key: str | None = None) -> dict:
    """POST ``payload`` (or GET when None) as JSON and return the JSON answer, sending ``api_key`` as a bearer
    token, directly (environment proxies are ignored, redirects are not followed); RemoteRewardError on a non-2xx
    answer (with the server's message) or on a connection failure (status None; also an answer cut short, not HTTP
    at all or not JSON). ``timeout`` bounds each socket operation and the reading of the answer as a whole (a
    server trickling its answer is cut off once it has taken ``timeout`` in all). A key no header can carry raises
    a ValueError (``check_api_key``) before anything is sent: http.client refused it with a message holding the key,
    which was then retried and logged."""
    if api_key:
        check_api_key(api_key, "api_key")
    # UTF-8 as is: escaped, a CJK character took 6 bytes of the server's body limit
    data = None if payload is None else json.dumps(payload, ensure_ascii=False).encode("utf-8")
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    request = urllib.request.Request(url, data=data, headers=headers)
    try:
        with _OPENER.open(request, timeout=timeout) as response:
            return json.loads(_read_within(response, time.monotonic() + timeout))
    except urllib.error.HTTPError as err:
        retry_after = _retry_after(err.headers.get("Retry-After")) if err.headers is not None else None
        if 300 <= err.code < 400:
            location = err.headers.get("Location") if err.headers is not None else None
            message = f"redirect to {location!r} not followed (give the server's own URL)"
            raise RemoteRewardError(f"{url}: HTTP {err.code}: {message}", err.code) from None
        try:
            message = json.loads(err.read()).get("error", err.reason)
        except (ValueError, AttributeError, OSError, http.client.HTTPException, RecursionError):  # also cut short
            message = err.reason
        raise RemoteRewardError(f"{url}: HTTP {err.code}: {message}", err.code, retry_after) from None
    except RecursionError:  # JSON nested deeper than the parser's recursion limit
        raise RemoteRewardError(f"{url}: malformed answer (JSON nested too deeply)") from None
    except (TimeoutError, urllib.error.URLError, OSError, ValueError, http.client.HTTPException) as err:
        raise RemoteRewardError(f"{url}: {getattr(err, 'reason', err)}") from None


# requests at once per event loop: as many as asyncio's default executor ran (its size); a slot is taken before a
# try's time starts and given back when the try ends or is given up on (a thread left trickling holds none)
MAX_REQUESTS = min(32, (os.cpu_count() or 1) + 4)
# chunks of ONE call (``batch_size`` pairs each) in flight at once: a try then waits for about this many chunks'
# scoring, not the whole call's (the server's batcher advances the requests it holds together), so a call of any
# size is answered when the server scores CHUNKS_IN_FLIGHT x ``batch_size`` pairs within ``timeout`` (calls running
# side by side share it); two, not one, so that the server has the next chunk to score while an answer and the request
# after it travel (measured on a 4,096-pair call: as fast as every chunk at once; one at a time 11% slower against a
# server scoring 5,000 pairs/s)
CHUNKS_IN_FLIGHT = 2
_LOOP_SLOTS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = weakref.WeakKeyDictionary()
# verl's reward loop runs calls on many threads, each in its own event loop: one thread pruning _LOOP_SLOTS while
# another added its loop raised "dictionary changed size during iteration" out of the reward call
_LOOP_SLOTS_LOCK = threading.Lock()


def _request_slots() -> asyncio.Semaphore:
    """The running event loop's request slots (one loop per ``run_sync`` call: verl's sync calls do not share).
    Closed loops' entries are dropped here: a semaphore that made a caller wait holds its loop, so the weak key
    alone never let a finished ``asyncio.run``'s loop go. Safe from any thread."""
    loop = asyncio.get_running_loop()
    with _LOOP_SLOTS_LOCK:
        for closed in [other for other in list(_LOOP_SLOTS) if other.is_closed()]:
            _LOOP_SLOTS.pop(closed, None)
        slots = _LOOP_SLOTS.get(loop)
        if slots is None:
            slots = _LOOP_SLOTS[loop] = asyncio.Semaphore(MAX_REQUESTS)
        return slots


async def _in_daemon_thread(function: Callable[..., Any], *args: Any) -> Any:
    """``await function(*args)`` run on a daemon thread, its result or exception handed back to this event loop.

    Not ``asyncio.to_thread``: ``asyncio.run`` (``run_sync``: ``score_sync``, the verl adapter) waits for the
    default executor's threads before it returns, and the interpreter joins every ``concurrent.futures`` thread at
    exit, so a try given up on (a server trickling its answer) held the call, and the process, until the answer
    ended. A daemon thread is waited for by neither; given up on, it ends by itself (the answer completes or a socket
    operation times out) and its result is dropped."""
    loop = asyncio.get_running_loop()
    future = loop.create_future()

    def hand_back(ok: bool, value: Any) -> None:
        if not future.done():  # cancelled when the try was given up on
            if ok:
                future.set_result(value)
            else:
                future.set_exception(value)

    def work() -> None:
        try:
            outcome = (True, function(*args))
        except BaseException as err:  # noqa: BLE001 - handed back to the awaiting coroutine, raised there
            outcome = (False, err)
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits for this answer any more
            loop.call_soon_threadsafe(hand_back, *outcome)

    threading.Thread(target=work, name="pmi-reward-request", daemon=True).start()
    return await future


def run_sync(coroutine: Any) -> Any:
    """Run a coroutine to completion from synchronous code, even where an event loop is already running."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coroutine).result()


class RemoteKwargs(RewardOptionsKwargs, total=False):
    """``RemotePMIReward``'s keyword options after ``url`` and ``options``: its client's (``timeout``, ``retries``,
    ``backoff``, ``on_failure``, ``api_key``) and ``RewardOptions``' fields, typed for a checker (PEP 692's
    ``Unpack``) where they are passed on (``PMIReward.remote``). A test holds its keys equal to those parameters."""

    timeout: float
    retries: int
    backoff: float
    on_failure: str
    api_key: str | None


class RemotePMIReward(RewardPath):
    """``await reward(prompts, completions, completion_ids=None, **kwargs) -> list[float | None]`` over HTTP.

    A failed call returns None for every sample with a warning (``on_failure="none"``) or raises
    (``on_failure="raise"``); an API key refused (401/403) before any scoring request of this reward has been answered
    raises ``RemoteKeyError`` either way (a missing or mistyped key would otherwise zero every advantage of the run),
    while one refused after an answer (a key rotated mid-run) is an ordinary failure, so that a long run rides it
    out."""

    def __init__(
        self,
        url: str,
        options: RewardOptions | None = None,
        timeout: float = 60.0,
        retries: int = 3,
        backoff: float = 0.5,
        on_failure: str = "none",
        api_key: str | None = None,
        **kwargs: Unpack[RewardOptionsKwargs],
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
        # where the key comes from, for the message of a refused one (never the key itself)
        self._key_source = "api_key" if api_key else f"${API_KEY_ENV}"
        self._server_checked = False
        # whether a scoring request of this reward has been answered (2xx): its key works (``/health`` proves
        # nothing: a proxy or load balancer may answer it without a key while guarding ``/score``)
        self._answered = False
        parts = urllib.parse.urlsplit(self.url)
        if self.api_key and parts.scheme.lower() == "http" and not is_loopback(parts.hostname or ""):
            logger.warning(
                "pmi_reward remote: the API key goes to %s over plain http, in clear text; use https (TLS in front"
                " of the server) beyond a trusted network",
                parts.netloc,
            )

    async def _request(self, path: str, payload: dict | None = None) -> dict:
        """One request with retries (connection errors, timeouts, 429 and 5xx; not other 4xx), each try given
        ``timeout`` seconds in all: the socket timeout alone bounds each read, and a server trickling its answer
        would never be cut off. A try given up on leaves its daemon thread to end by itself (the answer completes
        or a socket operation times out), its result dropped; nothing waits for it (``_in_daemon_thread``)."""
        url = self.url + path
        for attempt in range(self.retries + 1):
            try:
                try:
                    async with _request_slots():  # the wait for a slot is not the try's time
                        thread = _in_daemon_thread(request_json, url, payload, self.timeout, self.api_key)
                        return await asyncio.wait_for(thread, self.timeout)
                except TimeoutError:  # request_json turns its own timeouts into RemoteRewardError
                    raise RemoteRewardError(f"{url}: no complete answer within {self.timeout} s") from None
            except RemoteRewardError as err:
                if not err.retryable or attempt == self.retries:
                    raise
                logger.info("pmi_reward remote: %s; retry %d/%d", err, attempt + 1, self.retries)
                wait = self.backoff * 2**attempt
                if err.retry_after is not None:
                    wait = max(wait, min(err.retry_after, MAX_RETRY_AFTER))
                await asyncio.sleep(wait)
        raise AssertionError("unreachable")

    async def _check_server(self) -> None:
        """Ask the server's ``/health`` once (until it answers). ``max_context_turns=None`` means "as the scorer was
        trained": learnt into our own copy of the options (the caller's are never written). A server whose
        ``--max_chars`` is below ``max_chars`` is refused with a ValueError: its ``/score`` cuts every pair to its own
        limit, so the rewards would silently differ from ``PMIReward``'s under these options (a setting to mend, not a
        server to retry; an older server that does not report it is not checked). With ``max_context_turns`` given,
        an endpoint without a readable ``/health`` (a gateway exposing ``/score`` alone: 404, 405, or 403 as AWS API
        Gateway answers a route it lacks) goes unchecked, as before the check existed: only turns that must be
        learnt need it, and whether the key works is told by ``/score``'s answer. Otherwise a ``/health`` refusing
        the key (401/403) raises ``RemoteKeyError``, saying that ``max_context_turns`` skips it."""
        if self._server_checked:
            return
        try:
            health = await self._request("/health")
        except RemoteRewardError as err:
            if self.options.max_context_turns is None or err.status not in (403, 404, 405):
                if err.status in KEY_REFUSED and not self._answered:
                    raise self._key_refused(err, health=self.options.max_context_turns is None) from None
                raise
            logger.info("pmi_reward remote: %s/health unreadable (%s); max_chars not checked", self.url, err)
            self._server_checked = True
            return
        if self.options.max_context_turns is None:
            scorer = (health.get("scorer") or {}) if isinstance(health, dict) else None
            trained = scorer.get("trained_context_turns") if isinstance(scorer, dict) else ""
            if not (trained is None or (isinstance(trained, int) and not isinstance(trained, bool))):
                raise RemoteRewardError(f"{self.url}/health: not a pmi-reward server's answer: {str(health)[:200]}")
            self.options = replace(self.options, max_context_turns=trained)
        served = health.get("reward_options") if isinstance(health, dict) else None
        limit = served.get("max_chars") if isinstance(served, dict) else None
        if isinstance(limit, int) and not isinstance(limit, bool) and limit < self.options.max_chars:
            raise ValueError(
                f"{self.url}: the server runs with --max_chars {limit}, below this reward's max_chars "
                f"{self.options.max_chars}: its /score would cut contexts and replies shorter than PMIReward does "
                f"with the same options; pass max_chars={limit} (or less) here, or serve with --max_chars "
                f"{self.options.max_chars} (or more)"
            )
        self._server_checked = True

    async def _scores(self, contexts: list[str], replies: list[str]) -> np.ndarray:
        """Raw PMI of the readable pairs: one ``/score`` request per ``batch_size`` pairs, at most
        ``CHUNKS_IN_FLIGHT`` of this call's in flight at once (``_request_slots`` bounds all calls' requests together).

        Not all at once: the server's batcher advances the requests it holds in lockstep (round-robin), so each of
        them was answered only when nearly all were scored, and a call of more chunks than the server could score
        within ``timeout`` got every chunk timed out, the scored work thrown away and resent by the retries, and
        None for every sample. Bounded, each try waits for about ``CHUNKS_IN_FLIGHT * batch_size`` pairs' scoring,
        whatever the call's size. On the first chunk that fails the call fails, and its chunks not yet answered are
        cancelled: none is sent for a call already given up."""
        size = self.options.batch_size
        chunks = [(contexts[s : s + size], replies[s : s + size]) for s in range(0, len(replies), size)]
        window = asyncio.Semaphore(CHUNKS_IN_FLIGHT)

        async def in_window(chunk_contexts: list[str], chunk_replies: list[str]) -> np.ndarray:
            await window.acquire()
            part = await self._score_chunk(chunk_contexts, chunk_replies)
            window.release()  # not after a failure: a chunk waiting for the slot would start before it is cancelled
            return part

        tasks = [asyncio.ensure_future(in_window(c, r)) for c, r in chunks]
        try:
            parts = await asyncio.gather(*tasks)
        except BaseException:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)  # let them end here, not in a closing loop
            raise
        return np.concatenate(parts) if parts else np.zeros(0)

    async def _score_chunk(self, contexts: list[str], replies: list[str]) -> np.ndarray:
        """One ``/score`` request; a request the server finds too large (413: pairs, characters or bytes over its
        limits, e.g. a GRPO group repeating a long prompt) is split in halves until each fits; a pair refused alone
        is unscorable (NaN: ``empty_score``), not a failure of the whole call."""
        pairs = [{"context": c, "response": r} for c, r in zip(contexts, replies, strict=True)]
        try:
            # the texts are read already (the same reading as PMIReward's): the server scores them as given, not again
            answer = await self._request("/score", {"pairs": pairs, "as_given": True})
            self._answered = True  # a scoring request answered: the key works (a later refusal: a key rotated)
        except RemoteRewardError as err:
            if err.status != 413:
                raise
            if len(pairs) == 1:
                logger.warning("pmi_reward remote: %s; that sample is unscorable (empty_score)", err)
                return np.full(1, np.nan)
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
            result = await self.run_remote(prompts, completions, log_metric)
        except RemoteKeyError:  # a key refused before any answer: a setting to mend, whatever on_failure says
            raise
        except RemoteRewardError as err:
            if self.on_failure == "raise":
                raise
            logger.warning("pmi_reward remote: %s; returning None (unscorable) for %d samples", err, len(completions))
            if log_metric is not None:
                log_metric(f"{self.__name__}/remote_failures", 1.0)
            return [None] * len(completions)
        if log_metric is not None:  # 0.0 too, so that a trainer's mean of the metric is the share of calls that failed
            log_metric(f"{self.__name__}/remote_failures", 0.0)
        return result.rewards

    async def run_remote(
        self, prompts: Sequence[Any], completions: Sequence[Any], log_metric: Callable[[str, float], None] | None = None
    ) -> Rewards:
        """The whole path against the server: rewards, raw PMI and the texts they were computed from (the verl
        adapter reads its ``pmi_no_context`` flags there rather than building the texts again). ``max_context_turns``
        is learnt from the server before the texts are built, so that they are read with the setting the server
        scores with (``_check_server``). A failure raises (``RemoteRewardError``; ``RemoteKeyError`` for a key refused
        before any scoring request of this reward was answered), whatever ``on_failure`` says."""
        try:
            await self._check_server()
            return await self.run_async(prompts, completions, self._scores, log_metric)
        except RemoteKeyError:
            raise
        except RemoteRewardError as err:
            if err.status in KEY_REFUSED and not self._answered:
                raise self._key_refused(err) from None
            raise

    def _key_refused(self, err: RemoteRewardError, health: bool = False) -> RemoteKeyError:
        """The error for a key refused from the start, naming where the key comes from and never the key; ``health``:
        refused by ``/health``, read to learn ``max_context_turns``, which an endpoint may not expose."""
        if self.api_key is None:
            sent = f"no API key was sent (neither api_key= nor ${API_KEY_ENV} is set)"
        else:
            sent = f"the API key from {self._key_source} was refused (the key is not shown)"
        hint = (
            "; or the endpoint does not expose /health (a gateway serving /score alone): pass max_context_turns to "
            "skip it"
            if health
            else ""
        )
        return RemoteKeyError(
            f"{err}: {sent}, before any scoring request of this reward had been answered; give the key the server "
            f"was started with as api_key= or in ${API_KEY_ENV}{hint}",
            err.status,
        )

    def score_sync(self, prompts: Sequence[Any], completions: Sequence[Any]) -> list[float | None]:
        """The rewards from synchronous code (scripts; the verl adapter runs ``run_remote``, for the texts too)."""
        return run_sync(self(prompts, completions))

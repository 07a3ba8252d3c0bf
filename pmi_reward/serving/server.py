"""The PMI reward over HTTP: a JSON service for engines that keep the reward model on its own device or host.

Endpoints (``docs/serving.md`` has the full protocol):

- ``POST /get_reward``: OpenRLHF's remote reward-model protocol (``--remote_rm_url``): chat-templated full
  texts in ``query`` (prompt + reply), optionally the ``prompts``; ``rewards``, ``scores`` and ``extra_logs``
  out, shaped by the server's ``RewardOptions`` exactly as ``PMIReward`` shapes them.
- ``POST /score``: raw PMI of ``{"context", "response"}`` pairs (``RemotePMIReward`` calls this).
- ``POST /rerank``: one context's candidate replies, best first.
- ``GET /health``: liveness, the scorer's description, counters.

Concurrent requests are merged into encoder batches (``MicroBatcher``); bodies and pair counts are bounded
(413), malformed input gets a 4xx with a message naming the field (never a 5xx), each request has a time
limit (503), and ``close()`` drains in-flight requests before it stops. Built on the standard library's
threaded HTTP server: the work is one encoder call per micro-batch on one worker thread, so an async
framework would add dependencies without adding throughput.
"""

from __future__ import annotations

import json
import logging
import math
import signal
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np

from ..data.chat_templates import split_query
from ..rewards.reward import RewardOptions, RewardShaper, readable
from ..scoring.scorer import PMIScorer
from .batching import BatcherClosed, MicroBatcher, ScoreTimeout

__all__ = ["ServerConfig", "RewardServer", "ApiError", "serve"]

logger = logging.getLogger(__name__)


@dataclass
class ServerConfig:
    """Where the server listens, how it batches, and its limits."""

    host: str = field(default="127.0.0.1", metadata={"help": "address to listen on (0.0.0.0: every interface)"})
    port: int = field(default=8000, metadata={"help": "port (0: any free port)"})
    max_batch_pairs: int = field(default=256, metadata={"help": "pairs merged into one encoder call"})
    max_wait_ms: float = field(default=2.0, metadata={"help": "how long a free batcher waits for requests to merge"})
    max_body_bytes: int = field(default=16 * 2**20, metadata={"help": "larger request bodies get 413"})
    max_pairs: int = field(default=4096, metadata={"help": "pairs, queries or candidates per request; more: 413"})
    request_timeout: float = field(default=60.0, metadata={"help": "seconds a request may wait for scores; then 503"})
    drain_timeout: float = field(default=30.0, metadata={"help": "seconds shutdown waits for in-flight requests"})
    idle_timeout: float = field(default=75.0, metadata={"help": "seconds a keep-alive connection may stay idle"})


class ApiError(Exception):
    """A request the server refuses, with the HTTP status and a message for the caller."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


def _type(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _list(body: dict, key: str, limit: int, required: bool = True) -> list | None:
    value = body.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, list):
        raise ApiError(422, f"{key!r} must be a list, got {_type(value)}")
    if len(value) > limit:
        raise ApiError(413, f"{key!r} holds {len(value)} items; the limit is {limit} per request")
    return value


def _text(value: Any, where: str, allow_none: bool = False) -> str | None:
    if value is None and allow_none:
        return None
    if not isinstance(value, str):
        raise ApiError(422, f"{where} must be a string, got {_type(value)}")
    if not readable(value):
        raise ApiError(422, f"{where} is not valid Unicode (it holds a lone surrogate)")
    return value


def _number(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


class RewardServer:
    """A PMIScorer behind HTTP. ``start()`` serves from a background thread; ``close()`` shuts down gracefully."""

    def __init__(self, scorer: PMIScorer, config: ServerConfig | None = None,
                 options: RewardOptions | None = None) -> None:
        self.scorer, self.config = scorer, config or ServerConfig()
        options = options or RewardOptions()
        if options.max_context_turns is None:
            options.max_context_turns = scorer.trained_context_turns
        self.shaper = RewardShaper(options)
        self.batcher = MicroBatcher(scorer, self.config.max_batch_pairs, self.config.max_wait_ms)
        self.routes: dict[str, tuple[str, Callable[[dict], dict]]] = {
            "/get_reward": ("POST", self.get_reward), "/score": ("POST", self.score_pairs),
            "/rerank": ("POST", self.rerank), "/health": ("GET", lambda body: self.health()),
        }
        self.responses: Counter = Counter()
        self.closing = False
        self._started = time.time()
        self._lock = threading.Condition()
        self._connections: dict[socket.socket, bool] = {}  # open connection -> busy with a request
        self._inflight = 0
        self._thread: threading.Thread | None = None
        self._serving = threading.Event()
        handler = type("Handler", (_Handler,), {"app": self, "timeout": self.config.idle_timeout})
        self.httpd = _HTTPServer((self.config.host, self.config.port), handler)

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}"

    # -- life cycle ---------------------------------------------------------------------------------
    def serve_forever(self) -> None:
        """Serve until ``close()`` (from another thread or a signal handler)."""
        self._serving.set()
        self.httpd.serve_forever(poll_interval=0.1)

    def start(self) -> "RewardServer":
        """Serve from a background thread; returns once the server accepts connections."""
        self._thread = threading.Thread(target=self.serve_forever, name="pmi-server", daemon=True)
        self._thread.start()
        self._serving.wait()
        return self

    def close(self) -> None:
        """Stop accepting, let in-flight requests finish (up to ``drain_timeout``), then stop the batcher."""
        with self._lock:
            if self.closing:
                return
            self.closing = True
            idle = [conn for conn, busy in self._connections.items() if not busy]
        if self._serving.is_set():
            self.httpd.shutdown()
        for conn in idle:  # idle keep-alive connections would otherwise wait for their next request
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        with self._lock:
            if not self._lock.wait_for(lambda: self._inflight == 0, timeout=self.config.drain_timeout):
                logger.warning("pmi-reward serve: %d requests still running after %.0f s; closing anyway",
                               self._inflight, self.config.drain_timeout)
        self.batcher.close(timeout=self.config.drain_timeout)
        self.httpd.server_close()
        if self._thread is not None:
            self._thread.join()

    def __enter__(self) -> "RewardServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # bookkeeping used by the handler
    def _connect(self, conn: socket.socket, open_: bool) -> None:
        with self._lock:
            if open_:
                self._connections[conn] = False
            else:
                self._connections.pop(conn, None)

    def _busy(self, conn: socket.socket, busy: bool, status: int | None = None) -> None:
        with self._lock:
            self._connections[conn] = busy
            self._inflight += 1 if busy else -1
            if status is not None:
                self.responses[status] += 1
            self._lock.notify_all()

    # -- endpoints ----------------------------------------------------------------------------------
    def _score(self, contexts: list[str], responses: list[str]) -> np.ndarray:
        if not contexts:
            return np.zeros(0)
        return self.batcher.score(contexts, responses, timeout=self.config.request_timeout)

    def _rewards(self, prompts: list[Any], completions: list[Any]) -> tuple[list[float | None], np.ndarray]:
        """Shaped rewards and raw PMI (NaN where unscorable), as ``PMIReward`` computes them."""
        batch = self.shaper.prepare(prompts, completions)
        raw = np.full(len(completions), np.nan)
        contexts, replies = [batch.contexts[i] for i in batch.valid], [batch.replies[i] for i in batch.valid]
        raw[batch.valid] = self._score(contexts, replies)
        return self.shaper.finish(batch, raw), raw

    def score_pairs(self, body: dict) -> dict:
        """``{"pairs": [{"context", "response"}, ...]}`` -> ``{"scores": [...]}`` (raw PMI; null if unscorable).
        Texts are cut as rewards cut them: contexts keep their last, responses their first ``max_chars``."""
        pairs = _list(body, "pairs", self.config.max_pairs)
        contexts, responses = [], []
        for i, pair in enumerate(pairs):
            if not isinstance(pair, dict):
                raise ApiError(422, f"pairs[{i}] must be an object with 'context' and 'response', got {_type(pair)}")
            contexts.append(_text(pair.get("context"), f"pairs[{i}].context"))
            responses.append(_text(pair.get("response"), f"pairs[{i}].response"))
        cut = self.shaper.options.max_chars
        scores = self._score([c[-cut:] for c in contexts], [r[:cut] for r in responses])
        return {"scores": [_number(s) for s in scores]}

    def rerank(self, body: dict) -> dict:
        """``{"context": str | messages, "candidates": [...], "top_k": int?}`` -> candidates best first."""
        context = body.get("context")
        if not isinstance(context, (str, list)):
            raise ApiError(422, f"'context' must be a string or a list of chat messages, got {_type(context)}")
        candidates = _list(body, "candidates", self.config.max_pairs)
        for i, c in enumerate(candidates):
            if not isinstance(c, (str, list)):
                raise ApiError(422, f"candidates[{i}] must be a string or a list of chat messages, got {_type(c)}")
        top_k = body.get("top_k")
        if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
            raise ApiError(422, f"'top_k' must be a positive integer, got {top_k!r}")
        batch = self.shaper.prepare([context] * len(candidates), candidates)
        raw = np.full(len(candidates), np.nan)
        raw[batch.valid] = self._score([batch.contexts[i] for i in batch.valid],
                                       [batch.replies[i] for i in batch.valid])
        order = sorted(range(len(candidates)), key=lambda i: (not math.isfinite(raw[i]), -np.nan_to_num(raw[i])))
        ranked = [{"index": i, "response": batch.replies[i], "score": _number(raw[i])} for i in order]
        return {"ranked": ranked[:top_k] if top_k else ranked, "scores": [_number(s) for s in raw]}

    def get_reward(self, body: dict) -> dict:
        """OpenRLHF's ``{"query", "prompts", "labels"}`` -> ``{"rewards", "scores", "extra_logs"}``.

        ``rewards`` are shaped by the server's options; ``scores`` (OpenRLHF's 0-1 value for dynamic filtering)
        are sigmoid(PMI), the probability that the pair is a real one rather than a random match; ``labels``
        are not needed and ignored."""
        queries = _list(body, "query", self.config.max_pairs)
        prompts = _list(body, "prompts", self.config.max_pairs, required=False)
        labels = _list(body, "labels", self.config.max_pairs, required=False)
        for key, other in (("prompts", prompts), ("labels", labels)):
            if other is not None and len(other) != len(queries):
                raise ApiError(422, f"'query' holds {len(queries)} items but {key!r} holds {len(other)}")
        contexts, replies = [], []
        for i, query in enumerate(queries):
            query = _text(query, f"query[{i}]")
            prompt = _text(prompts[i], f"prompts[{i}]", allow_none=True) if prompts is not None else None
            split = split_query(query, prompt)
            contexts.append(split[0] if split else None)
            replies.append(split[1] if split else None)
        rewards, raw = self._rewards(contexts, replies)
        scored = np.isfinite(raw)
        sigmoid = np.where(scored, 1 / (1 + np.exp(-np.nan_to_num(raw))), 0.0)
        return {"rewards": rewards, "scores": sigmoid.tolist(),
                "extra_logs": {"pmi_raw": np.where(scored, raw, 0.0).tolist(),
                               "pmi_scored": scored.astype(float).tolist()}}

    def health(self) -> dict:
        """Liveness and what is being served (clients read ``trained_context_turns`` from here)."""
        with self._lock:
            inflight, responses = self._inflight, dict(self.responses)
        spec = self.scorer.encoder.spec
        return {"status": "draining" if self.closing else "ok",
                "scorer": {"encoder": spec.model, "input_mode": self.scorer.input_mode, "cap": self.scorer.cap,
                           "trained_context_turns": self.scorer.trained_context_turns},
                "reward_options": asdict(self.shaper.options), "batcher": self.batcher.stats.to_dict(),
                "queued": self.batcher.queued, "inflight": inflight, "responses": responses,
                "uptime_s": round(time.time() - self._started, 1)}


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True  # a stuck client must not keep the process alive after the drain
    request_queue_size = 1024  # the default backlog of 5 resets connections when many clients connect at once


class _Handler(BaseHTTPRequestHandler):
    """HTTP/1.1 with keep-alive; every answer is JSON, errors as ``{"error": message, "status": code}``."""

    protocol_version = "HTTP/1.1"
    server_version = "pmi-reward"
    app: RewardServer

    def setup(self) -> None:
        super().setup()
        self.app._connect(self.connection, True)

    def finish(self) -> None:
        self.app._connect(self.connection, False)
        super().finish()

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's signature
        logger.debug("%s %s", self.address_string(), format % args)

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """Protocol errors the base class detects (bad request line, unknown method, ...), answered in JSON;
        an unknown method or HTTP version is the client's mistake (4xx), not the server's (501/505)."""
        if code == HTTPStatus.NOT_IMPLEMENTED:
            code, message = 405, f"method {self.command!r} is not supported"
        elif code == HTTPStatus.HTTP_VERSION_NOT_SUPPORTED:
            code, self.request_version = 400, "HTTP/1.1"  # answer with a status line the client can read
        self.close_connection = True
        self.app._busy(self.connection, True)
        try:
            self._send(code, {"error": message or HTTPStatus(code).phrase, "status": code})
        except OSError:
            pass
        finally:
            self.app._busy(self.connection, False, code)

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_PUT(self) -> None:
        self._handle("PUT")

    def do_DELETE(self) -> None:
        self._handle("DELETE")

    def do_PATCH(self) -> None:
        self._handle("PATCH")

    def _handle(self, method: str) -> None:
        self.app._busy(self.connection, True)
        status = 500
        try:
            status, payload = self._answer(method)
            self._send(status, payload)
        except (BrokenPipeError, ConnectionResetError):  # the client left before its answer
            self.close_connection = True
        finally:
            self.app._busy(self.connection, False, status)

    def _answer(self, method: str) -> tuple[int, dict]:
        try:
            path = self.path.split("?", 1)[0]
            if path not in self.app.routes:
                self._skip_body()
                raise ApiError(404, f"no endpoint {path!r}; try {', '.join(sorted(self.app.routes))}")
            allowed, endpoint = self.app.routes[path]
            if method != allowed:
                self._skip_body()
                raise ApiError(405, f"{path} takes {allowed}, not {method}")
            body = self._read_json() if method == "POST" else self._skip_body() or {}
            return 200, endpoint(body)
        except ApiError as err:
            return err.status, {"error": err.message, "status": err.status}
        except (ScoreTimeout, BatcherClosed) as err:
            return 503, {"error": f"server busy or shutting down: {err}", "status": 503}
        except Exception as err:  # noqa: BLE001 - answer, log, and keep serving
            logger.exception("pmi-reward serve: %s %s failed", method, self.path)
            return 500, {"error": f"internal error: {type(err).__name__}: {err}", "status": 500}

    def _length(self) -> int | None:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            self.close_connection = True
            raise ApiError(411, "chunked bodies are not supported; send a Content-Length")
        raw = self.headers.get("Content-Length")
        if raw is None:
            return None
        try:
            length = int(raw)
        except ValueError:
            length = -1
        if length < 0:
            self.close_connection = True
            raise ApiError(400, f"invalid Content-Length {raw!r}")
        return length

    def _skip_body(self) -> None:
        length = self._length() or 0
        if length > self.app.config.max_body_bytes:
            self.close_connection = True
        elif length:
            self.rfile.read(length)

    def _read_json(self) -> dict:
        length = self._length()
        if length is None:
            self.close_connection = True
            raise ApiError(411, "a JSON body with a Content-Length is required")
        limit = self.app.config.max_body_bytes
        if length > limit:
            self.close_connection = True  # the unread body makes the connection unusable
            raise ApiError(413, f"body of {length} bytes exceeds the limit of {limit} bytes")
        data = self.rfile.read(length)
        if len(data) < length:
            self.close_connection = True
            raise ApiError(400, f"body ended after {len(data)} of {length} bytes")
        try:
            body = json.loads(data, parse_constant=_reject_constant)
        except (ValueError, RecursionError) as err:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            raise ApiError(400, f"body is not valid JSON: {err}") from None
        if not isinstance(body, dict):
            raise ApiError(422, f"body must be a JSON object, got {_type(body)}")
        return body

    def _send(self, status: int, payload: dict) -> None:
        data = json.dumps(payload, allow_nan=False).encode("ascii")
        if self.app.closing:
            self.close_connection = True
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if status == 503:
            self.send_header("Retry-After", "1")
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not valid JSON")


def serve(scorer: PMIScorer, config: ServerConfig, options: RewardOptions | None = None) -> None:
    """Serve until SIGINT or SIGTERM, then drain in-flight requests and exit."""
    server = RewardServer(scorer, config, options)
    closer = threading.Thread(target=server.close, name="pmi-server-close")

    def stop(signum: int, frame: Any) -> None:
        logger.info("pmi-reward serve: %s received, draining", signal.Signals(signum).name)
        if not closer.is_alive() and not server.closing:
            closer.start()

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    logger.info("pmi-reward serve: listening on %s (POST /get_reward /score /rerank, GET /health)", server.url)
    try:
        server.serve_forever()
    finally:
        if closer.is_alive():
            closer.join()
        else:
            server.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    logger.info("pmi-reward serve: stopped (%s)", dict(server.responses))

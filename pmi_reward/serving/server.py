"""The PMI reward over HTTP: a JSON service for engines that keep the reward model on its own device or host.

Routes: ``POST /get_reward`` (OpenRLHF), ``POST /score``, ``POST /rerank`` (``endpoints``) and ``GET /health``
(here: liveness, the scorer's description, counters); ``docs/serving.md`` has the full protocol.

Concurrent requests are merged into bounded encoder batches, filled fairly (``MicroBatcher``); bodies, JSON
values, items and characters per request are bounded (413), malformed input gets a 4xx with a message naming the
field (never a 5xx), each request has a time limit from its arrival (503), connections are capped (one over the cap
waits for a free one, up to ``queue_timeout``, then 503; meanwhile every answer closes its keep-alive connection, and
an idle one keeps its slot until its next request or ``idle_timeout``) and closed when idle (a new one as soon as
its request line and headers take over ``header_timeout``), and ``close()`` drains in-flight requests, answering new
ones 503, before it stops. Built on the standard library's threaded HTTP server (``handler``), which checks what its
parser lets through; ``docs/serving.md`` (Security).
"""

from __future__ import annotations

import contextlib
import logging
import signal
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from ..rewards.batching import MicroBatcher
from ..rewards.options import RewardOptions
from ..rewards.remote import is_loopback
from ..scoring.scorer import PMIScorer
from .config import ServerConfig
from .endpoints import ApiError, Endpoints, check_options
from .handler import Handler, HTTPServer

__all__ = ["ServerConfig", "RewardServer", "ApiError", "serve"]

logger = logging.getLogger(__name__)


class RewardServer:
    """A PMIScorer behind HTTP. ``start()`` serves from a background thread; ``close()`` shuts down gracefully."""

    def __init__(
        self, scorer: PMIScorer, config: ServerConfig | None = None, options: RewardOptions | None = None
    ) -> None:
        self.scorer, self.config = scorer, config or ServerConfig()
        options = (options or RewardOptions()).resolved(scorer.context_turns)
        check_options(options)  # before any thread starts
        c = self.config
        self.batcher = MicroBatcher(scorer, c.max_batch_pairs, c.max_wait_ms, c.max_batch_chars, c.chunk_pairs)
        self.api = Endpoints(self.batcher, self.config, options)
        self.routes: dict[str, tuple[str, Callable[[dict, float, Callable[[], bool]], dict]]] = {
            "/get_reward": ("POST", self.api.get_reward),
            "/score": ("POST", self.api.score_pairs),
            "/rerank": ("POST", self.api.rerank),
            "/health": ("GET", lambda body, deadline, alive: self.health()),
        }
        self.responses: Counter = Counter()
        self.closing = False
        self._started = time.time()
        self._lock = threading.Condition()
        self._connections: dict[socket.socket, bool] = {}  # open connection -> busy with a request
        self._deadlines: dict[socket.socket, float] = {}  # connection -> when it must have sent its request
        self._full_since: float | None = None  # when a connection first found the cap full, none admitted since
        self.waiters = 0  # connections waiting in _admit for a slot: while any do, every answer closes its connection
        self._inflight = 0
        self._thread: threading.Thread | None = None
        self._serving = threading.Event()
        self._running = False  # serve_forever() has started its loop (or is about to)
        self._stopped = threading.Event()
        handler = type("Handler", (Handler,), {"app": self, "timeout": self.config.idle_timeout})
        self.httpd = HTTPServer((self.config.host, self.config.port), handler, self)
        if not self.config.api_key and not is_loopback(self.config.host):
            logger.warning(
                "pmi-reward serve: LISTENING ON %s WITHOUT AN API KEY: anyone who can reach this port can use the "
                "scorer. Set PMI_REWARD_API_KEY (or --api_key), or bind to 127.0.0.1 behind a reverse proxy "
                "(docs/serving.md, Security).",
                self.config.host,
            )
        threading.Thread(target=self._reap, name="pmi-reaper", daemon=True).start()

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        name = host.decode() if isinstance(host, bytes) else str(host)
        return f"http://[{name}]:{port}" if ":" in name else f"http://{name}:{port}"

    # -- life cycle ---------------------------------------------------------------------------------
    def serve_forever(self) -> None:
        """Serve until ``close()`` (from another thread or a signal handler); at once if it was closed already (a
        SIGTERM between start-up and this call)."""
        with self._lock:
            self._running = not self.closing
        self._serving.set()
        if self._running:
            self.httpd.serve_forever(poll_interval=0.1)

    def start(self) -> RewardServer:
        """Serve from a background thread; returns once the server accepts connections."""
        self._thread = threading.Thread(target=self.serve_forever, name="pmi-server", daemon=True)
        self._thread.start()
        self._serving.wait()
        return self

    def close(self) -> None:
        """Drain: answer new connections and requests 503, close idle keep-alive connections, let in-flight requests
        finish (up to ``drain_timeout``); then stop listening and stop the batcher."""
        with self._lock:
            if self.closing:
                return
            self.closing = True
            self._lock.notify_all()  # a connection waiting for a free slot (_admit) is refused now, not at its timeout
            running = self._running  # serve_forever() runs, or never will: it checks ``closing`` under this lock
            idle = [conn for conn, busy in self._connections.items() if not busy]
        for conn in idle:  # idle keep-alive connections would otherwise wait for their next request
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        deadline = time.monotonic() + self.config.drain_timeout  # one budget for the whole drain
        with self._lock:
            if not self._lock.wait_for(lambda: self._inflight == 0, timeout=self.config.drain_timeout):
                logger.warning(
                    "pmi-reward serve: %d requests still running after %.0f s; closing anyway",
                    self._inflight,
                    self.config.drain_timeout,
                )
        if running:
            self.httpd.shutdown()
        self._stopped.set()
        self.batcher.close(timeout=max(0.0, deadline - time.monotonic()))
        self.httpd.server_close()
        if self._thread is not None:
            self._thread.join()

    def __enter__(self) -> RewardServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # bookkeeping used by the HTTP layer
    def _admit(self, conn: socket.socket) -> str | None:
        """Take a new connection (None), or say why it is refused (draining, or the cap full for too long).

        Called by the accept loop. Over the cap it waits for a connection to close: OpenRLHF >= 0.9.1 opens one
        connection per sample, the whole rollout's at once, and verl's reward loop calls from up to 256 threads, so
        a 503 at once failed samples that a moment's wait would have served. Meanwhile the connections behind this
        one wait unaccepted in the kernel's listen backlog, with no thread. The wait is bounded by ``queue_timeout``
        from when a connection first found the server full, not from each one's accept: once the server has been
        full that long (overloaded, or its clients stuck), each new connection is refused at once until one closes,
        rather than every queued one waiting ``queue_timeout`` in turn. ``close()`` wakes the wait, to refuse it at
        once. While it waits (``waiters``), every answer the server sends says ``Connection: close`` and closes its
        connection, so that keep-alive clients (a pooled ``requests.Session`` or aiohttp session) give their slots
        up: they read that header before they reuse a connection, so no request is sent on a connection
        being closed (closing idle ones from here raced with clients sending on them). A connection already idle
        when the cap filled keeps its slot until its next request is answered or ``idle_timeout`` closes it."""
        cap = self.config.max_connections
        with self._lock:
            if not self.closing and len(self._connections) >= cap:
                if self._full_since is None:
                    self._full_since = time.monotonic()
                left = self._full_since + self.config.queue_timeout - time.monotonic()
                self.waiters += 1
                try:
                    self._lock.wait_for(lambda: self.closing or len(self._connections) < cap, timeout=max(0.0, left))
                finally:
                    self.waiters -= 1
            if self.closing:
                return "the server is shutting down; retry on another"
            if len(self._connections) >= cap:
                return (
                    f"too many connections (the limit is {cap}, none closed within {self.config.queue_timeout:g} s); "
                    "retry"
                )
            self._full_since = None
            self._connections[conn] = False
            return None

    def _disconnect(self, conn: socket.socket) -> None:
        """A connection closed: its slot is free for one waiting in ``_admit``."""
        with self._lock:
            self._connections.pop(conn, None)
            self._deadlines.pop(conn, None)
            self._lock.notify_all()

    def _waiting(self, conn: socket.socket, waiting: bool, timeout: float | None = None) -> None:
        """A connection starts (True) or ends (False) waiting for (part of) its next request, which it must have sent
        within ``timeout`` seconds (default ``idle_timeout``), else the reaper closes it."""
        with self._lock:
            if waiting:
                self._deadlines[conn] = time.monotonic() + (self.config.idle_timeout if timeout is None else timeout)
            else:
                self._deadlines.pop(conn, None)

    def _busy(self, conn: socket.socket, busy: bool, status: int | None = None) -> None:
        with self._lock:
            if conn in self._connections:
                self._connections[conn] = busy
            self._inflight += 1 if busy else -1
            if status is not None:
                self.responses[status] += 1
            self._lock.notify_all()

    def _reap(self) -> None:
        """Close connections that did not send a complete request in time (idle keep-alive, slow senders)."""
        while not self._stopped.wait(0.25):
            now = time.monotonic()
            with self._lock:
                late = [conn for conn, deadline in self._deadlines.items() if deadline < now]
                for conn in late:
                    del self._deadlines[conn]
            for conn in late:
                logger.debug("pmi-reward serve: closing a connection that did not send its request in time")
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)

    # -- GET /health -------------------------------------------------------------------------------
    def health(self) -> dict:
        """Liveness and what is being served (clients read ``trained_context_turns`` from here)."""
        with self._lock:
            inflight, responses, connections = self._inflight, dict(self.responses), len(self._connections)
        spec = self.scorer.encoder.spec
        return {
            "status": "ok",  # while draining, requests (this one too) are answered 503 before they get here
            "scorer": {
                "encoder": spec.model,
                "input_mode": self.scorer.input_mode,
                "cap": self.scorer.cap,
                "trained_context_turns": self.scorer.context_turns,
            },
            "reward_options": asdict(self.api.options),
            "batcher": self.batcher.stats.to_dict(),
            "queued": self.batcher.queued,
            "inflight": inflight,
            "connections": connections,
            "responses": responses,
            "uptime_s": round(time.time() - self._started, 1),
        }


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

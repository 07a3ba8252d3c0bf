"""HTTP/1.1 for the reward server: keep-alive connections, bounded JSON bodies, every answer JSON.

The handler reads a request, asks its ``RewardServer`` for the route's answer and writes it; protocol
errors the standard library detects are answered in JSON too. Errors are ``{"error": message, "status": code}``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol

from .batching import BatcherClosed, ScoreTimeout
from .config import ServerConfig
from .endpoints import ApiError, type_name

__all__ = ["HTTPServer", "Handler", "App"]

logger = logging.getLogger("pmi_reward.serving.server")


class App(Protocol):
    """What a handler needs from its server (``RewardServer``): the routes, the limits, and the bookkeeping of
    open connections and in-flight requests that a graceful shutdown waits for."""

    routes: dict[str, tuple[str, Callable[[dict], dict]]]
    config: ServerConfig
    closing: bool

    def _connect(self, conn: Any, open_: bool) -> None: ...

    def _busy(self, conn: Any, busy: bool, status: int | None = None) -> None: ...


class HTTPServer(ThreadingHTTPServer):
    daemon_threads = True  # a stuck client must not keep the process alive after the drain
    request_queue_size = 1024  # the default backlog of 5 resets connections when many clients connect at once


class Handler(BaseHTTPRequestHandler):
    """HTTP/1.1 with keep-alive; every answer is JSON, errors as ``{"error": message, "status": code}``."""

    protocol_version = "HTTP/1.1"
    server_version = "pmi-reward"
    app: App

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
            if method == "POST":
                body = self._read_json()
            else:
                self._skip_body()
                body = {}
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
            raise ApiError(422, f"body must be a JSON object, got {type_name(body)}")
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

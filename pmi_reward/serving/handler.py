"""HTTP/1.1 for the reward server: keep-alive connections, bounded JSON bodies, every answer JSON.

The standard library reads request lines and headers (``http.server``); what it lets through is checked here
before any body is read: the API key (``Authorization: Bearer``, compared in constant time), the route and
method, ``Content-Type: application/json`` (a cross-origin page cannot send that without a preflight), exactly
one well-formed ``Content-Length`` and no ``Transfer-Encoding`` (no request smuggling behind a proxy); a body's
JSON values are counted before it is parsed (``json_values``: the parser holds the interpreter lock). Every
answer is JSON with a status line, errors as ``{"error": message, "status": code}``; each request is logged once
at INFO on ``pmi_reward.serving.access`` (client, method, path, status, items, milliseconds; never a body or key).
A connection over the server's cap is held by the accept loop until a slot frees (it waits in the app's
``_admit``), up to its ``queue_timeout``; meanwhile every answer carries ``Connection: close`` and ends its
connection, so that keep-alive clients free their slots. One still over the cap then, and every new one while the
server drains, gets a ``503`` from ``Refuser`` without a thread of its own.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import logging
import queue
import re
import select
import socket
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from json.decoder import scanstring  # type: ignore[attr-defined]
from typing import Any, Protocol

from ..rewards.batching import BatcherClosed, ClientGone, ScoreTimeout
from .config import ServerConfig
from .endpoints import ApiError, items_of, text_chars, type_name

__all__ = ["HTTPServer", "Handler", "App", "Refuser", "json_values"]

logger = logging.getLogger("pmi_reward.serving.server")
access = logging.getLogger("pmi_reward.serving.access")

_DIGITS = re.compile(r"[0-9]{1,15}")
_MARKS = '[{,:"'  # where a JSON value's place begins (brackets, braces, commas, colons), and strings


def json_values(text: str, limit: int) -> int:
    """How many JSON values (keys included) a body holds at most: one more than its brackets, braces, commas and
    colons outside strings, counted only up to ``limit + 1``, before anything is parsed.

    ``json.loads`` holds the interpreter lock for the whole parse, in time linear in the number of values (a 16 MiB
    body of ``[0,0,...]``: seconds, with every other request and ``/health`` waiting), so that number is what must be
    bounded. A body whose raw count of those characters is within ``limit`` is not scanned (nearly every body).
    Otherwise the scan takes one step per mark and per string, at most ``2 x limit + 1`` steps (in JSON a string that
    is not the whole body follows a mark; a body that takes more, strings back to back, is not JSON and counts as over
    the limit), other threads running between them; strings are skipped by the C string
    scanner of ``json`` (escapes and all, no longer than parsing them will take), marks found with ``str.find``."""
    raw = text.count(",") + text.count(":") + text.count("[") + text.count("{")
    if raw < limit:
        return raw + 1
    following = {mark: text.find(mark) for mark in _MARKS}  # each mark's next place at or after pos (-1: none)
    count = pos = steps = 0
    while count < limit:
        steps += 1
        if steps > 2 * limit + 1:  # strings back to back: not JSON, and a scan of one step per string
            return limit + 1
        for mark, at in following.items():
            if 0 <= at < pos:
                following[mark] = text.find(mark, pos)
        at = min((at for at in following.values() if at >= 0), default=-1)
        if at < 0:
            break
        if text[at] == '"':
            try:
                pos = scanstring(text, at + 1)[1]
            except ValueError:  # not a valid string: the parser will refuse the body
                break
        else:
            count, pos = count + 1, at + 1
    return count + 1


class App(Protocol):
    """What the HTTP layer needs from its server (``RewardServer``): the routes, the limits, and the bookkeeping of
    open connections and in-flight requests that the connection cap, the idle timeout and the drain rely on."""

    routes: dict[str, tuple[str, Callable[[dict, float, Callable[[], bool]], dict]]]
    config: ServerConfig
    closing: bool
    waiters: int  # connections waiting for a slot over the cap: answers close their connection meanwhile

    def _admit(self, conn: Any) -> str | None: ...

    def _disconnect(self, conn: Any) -> None: ...

    def _waiting(self, conn: Any, waiting: bool, timeout: float | None = None) -> None: ...

    def _busy(self, conn: Any, busy: bool, status: int | None = None) -> None: ...


def _response(status: int, payload: dict, extra: dict[str, str] | None = None, close: bool = False) -> bytes:
    """A whole HTTP/1.1 response with a JSON body."""
    data = json.dumps(payload, allow_nan=False).encode("ascii")
    headers = {"Server": "pmi-reward", "Content-Type": "application/json", "Content-Length": str(len(data))}
    headers.update(extra or {})
    if close:
        headers["Connection"] = "close"
    head = f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    return head.encode("latin-1") + b"\r\n" + data


UNREAD_FACTOR = 4  # a body refused unread is read and dropped after the answer up to this many times the body limit
UNREAD_CHUNK = 1 << 16  # ... in reads of at most this many bytes: a refused body is never held whole


class Refuser:
    """Answers connections the server will not serve (over the cap for too long, or while draining) with ``503``, on
    one thread and without blocking: the answer is sent at once, then the connection lingers half-closed for
    ``linger`` seconds (what the client sends meanwhile is read and dropped, so that it sees the answer rather than a
    reset)."""

    def __init__(self, linger: float = 0.5, backlog: int = 1024) -> None:
        self.linger, self.backlog = linger, backlog
        self._queue: queue.SimpleQueue[tuple[socket.socket, str, str]] = queue.SimpleQueue()
        threading.Thread(target=self._run, name="pmi-refuser", daemon=True).start()

    def refuse(self, conn: socket.socket, client: str, reason: str) -> None:
        self._queue.put((conn, client, reason))

    def _run(self) -> None:
        lingering: deque[tuple[float, socket.socket]] = deque()
        while True:
            wait = max(0.0, lingering[0][0] - time.monotonic()) if lingering else None
            try:
                conn, client, reason = self._queue.get(timeout=wait)
            except queue.Empty:
                pass
            else:
                try:
                    conn.setblocking(False)
                    conn.send(_response(503, {"error": reason, "status": 503}, {"Retry-After": "1"}, close=True))
                    conn.shutdown(socket.SHUT_WR)
                except OSError:
                    pass
                lingering.append((time.monotonic() + self.linger, conn))
                access.info("%s - - 503 items=- ms=0.0 (%s)", client, reason)
            while lingering and (lingering[0][0] <= time.monotonic() or len(lingering) > self.backlog):
                _, done = lingering.popleft()
                with contextlib.suppress(OSError):
                    while done.recv(1 << 16):  # what arrived meanwhile, so that closing sends no reset
                        pass
                done.close()


class HTTPServer(ThreadingHTTPServer):
    """A thread per admitted connection, up to the app's cap. Over the cap the accept loop waits in ``_admit`` for a
    free slot, the connections behind it queued unaccepted in the listen backlog; those refused get no thread."""

    daemon_threads = True  # a stuck client must not keep the process alive after the drain
    # the listen backlog, where connections over the cap wait (the kernel caps it at net.core.somaxconn); the
    # default of 5 reset connections when many clients connected at once
    request_queue_size = 1024

    def __init__(self, address: tuple[str, int], handler: type[Handler], app: App) -> None:
        self.app, self.refuser = app, Refuser()
        host, port = address
        if ":" in host:  # an IPv6 address (::1, ::, [::1]): the base class's socket is IPv4 only
            self.address_family, address = socket.AF_INET6, (host.strip("[]"), port)
        super().__init__(address, handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        reason = self.app._admit(request)
        if reason is not None:
            self.refuser.refuse(request, str(client_address[0]), reason)
            return
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        self.app._disconnect(request)
        super().shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A connection's handler raised. A socket error (the client left, reset, or timed out) is the client's
        doing and is logged in one DEBUG line; socketserver's default printed a raw traceback to stderr for each,
        which anyone who can reach the port could repeat. Anything else is a bug: logged with its traceback."""
        err = sys.exc_info()[1]
        client = client_address[0] if isinstance(client_address, tuple) and client_address else client_address
        if isinstance(err, OSError):
            logger.debug("pmi-reward serve: connection from %s ended: %s: %s", client, type(err).__name__, err)
        else:
            logger.exception("pmi-reward serve: unexpected error on a connection from %s", client)


class Handler(BaseHTTPRequestHandler):
    """HTTP/1.1 with keep-alive; every answer is JSON, errors as ``{"error": message, "status": code}``."""

    protocol_version = "HTTP/1.1"
    server_version = "pmi-reward"
    app: App
    _probed = False  # the client's end of input was seen while its request waited: _client_alive wrote a 100
    _headers_at = 0.0  # when the current request's headers were in (monotonic): its body has idle_timeout from then
    _requests = 0  # requests begun on this connection: the first one's line and headers get header_timeout
    _unread_within: float | None = None  # seconds to drop a refused body in (None: idle_timeout); _skip_body

    def version_string(self) -> str:
        return self.server_version  # no Python version in the Server header

    def handle_one_request(self) -> None:
        self._start, self._logged, self._arrived = time.perf_counter(), False, time.monotonic()
        self._items: int | None = None
        self._unread, self._unread_within, self._probed = 0, None, False
        self._requests += 1
        # until its request line and headers are in: a new connection has header_timeout, a keep-alive one
        # idle_timeout (parse_request then gives the body idle_timeout from the headers)
        self.app._waiting(self.connection, True, self._header_timeout() if self._requests == 1 else None)
        super().handle_one_request()

    def _header_timeout(self) -> float:
        """Seconds a new connection has for its first request line and headers: ``header_timeout``, at most
        ``idle_timeout``."""
        config = self.app.config
        return min(config.header_timeout, config.idle_timeout)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's signature
        logger.debug("%s %s", self.address_string(), format % args)

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        """One access-log line per answer, at INFO: client, method, path (no query), status, items, milliseconds."""
        if self._logged:
            return
        self._logged = True
        path = (getattr(self, "path", None) or "-").split("?", 1)[0][:200]
        access.info(
            '%s "%s %s" %s items=%s ms=%.1f',
            self.client_address[0],
            self.command or "-",
            path.encode("unicode_escape").decode("ascii"),
            int(code) if str(code).isdigit() else code,
            "-" if self._items is None else self._items,
            (time.perf_counter() - self._start) * 1000,
        )

    def parse_request(self) -> bool:
        self._start = time.perf_counter()  # the request line is in: the request's time starts
        if not super().parse_request():
            return False
        if self.request_version == "HTTP/0.9":  # a two-word request line: it would get no status line
            self.send_error(400, "HTTP/0.9 requests are not supported")
            return False
        self._headers_at = time.monotonic()  # before the reaper's deadline is set: it cannot fire earlier from here
        self.app._waiting(self.connection, True)  # the headers are in: the body has idle_timeout from here
        return True

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """Protocol errors the base class detects (bad request line, unknown method, ...), answered in JSON with a
        status line; an unknown method or HTTP version is the client's mistake (4xx), not the server's (501/505)."""
        if code == HTTPStatus.NOT_IMPLEMENTED:
            code, message = 405, f"method {self.command!r} is not supported"
        elif code == HTTPStatus.HTTP_VERSION_NOT_SUPPORTED:
            code = 400
        if not str(self.request_version).startswith("HTTP/1."):
            self.request_version = "HTTP/1.1"  # answer with a status line the client can read
        self.close_connection = True
        self.app._busy(self.connection, True)
        try:
            self._send(code, {"error": message or HTTPStatus(code).phrase, "status": code})
        except OSError:
            pass
        finally:
            self.app._busy(self.connection, False, int(code))

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
            try:
                self._send(status, payload)
            except (ValueError, TypeError) as err:  # an answer JSON cannot hold: a clear 500, not a dropped socket
                logger.error("pmi-reward serve: %s %s: cannot encode the answer: %s", method, self.path, err)
                status = 500
                self.close_connection = True
                self._send(status, {"error": "the server could not encode its answer; see its log"})
            self._drop_unread()
        except OSError:  # the client left before its answer, or the idle timeout closed its socket
            self.close_connection = True
        finally:
            self.app._busy(self.connection, False, status)

    def _answer(self, method: str) -> tuple[int, dict]:
        try:
            if self.app.closing:
                self.close_connection = True
                raise ApiError(503, "the server is shutting down; retry on another")
            path = self.path.split("?", 1)[0]
            if not self._authorized():  # answered before any body byte is read, dropped within header_timeout
                self._skip_body(self._header_timeout())
                self.close_connection = True  # a keyless client gets no keep-alive slot to come back on
                raise ApiError(401, "missing or wrong API key; send 'Authorization: Bearer <key>'")
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
                self._arrived, body = time.monotonic(), {}
            self.app._waiting(self.connection, False)
            return 200, endpoint(body, self._arrived + self.app.config.request_timeout, self._client_alive)
        except ApiError as err:
            return err.status, {"error": err.message, "status": err.status}
        except ClientGone as err:
            self.close_connection = True
            return 503, {"error": str(err), "status": 503}
        except (ScoreTimeout, BatcherClosed) as err:
            return 503, {"error": f"server busy or shutting down: {err}", "status": 503}
        except Exception as err:  # noqa: BLE001 - answer, log, and keep serving
            logger.exception("pmi-reward serve: %s %s failed", method, self.path)
            return 500, {"error": f"internal error: {type(err).__name__}: {err}", "status": 500}

    def _client_alive(self) -> bool:
        """Whether the client may still read its answer: False once it closed or reset the connection (a pipelined
        next request makes the socket readable too, and counts as alive).

        The end of its input alone does not tell: a client that closed its socket and one that only shut down its
        sending side (and reads on, as some clients do) both send it. So the first time it is seen, the client is
        sent an interim ``100 Continue`` (which HTTP/1.1 clients must accept, and skip, before any answer): a closed
        socket answers it with a reset, seen at the next check (``POLLERR``, or the peek raising), a half-closed one
        takes it and stays alive. ``POLLHUP`` alone does not mean gone: macOS's poll sets it as soon as the client's
        end of input arrives (kqueue's ``EV_EOF``), half-closed or not, so it goes on to the peek and the probe too.
        An HTTP/1.0 client (no 1xx may be sent to it) is taken for gone at the end of its input."""
        try:
            poller = select.poll()  # not select.select: it refuses descriptors past 1023, as a busy server has
            poller.register(self.connection, select.POLLIN)
            events = poller.poll(0)
            if not events:
                return True
            if events[0][1] & (select.POLLERR | select.POLLNVAL):  # reset, or the descriptor no longer open
                return False
            if self.connection.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) != b"":
                return True
            if self.request_version != "HTTP/1.1":  # no 1xx to an HTTP/1.0 client: its end is taken for gone
                return False
            if not self._probed:  # the end of its input: closed, or half-closed?
                self._probed = True
                self.wfile.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            return True
        except BlockingIOError:
            return True
        except (OSError, ValueError):  # reset, or the socket already closed (ValueError: its descriptor is -1)
            return False

    def _authorized(self) -> bool:
        key = self.app.config.api_key
        if not key:
            return True
        scheme, _, token = (self.headers.get("Authorization") or "").strip().partition(" ")
        given = token.strip().encode("latin-1", "replace")
        return scheme.lower() == "bearer" and hmac.compare_digest(given, key.encode("latin-1", "replace"))

    def _length(self) -> int | None:
        """The body's length: one Content-Length of digits only; no Transfer-Encoding (chunked or otherwise)."""
        if self.headers.get_all("Transfer-Encoding"):
            self.close_connection = True
            raise ApiError(411, "Transfer-Encoding (chunked bodies) is not supported; send a Content-Length")
        values = self.headers.get_all("Content-Length") or []
        if not values:
            return None
        if len(values) > 1:
            self.close_connection = True
            raise ApiError(400, f"{len(values)} Content-Length headers ({', '.join(map(repr, values))}); send one")
        if not _DIGITS.fullmatch(values[0].strip()):
            self.close_connection = True
            raise ApiError(400, f"invalid Content-Length {values[0]!r}")
        return int(values[0])

    def _skip_body(self, within: float | None = None) -> None:
        """A request refused before its body (401, 404, 405, 415, a GET with a body): its body is not read before the
        answer, nor ever held whole. It is read and dropped after the answer, in chunks, and the connection closed
        (``_drop_unread``), all within ``within`` seconds (default ``idle_timeout``): reading it first held a whole
        ``max_body_bytes`` per connection, from clients without the key too, before their 401."""
        try:
            length = self._length() or 0
        except ApiError:
            return
        if length:
            self.close_connection = True
            self._unread, self._unread_within = length, within

    def _drop_unread(self) -> None:
        """After the answer to a body refused unread (over ``max_body_bytes``, or refused before its body): half-close,
        then read and drop the body in chunks of ``UNREAD_CHUNK`` bytes, up to ``UNREAD_FACTOR`` times the limit, all
        of it within the idle timeout (a 401's within the header timeout: a client without the key must not hold a
        slot for longer). A client that sends its whole body before it reads (http.client, aiohttp) then gets the
        answer, a 413 it can split its request on (``RemotePMIReward`` does); closed with the body unread, it saw a
        broken pipe or a reset instead."""
        if not self._unread:
            return
        left, self._unread = min(self._unread, UNREAD_FACTOR * self.app.config.max_body_bytes), 0
        self.app._waiting(self.connection, True, self._unread_within)  # the reaper closes it after that
        self.wfile.flush()
        self.connection.shutdown(socket.SHUT_WR)
        while left > 0:
            chunk = self.rfile.read1(min(left, UNREAD_CHUNK))
            if not chunk:
                return
            left -= len(chunk)

    def _read_json(self) -> dict:
        length = self._length()
        media = (self.headers.get("Content-Type") or "").split(";", 1)[0].strip().lower()
        if media != "application/json":
            self._skip_body()
            raise ApiError(415, f"send JSON with 'Content-Type: application/json' (got {media or 'none'!r})")
        if length is None:
            self.close_connection = True
            raise ApiError(411, "a JSON body with a Content-Length is required")
        limit = self.app.config.max_body_bytes
        if length > limit:
            self.close_connection = True
            self._unread = length  # read and dropped once the answer is out (_drop_unread)
            raise ApiError(413, f"body of {length} bytes exceeds the limit of {limit} bytes")
        timeout = self.app.config.idle_timeout
        late = f"the body ({length} bytes) was not received in time (idle_timeout {timeout:g} s)"
        try:
            data = self.rfile.read(length)
        except OSError:  # reset mid-body (or a socket timeout, where one is set): the client's doing, not a 500
            self.close_connection = True  # the stream is mid-body, and a timed-out socket file cannot be read again
            raise ApiError(408, late) from None
        self._arrived = time.monotonic()  # the request's time limit starts: parsing and scoring count against it
        if len(data) < length:
            self.close_connection = True
            if self._arrived - self._headers_at >= timeout:  # the reaper shut the socket of a body that stalled
                raise ApiError(408, late)
            raise ApiError(400, f"body ended after {len(data)} of {length} bytes")
        try:
            text = data.decode(json.detect_encoding(data), "surrogatepass")  # as json.loads decodes bytes
        except ValueError as err:
            raise ApiError(400, f"body is not valid JSON: {err}") from None
        values = self.app.config.max_json_values
        if json_values(text, values) > values:
            raise ApiError(413, f"body holds more than {values} JSON values (the limit per request); send fewer items")
        try:
            body = json.loads(text, parse_constant=_reject_constant)
        except (ValueError, RecursionError) as err:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            raise ApiError(400, f"body is not valid JSON: {err}") from None
        if not isinstance(body, dict):
            raise ApiError(422, f"body must be a JSON object, got {type_name(body)}")
        self._items = items_of(body)
        chars, limit = text_chars(body), self.app.config.max_request_chars
        if chars > limit:
            raise ApiError(413, f"body holds {chars} characters of text; the limit is {limit} per request")
        return body

    def _send(self, status: int, payload: dict) -> None:
        """The answer; ``Connection: close`` (and the connection closed after it) while the server drains, or while
        a connection over the cap waits for a slot: a keep-alive client reads the header before it reuses the
        connection, so it gives the slot up without a request lost to a connection closed under it."""
        if self.app.closing or self.app.waiters:
            self.close_connection = True
        extra = {"Retry-After": "1"} if status == 503 else {}
        if status == 401:
            extra["WWW-Authenticate"] = 'Bearer realm="pmi-reward"'
        data = _response(status, payload, extra, self.close_connection)
        self.log_request(status)
        self.wfile.write(data)


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not valid JSON")

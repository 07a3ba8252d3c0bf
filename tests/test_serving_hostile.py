"""Hostile and careless clients at the connection level (review 31, hostile findings 2, 4 and 5): a body that stalls
mid-way, a client without the key that announces a large body, sockets that send nothing.

Each test runs a real server on 127.0.0.1 with the tiny scorer and timeouts of about a second; no assertion is on a
tight wall time (the machine is shared): a bound, where there is one, is several times what it checks."""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections.abc import Iterator

import pytest
from conftest import http

import pmi_reward.serving.handler as handler
from pmi_reward.serving.server import RewardServer, ServerConfig

KEY = "s3cret-key-for-tests"
AUTH = f"Authorization: Bearer {KEY}\r\n".encode()


@contextlib.contextmanager
def serving(scorer, **config) -> Iterator[RewardServer]:
    server = RewardServer(scorer, ServerConfig(port=0, max_pairs=64, request_timeout=30.0, **config)).start()
    try:
        yield server
    finally:
        server.close()


def connect(server: RewardServer, timeout: float = 10.0) -> socket.socket:
    host, port = server.httpd.server_address[:2]
    return socket.create_connection((host, port), timeout=timeout)


def read_until_closed(sock: socket.socket) -> bytes:
    """What the server sends until it closes (a reset counts as closed)."""
    chunks = []
    with contextlib.suppress(ConnectionResetError):
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def post_head(length: int, auth: bytes = b"", path: bytes = b"/score") -> bytes:
    return (
        b"POST " + path + b" HTTP/1.1\r\nHost: x\r\n" + auth
        + b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % length
    )  # fmt: skip


def wait_for(condition, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


# -- finding 5: a body that stalls -----------------------------------------------------------------------------
def test_a_stalled_body_is_answered_408_or_closed_never_500(tiny_scorer, caplog, capsys):
    """``Content-Length: 100`` with 11 bytes sent, then silence: answered ``500 internal error: TimeoutError`` with a
    traceback at ERROR and a second, raw one from socketserver (for clients without the key too). Now a keyed client
    gets a 408 (or the connection closed, when the reaper closes it first), one without the key its 401 at once, and
    nothing is counted as a 5xx nor logged with a traceback."""
    with caplog.at_level(logging.DEBUG, "pmi_reward.serving"), serving(tiny_scorer, api_key=KEY, idle_timeout=1.0) as s:
        for auth in (AUTH, AUTH, b""):
            with connect(s) as client:
                client.sendall(post_head(100, auth) + b'{"pairs": [')
                start = time.monotonic()
                answer = read_until_closed(client)
                if auth:
                    assert answer == b"" or answer.startswith(b"HTTP/1.1 408"), answer[:200]
                    assert b"not received in time" in answer or not answer
                else:
                    assert answer.startswith(b"HTTP/1.1 401"), answer[:200]
                    assert time.monotonic() - start < 5.0
        assert wait_for(lambda: not s._connections, 5.0)
        status, health = http(s.url, "GET", "/health", headers={"Authorization": f"Bearer {KEY}"})
        assert status == 200 and not any(int(code) >= 500 for code in health["responses"]), health["responses"]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info], caplog.text
    assert "Traceback" not in capsys.readouterr().err


def test_a_body_read_that_times_out_is_answered_408_and_closed(tiny_scorer, caplog, capsys):
    """The socket's read timeout alone, the reaper's deadline far away: the handler's own 408, with
    ``Connection: close``, and the connection closed (its socket file cannot be read after a timeout)."""
    with caplog.at_level(logging.DEBUG, "pmi_reward.serving"), serving(tiny_scorer, idle_timeout=30.0) as s:
        s.httpd.RequestHandlerClass.timeout = 0.5  # the socket timeout; the reaper still allows 30 s
        with connect(s) as client:
            client.sendall(post_head(100) + b'{"pairs": [')
            answer = read_until_closed(client)
        assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
        assert b"Connection: close" in answer and b"the body (100 bytes) was not received in time" in answer
        assert s.responses[408] == 1 and not s.responses[500]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info], caplog.text
    assert "Traceback" not in capsys.readouterr().err


def test_a_socket_error_in_a_connection_is_one_debug_line_not_a_raw_traceback(tiny_scorer, caplog, capsys):
    """socketserver's default ``handle_error`` printed a raw traceback to stderr for every connection that ended in a
    socket error (a timed-out or reset client); now it is one DEBUG line. Other errors keep their traceback, in the
    log."""
    with caplog.at_level(logging.DEBUG, "pmi_reward.serving.server"), serving(tiny_scorer) as s:
        try:
            raise TimeoutError("timed out")
        except OSError:
            s.httpd.handle_error(None, ("10.0.0.7", 5000))
        assert "Traceback" not in capsys.readouterr().err
        lines = [r for r in caplog.records if "10.0.0.7" in r.getMessage()]
        assert len(lines) == 1 and lines[0].levelno == logging.DEBUG and not lines[0].exc_info
        assert "TimeoutError: timed out" in lines[0].getMessage()
        try:
            raise KeyError("bug")
        except KeyError:
            s.httpd.handle_error(None, ("10.0.0.8", 5000))
        bug = [r for r in caplog.records if "10.0.0.8" in r.getMessage()]
        assert len(bug) == 1 and bug[0].levelno == logging.ERROR and bug[0].exc_info


# -- finding 2: a refused request's body is not read into memory -------------------------------------------------
class _Recording:
    """A handler's ``rfile`` that records how many bytes each ``read``/``read1`` asked for."""

    sizes: list[int] = []

    def __init__(self, rfile) -> None:
        self._rfile = rfile

    def read(self, n: int = -1) -> bytes:
        _Recording.sizes.append(n)
        return self._rfile.read(n)

    def read1(self, n: int = -1) -> bytes:
        _Recording.sizes.append(n)
        return self._rfile.read1(n)

    def __getattr__(self, name: str):
        return getattr(self._rfile, name)


def test_a_client_without_the_key_gets_401_before_its_body_which_is_never_held(tiny_scorer, monkeypatch):
    """A keyless client announcing a body of ``max_body_bytes`` made the server read it whole (``rfile.read(length)``)
    before the 401: 16 MiB held per connection for ``idle_timeout``. Now the 401 comes right after the headers, the
    body is dropped in reads of at most 64 KiB, the drop ends within ``header_timeout`` (a client dripping its body
    holds the slot no longer), and a client that sends its whole body first still reads the 401, not a reset."""
    limit = 1 << 20
    real_setup = handler.Handler.setup

    def setup(self) -> None:
        real_setup(self)
        self.rfile = _Recording(self.rfile)

    monkeypatch.setattr(handler.Handler, "setup", setup)
    _Recording.sizes = []
    with serving(tiny_scorer, api_key=KEY, max_body_bytes=limit, idle_timeout=30.0, header_timeout=1.0) as s:
        with connect(s, timeout=10.0) as client:
            client.sendall(post_head(limit) + b" " * 1000)  # 1000 bytes of the 1 MiB
            answer = client.recv(4096)  # was: no answer until idle_timeout (30 s), the body awaited whole
            assert answer.startswith(b"HTTP/1.1 401") and b"Connection: close" in answer, answer[:200]
            gone = False
            for _ in range(100):  # 10 s of dripping, ten times header_timeout
                try:
                    client.sendall(b" " * 100)
                except OSError:
                    gone = True
                    break
                if not s._connections:
                    gone = True
                    break
                time.sleep(0.1)
            assert gone, "the 401's body drop outlasted header_timeout"
        assert _Recording.sizes and max(_Recording.sizes) <= handler.UNREAD_CHUNK, max(_Recording.sizes)
        # a client that sends its whole body before it reads (http.client) gets the 401, not a broken pipe
        status, answer = http(s.url, "POST", "/score", b" " * (limit // 2))
        assert status == 401 and "API key" in answer["error"]
        assert http(s.url, "POST", "/score", b'{"pairs": []}', {"Authorization": f"Bearer {KEY}"})[0] == 200


# -- finding 4: a short header timeout for new connections --------------------------------------------------------
def test_a_new_connection_has_header_timeout_for_its_headers_and_then_idle_timeout(tiny_scorer):
    """A socket that sends nothing held its slot for ``idle_timeout`` (30 s), so 256 of them, without the key, made
    every keyed request wait ~30 s. A new connection now has ``header_timeout`` for its request line and headers;
    a keep-alive connection still has ``idle_timeout`` to send its next request, and a body ``idle_timeout`` after
    its headers."""
    with serving(tiny_scorer, idle_timeout=30.0, header_timeout=0.5) as s:
        silent, dripping = connect(s), connect(s)
        dripping.sendall(b"GET /health HTTP/1.1\r\nX-Slow: ")
        assert silent.recv(100) == b""  # closed by the server (the client's timeout is 10 s)
        closed = False
        for _ in range(50):  # a header byte every 0.1 s for up to 5 s
            try:
                dripping.sendall(b"a")
            except OSError:
                closed = True
                break
            time.sleep(0.1)
        assert closed or wait_for(lambda: len(s._connections) == 0, 1.0)
        silent.close()
        dripping.close()

        with connect(s) as kept:  # keep-alive: the next request after 1.5 s, three times header_timeout
            for _ in range(2):
                kept.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
                assert kept.recv(65536).startswith(b"HTTP/1.1 200")
                time.sleep(1.5)
        with connect(s) as slow_body:  # the headers at once, the body 1.5 s later
            body = b'{"pairs": [{"context": "Hi!", "response": "Hello."}]}'
            slow_body.sendall(post_head(len(body)))
            time.sleep(1.5)
            slow_body.sendall(body)
            assert slow_body.recv(65536).startswith(b"HTTP/1.1 200")


def test_header_timeout_is_capped_by_idle_timeout_and_checked(tiny_scorer):
    """``header_timeout`` above ``idle_timeout`` is not a longer allowance (a silent socket is closed at the idle
    timeout); a value a wait cannot take is refused, as the other timeouts are."""
    with serving(tiny_scorer, idle_timeout=0.5, header_timeout=60.0) as s, connect(s) as silent:
        start = time.monotonic()
        assert silent.recv(100) == b"" and time.monotonic() - start < 8.0
    for value in (0.0, float("inf"), float("nan"), threading.TIMEOUT_MAX * 2):
        with pytest.raises(ValueError, match="header_timeout must be > 0 and at most"):
            ServerConfig(header_timeout=value)


def test_a_body_that_stalls_after_its_headers_is_counted_408_not_400(tiny_scorer):
    """Part of the body sent some time after the headers, then silence: the reaper shuts the socket at idle_timeout,
    the read comes back short, and the request was counted ``400 body ended after 11 of 100 bytes`` (second look)."""
    with serving(tiny_scorer, idle_timeout=1.0) as s:
        for delay in (0.3, 0.6):
            with connect(s) as client:
                client.sendall(post_head(100))
                time.sleep(delay)
                client.sendall(b'{"pairs": [')
                answer = read_until_closed(client)
            assert answer == b"" or answer.startswith(b"HTTP/1.1 408"), answer[:200]
        assert wait_for(lambda: s.responses[408] == 2, 5.0), dict(s.responses)
        assert not s.responses[400]


def test_a_client_without_the_key_is_closed_after_its_401_even_without_a_body(tiny_scorer):
    """A keyless GET without a body kept its keep-alive connection: sending one every idle_timeout held a slot for
    ever, what header_timeout bounds for a client without the key (second look)."""
    with serving(tiny_scorer, api_key=KEY, idle_timeout=30.0, header_timeout=1.0) as s:
        with connect(s) as client:
            client.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            answer = read_until_closed(client)  # returns once the server closes: it would wait 30 s for keep-alive
        assert answer.startswith(b"HTTP/1.1 401"), answer[:200]
        assert b"Connection: close" in answer

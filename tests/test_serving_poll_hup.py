"""The server's client check (``Handler._client_alive``) under macOS's poll as well as Linux's.

macOS builds ``poll(2)`` on kqueue: a socket's read filter carries ``EV_EOF`` as soon as the peer's FIN arrives, and
XNU's poll turns ``EV_EOF`` into ``POLLHUP``, so a client that only shut down its sending side (a half-close) shows
``POLLHUP`` there, where Linux shows it only once both directions are shut. ``XnuSelect`` stands in for the handler's
``select`` module with a poll that answers as XNU's does (``POLLHUP`` added for a socket at its end of input, Linux's
flags otherwise), so that the macOS behaviour is checked on Linux: a half-closing client still gets its answer, and a
client that left is still let go."""

import json
import select
import socket
import time
from types import SimpleNamespace

import pytest
from test_server import SlowScorer

import pmi_reward.serving.handler as handler
from pmi_reward.serving.server import RewardServer, ServerConfig

REQUEST_HEAD = b"POST /score HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"


class XnuPoll:
    """``select.poll`` answering for a socket as XNU's poll does: ``POLLHUP`` once the peer's FIN arrived (kqueue's
    ``EV_EOF``, which a half-close sends too), Linux's own flags passed through otherwise."""

    def __init__(self) -> None:
        self._poll = select.poll()
        self._sockets: dict[int, socket.socket] = {}

    def register(self, fd: socket.socket | int, mask: int = select.POLLIN | select.POLLPRI | select.POLLOUT) -> None:
        if isinstance(fd, socket.socket):
            self._sockets[fd.fileno()] = fd
        self._poll.register(fd, mask)

    def poll(self, timeout: float | None = None) -> list[tuple[int, int]]:
        out = []
        for fd, events in self._poll.poll(timeout):
            sock = self._sockets.get(fd)
            if sock is not None and events & select.POLLIN and not events & select.POLLERR:
                try:
                    if sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b"":  # the peer's FIN: EV_EOF
                        events |= select.POLLHUP
                except OSError:
                    pass
            out.append((fd, events))
        return out


class XnuSelect:
    """The ``select`` module with its ``poll`` answering as macOS's (``XnuPoll``)."""

    def __getattr__(self, name: str):
        return XnuPoll if name == "poll" else getattr(select, name)


POLLS = {"linux": select, "macos": XnuSelect()}


@pytest.fixture(params=sorted(POLLS))
def poll_flavour(request, monkeypatch) -> str:
    """The handler's ``select`` module as Linux's or as macOS's poll answers."""
    monkeypatch.setattr(handler, "select", POLLS[request.param])
    return request.param


def _tcp_pair() -> tuple[socket.socket, socket.socket]:
    """A connected loopback TCP pair (server side, client side): a closed TCP peer resets, unlike a socketpair's."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        client = socket.create_connection(listener.getsockname()[:2])
        server, _ = listener.accept()
    return server, client


def _handler_on(sock: socket.socket, version: str = "HTTP/1.1") -> SimpleNamespace:
    """What ``_client_alive`` reads of a handler, on the server side of a connection."""
    return SimpleNamespace(
        connection=sock, request_version=version, _probed=False, wfile=SimpleNamespace(write=sock.sendall)
    )


def test_a_half_closed_client_stays_alive_and_is_probed_once(poll_flavour):
    """A client that shut down its sending side (and reads on) is alive at every check, whatever poll says of its
    end of input; it is sent one ``100 Continue``, then left alone."""
    server, client = _tcp_pair()
    with server, client:
        client.shutdown(socket.SHUT_WR)
        time.sleep(0.05)  # the FIN arrives
        conn = _handler_on(server)
        assert [handler.Handler._client_alive(conn) for _ in range(3)] == [True, True, True]
        client.settimeout(5)
        assert client.recv(100) == b"HTTP/1.1 100 Continue\r\n\r\n"
        time.sleep(0.05)
        assert handler.Handler._client_alive(conn)


def test_a_closed_client_is_gone_once_it_resets_the_probe(poll_flavour):
    """A client that closed its socket is probed at its end of input, and taken for gone once it resets the probe."""
    server, client = _tcp_pair()
    with server:
        client.close()
        time.sleep(0.05)
        conn = _handler_on(server)
        seen = [handler.Handler._client_alive(conn)]
        time.sleep(0.1)  # the reset arrives
        seen.append(handler.Handler._client_alive(conn))
        assert seen[-1] is False, seen


def test_an_http_1_0_client_at_its_end_of_input_is_gone(poll_flavour):
    """No 1xx may be sent to an HTTP/1.0 client: its end of input is taken for gone, under either poll."""
    server, client = _tcp_pair()
    with server, client:
        client.shutdown(socket.SHUT_WR)
        time.sleep(0.05)
        assert handler.Handler._client_alive(_handler_on(server, "HTTP/1.0")) is False


def _pairs(n: int) -> bytes:
    return json.dumps({"pairs": [{"context": f"context {i}", "response": f"reply {i}"} for i in range(n)]}).encode()


def test_a_half_closing_client_gets_its_200_from_the_server(tiny_scorer, poll_flavour):
    """End to end: 4 batches of at least 0.2 s each, so the request is checked several times after the client's
    half-close; under macOS's poll it was answered 503 ("the client closed its connection") at the first check."""
    config = ServerConfig(port=0, max_pairs=64, max_batch_pairs=1, chunk_pairs=1, request_timeout=30.0)
    server = RewardServer(SlowScorer(tiny_scorer, 0.2), config).start()
    try:
        body = _pairs(4)
        with socket.create_connection(server.httpd.server_address[:2], timeout=60) as client:
            client.sendall(REQUEST_HEAD % len(body) + body)
            client.shutdown(socket.SHUT_WR)
            answer = b""
            while chunk := client.recv(65536):
                answer += chunk
    finally:
        server.close()
    while answer.startswith(b"HTTP/1.1 100 "):
        answer = answer.split(b"\r\n\r\n", 1)[1]
    assert answer.startswith(b"HTTP/1.1 200"), answer[:300]
    assert len(json.loads(answer.split(b"\r\n\r\n", 1)[1])["scores"]) == 4


def test_a_client_that_leaves_stops_taking_batches(tiny_scorer, poll_flavour):
    """End to end: a client that sends 16 batches' worth and closes its connection a batch or two in is let go (its
    request leaves the queue, not scored to its end), under either poll."""
    slow = SlowScorer(tiny_scorer, 0.1)
    config = ServerConfig(port=0, max_pairs=64, max_batch_pairs=4, chunk_pairs=4, request_timeout=30.0)
    server = RewardServer(slow, config).start()
    try:
        body = _pairs(64)
        with socket.create_connection(server.httpd.server_address[:2]) as client:
            client.sendall(REQUEST_HEAD % len(body) + body)
            time.sleep(0.25)
        deadline = time.monotonic() + 30
        while server.batcher.queued and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not server.batcher.queued, "the abandoned request stayed queued"
        time.sleep(0.3)  # the batch that was running, if any
        assert slow.calls < 16, f"all {slow.calls} batches were scored for a client that left"
    finally:
        server.close()

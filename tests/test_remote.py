"""RemotePMIReward: the same rewards as PMIReward (property-based), TRL's async contract, retries and failures."""

import json
import logging
import math
import pickle
import re
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from trl.trainer.utils import is_async_callable

from pmi_reward.rewards.options import RewardOptions
from pmi_reward.rewards.path import GroupError
from pmi_reward.rewards.remote import RemotePMIReward, RemoteRewardError, request_json
from pmi_reward.rewards.reward import PMIReward

TEXT = st.one_of(
    st.text(max_size=30),
    st.sampled_from(
        ["", "  ", "\x00", "🙂🎉", "我喜欢爵士乐", "\ud800", "x" * 5000, "<think>a</think>b", "<think>a", "a</think>b"]
    ),
)
JUNK = st.one_of(st.none(), st.integers(), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))
MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "system", "tool"]), "content": st.one_of(TEXT, JUNK)}
)
PROMPT = st.one_of(TEXT, JUNK, st.lists(st.one_of(MESSAGE, JUNK), max_size=5))
COMPLETION = st.one_of(TEXT, JUNK, st.lists(st.one_of(MESSAGE, JUNK), max_size=2))
OPTIONS = st.builds(
    RewardOptions,
    center=st.sampled_from(["none", "group"]),
    scale=st.sampled_from([1.0, 0.5, -2.0]),
    clip=st.sampled_from([None, 1.0]),
    empty_score=st.sampled_from([-5.0, 0.0, None]),
    include_system=st.booleans(),
    max_context_turns=st.sampled_from([None, 1, 5]),
    strip_think=st.booleans(),
    think_opened=st.booleans(),
)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True, database=None
)
@given(samples=st.lists(st.tuples(PROMPT, COMPLETION), max_size=8), options=OPTIONS, shared_prompt=st.booleans())
def test_remote_rewards_equal_in_process_rewards(reward_server, tiny_scorer, samples, options, shared_prompt):
    prompts, completions = [p for p, _ in samples], [c for _, c in samples]
    if shared_prompt and prompts:
        prompts = [prompts[0]] * len(prompts)  # a GRPO group: centring has something to do
    try:
        local = PMIReward(tiny_scorer, options)(prompts, completions)
    except GroupError as err:  # center="group" with a lonely completion: refused on both sides, alike
        with pytest.raises(GroupError, match=re.escape(str(err))):
            RemotePMIReward(reward_server.url, options).score_sync(prompts, completions)
        return
    remote = RemotePMIReward(reward_server.url, options).score_sync(prompts, completions)
    assert len(remote) == len(completions)
    assert remote == local  # exactly: same texts, same scorer call, same shaping
    assert all(r is None or (isinstance(r, float) and math.isfinite(r)) for r in remote)


def test_requests_over_the_servers_limits_are_split(reward_server, tiny_scorer):
    """A chunk over the server's limits (here 200 pairs against its 64) got 413, which is not retried, and every
    sample came back None; it is split in halves until each part fits, and scores as in-process."""
    prompts = [f"I love jazz {i % 7}.\nWho do you like?" for i in range(200)]
    completions = [f"Coltrane {i}" for i in range(200)]
    remote = RemotePMIReward(reward_server.url, batch_size=200, on_failure="raise")
    got = remote.score_sync(prompts, completions)
    assert got == pytest.approx(PMIReward(tiny_scorer)(prompts, completions), abs=1e-5)


def test_environment_proxies_are_not_used(reward_server, tiny_scorer, monkeypatch):
    """urlopen sent every request, the API key with it, to ``$http_proxy``; OpenRLHF's aiohttp client ignores the
    proxy variables, and so does ours now: with them all pointing at a closed port, requests still reach the server."""
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    proxy = f"http://127.0.0.1:{closed.getsockname()[1]}"
    closed.close()
    for name in ("http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.setenv(name, proxy)
        monkeypatch.setenv(name.upper(), proxy)
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
    assert request_json(reward_server.url + "/health", timeout=10)["status"] == "ok"
    prompts, replies = ["I love jazz."], ["Coltrane!"]
    got = RemotePMIReward(reward_server.url, on_failure="raise", retries=0).score_sync(prompts, replies)
    assert got == pytest.approx(PMIReward(tiny_scorer)(prompts, replies), abs=1e-5)


def test_trl_contract(reward_server, tiny_scorer):
    reward = PMIReward.remote(reward_server.url + "/", center="group", name="pmi_remote")
    assert isinstance(reward, RemotePMIReward) and is_async_callable(reward) and reward.__name__ == "pmi_remote"
    logged = {}
    out = reward.score_sync(["I love jazz.\nMe too!"] * 2, ["Coltrane", ""])
    assert out[1] == -5.0 and out[0] == pytest.approx(0.0)  # the only scorable sample of its group: centred to 0
    clone = pickle.loads(pickle.dumps(reward))
    assert clone.url == reward_server.url and clone.options == reward.options
    import asyncio

    got = asyncio.run(
        clone(
            prompts=["a", "a"],
            completions=["x", "y"],
            completion_ids=[[1], [2]],
            trainer_state=None,
            log_extra=lambda *a: None,
            log_metric=lambda k, v: logged.setdefault(k, v),
            extra=[1, 2],
        )
    )
    assert len(got) == 2 and logged["pmi_remote/empty_frac"] == 0.0
    assert clone.options.max_context_turns == 3  # resolved from the server: as the scorer was trained
    options = RewardOptions()
    remote = RemotePMIReward(reward_server.url, options)
    remote.score_sync(["a"], ["x"])
    assert remote.options.max_context_turns == 3 and options.max_context_turns is None  # the caller's are untouched
    with pytest.raises(ValueError, match="got 2 prompts but 1 completions"):  # a caller bug, before any request
        RemotePMIReward(reward_server.url).score_sync(["a", "b"], ["x"])


class _Flaky(BaseHTTPRequestHandler):
    """Fails the first ``failures`` /score requests with ``status`` (or sleeps ``delay``), then answers."""

    protocol_version = "HTTP/1.1"
    calls = 0
    failures, status, delay = 2, 503, 0.0

    def log_message(self, *args):
        pass

    def _reply(self, status: int, payload: dict) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        try:
            self.wfile.write(data)
        except BrokenPipeError:  # the client gave up waiting
            self.close_connection = True

    def do_GET(self):
        self._reply(200, {"scorer": {"trained_context_turns": None}})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).calls += 1
        if type(self).calls <= self.failures:
            if self.delay:
                import time

                time.sleep(self.delay)
            else:
                return self._reply(self.status, {"error": "try later", "status": self.status})
        self._reply(200, {"scores": [1.5] * len(body["pairs"])})


@pytest.fixture
def flaky():
    def start(failures: int, status: int = 503, delay: float = 0.0):
        handler = type("Handler", (_Flaky,), {"calls": 0, "failures": failures, "status": status, "delay": delay})
        server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}", handler

    servers = []
    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def test_retries_then_succeeds(flaky):
    url, handler = flaky(failures=2)
    assert RemotePMIReward(url, retries=2, backoff=0.01).score_sync(["c", "c"], ["x", "y"]) == [1.5, 1.5]
    assert handler.calls == 3


def test_gives_up_with_none_or_raises(flaky, caplog):
    url, handler = flaky(failures=5)
    with caplog.at_level(logging.WARNING):
        assert RemotePMIReward(url, retries=1, backoff=0.01).score_sync(["c", "c"], ["x", ""]) == [None, None]
    assert "returning None" in caplog.text and handler.calls == 2
    with pytest.raises(RemoteRewardError, match="HTTP 503: try later"):
        RemotePMIReward(url, retries=0, on_failure="raise").score_sync(["c"], ["x"])


def test_client_errors_are_not_retried(flaky):
    url, handler = flaky(failures=1, status=422)
    with pytest.raises(RemoteRewardError, match="HTTP 422"):
        RemotePMIReward(url, retries=3, backoff=0.01, on_failure="raise").score_sync(["c"], ["x"])
    assert handler.calls == 1


def test_timeouts_are_retried(flaky):
    url, handler = flaky(failures=1, delay=1.0)
    assert RemotePMIReward(url, timeout=0.3, retries=1, backoff=0.01).score_sync(["c"], ["x"]) == [1.5]
    assert handler.calls == 2


def test_unreachable_server():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: connections are refused
        reward = RemotePMIReward(f"http://127.0.0.1:{port}", retries=1, backoff=0.01, on_failure="raise")
        with pytest.raises(RemoteRewardError):
            reward.score_sync(["c"], ["x"])
    with pytest.raises(ValueError, match="on_failure"):
        RemotePMIReward("http://x", on_failure="ignore")


@pytest.fixture
def broken_server():
    """A server that answers ``/health`` and ``/score`` with the raw bytes given (then closes the connection)."""
    import socket

    def start(health: bytes, score: bytes) -> str:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        sockets.append(sock)

        def loop():
            while True:
                try:
                    conn, _ = sock.accept()
                except OSError:
                    return
                with conn:
                    request = conn.recv(65536)
                    conn.sendall(health if request.split(b" ")[1] == b"/health" else score)

        threading.Thread(target=loop, daemon=True).start()
        return f"http://127.0.0.1:{sock.getsockname()[1]}"

    sockets: list = []
    yield start
    for sock in sockets:
        sock.close()


def _ok(payload) -> bytes:
    data = json.dumps(payload).encode()
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(data) + data


HEALTH = _ok({"scorer": {"trained_context_turns": 3}})


@pytest.mark.parametrize(
    "health,score",
    [
        (HEALTH, b'HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{"sco'),  # the server died mid-answer
        (HEALTH, b'HTTP/1.1 503 Service Unavailable\r\nContent-Length: 100\r\n\r\n{"err'),  # and its error
        (HEALTH, b"SSH-2.0-OpenSSH_9.6\r\n"),  # not an HTTP server
        (HEALTH, _ok({"scores": ["abc"]})),
        (HEALTH, _ok({"scores": [{}]})),
        (_ok([1, 2]), _ok({"scores": [1.0]})),
        (_ok({"scorer": "tiny"}), _ok({"scores": [1.0]})),
        (_ok({"scorer": {"trained_context_turns": "3"}}), _ok({"scores": [1.0]})),
    ],
    ids=[
        "truncated",
        "truncated-error",
        "not-http",
        "string-score",
        "object-score",
        "list-health",
        "string-scorer",
        "string-turns",
    ],
)
def test_a_broken_server_is_a_remote_failure(broken_server, health, score):
    """Whatever a broken server (or something else at its address) answers, the reward returns None for every
    sample (or raises RemoteRewardError with on_failure="raise"), never another exception that would end a run."""
    url = broken_server(health, score)
    assert RemotePMIReward(url, retries=1, backoff=0.01, timeout=5).score_sync(["c"], ["x"]) == [None]
    with pytest.raises(RemoteRewardError):
        RemotePMIReward(url, retries=0, timeout=5, on_failure="raise").score_sync(["c"], ["x"])

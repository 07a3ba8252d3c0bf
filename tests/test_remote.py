"""RemotePMIReward: the same rewards as PMIReward (property-based), TRL's async contract, retries and failures."""

import asyncio
import email.utils
import json
import logging
import math
import pickle
import re
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from conftest import http
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from trl.trainer.utils import is_async_callable

from pmi_reward.rewards.options import RewardOptions
from pmi_reward.rewards.path import GroupError
from pmi_reward.rewards.remote import API_KEY_ENV, RemotePMIReward, RemoteRewardError, request_json
from pmi_reward.rewards.reward import PMIReward

TEXT = st.one_of(
    st.text(max_size=30),
    st.sampled_from(
        ["", "  ", "\x00", "🙂🎉", "我喜欢爵士乐", "\ud800", "x" * 5000, "<think>a</think>b", "<think>a", "a</think>b"]
    ),
    # plain sentences: batches with several scorable pairs of different scores, so that a reward given to the wrong
    # sample shows (random text is mostly unreadable)
    st.sampled_from(
        ["I love jazz.", "Who do you like?", "Coltrane!", "What did you cook tonight?", "Pasta with basil."]
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


def _nones_and_values(rewards: list[float | None]) -> tuple[list[bool], list[float]]:
    """Where the rewards are None, and the rewards with 0.0 there (for ``pytest.approx``)."""
    return [r is None for r in rewards], [0.0 if r is None else r for r in rewards]


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True, database=None
)
@given(samples=st.lists(st.tuples(PROMPT, COMPLETION), max_size=8), options=OPTIONS, shared_prompt=st.booleans())
def test_remote_rewards_equal_in_process_rewards(spread_server, spread_scorer, samples, options, shared_prompt):
    """On a scorer whose scores spread (``tiny_scorer`` gives nearly every pair the 20.0 cap, so that rewards swapped
    between samples went unseen): None in the same places, the same values up to float32 noise (the server batches
    pairs its own way, and padding moves the last bits)."""
    prompts, completions = [p for p, _ in samples], [c for _, c in samples]
    if shared_prompt and prompts:
        prompts = [prompts[0]] * len(prompts)  # a GRPO group: centring has something to do
    try:
        local = PMIReward(spread_scorer, options)(prompts, completions)
    except GroupError as err:  # center="group" with a lonely completion: refused on both sides, alike
        with pytest.raises(GroupError, match=re.escape(str(err))):
            RemotePMIReward(spread_server.url, options).score_sync(prompts, completions)
        return
    remote = RemotePMIReward(spread_server.url, options).score_sync(prompts, completions)
    assert len(remote) == len(completions)
    (remote_nones, remote_values), (local_nones, local_values) = _nones_and_values(remote), _nones_and_values(local)
    assert remote_nones == local_nones  # same texts, same scorer call, same shaping
    assert remote_values == pytest.approx(local_values, abs=1e-5)
    assert all(r is None or (isinstance(r, float) and math.isfinite(r)) for r in remote)


@pytest.mark.parametrize(
    "options", [RewardOptions(), RewardOptions(max_context_turns=5), RewardOptions(strip_think=False)]
)
def test_remote_rewards_read_by_the_client_only(spread_server, spread_scorer, options):
    """The server's ``/score`` reads a pair as the reward path does (turns cut, think blocks dropped); the client
    has read its texts already, with its own options, so it asks for them to be scored as given: read twice, a user's
    literal ``<think>``, a client keeping more turns than the server, or one keeping think blocks scored otherwise."""
    long = "\n".join(f"turn {i} about cycling and trains" for i in range(8))
    prompts = [long, [{"role": "user", "content": "What is the <think> tag for?"}], "I love jazz."]
    completions = ["I cycle to work now.", "It marks reasoning.", "<think>hmm</think>Coltrane!"]
    remote = RemotePMIReward(spread_server.url, options, on_failure="raise").score_sync(prompts, completions)
    assert remote == pytest.approx(PMIReward(spread_scorer, options)(prompts, completions), abs=1e-5)


@pytest.mark.parametrize(
    "options",
    [
        RewardOptions(batch_size=200),
        RewardOptions(batch_size=7, center="group", scale=-0.5, clip=1.0),
        RewardOptions(batch_size=64, empty_score=None, center="group"),
    ],
    ids=["one-chunk", "chunks-of-7-centred", "chunks-of-64-none"],
)
def test_remote_rewards_keep_each_samples_score(spread_server, spread_scorer, options):
    """200 samples in chunks sent concurrently (and split on the server's 64-pair limit): each sample gets its own
    score back, on a scorer whose scores are spread enough to tell a swap."""
    prompts = [f"I love jazz {i % 7}. {'la ' * (i % 13)}\nWho do you like?" for i in range(200)]
    completions = [f"Coltrane {i} {'bop ' * (i % 11)}" if i % 17 else "" for i in range(200)]
    local = PMIReward(spread_scorer, options)(prompts, completions)
    assert len({round(r, 3) for r in local if r is not None}) >= 50  # spread: a swap shows
    remote = RemotePMIReward(spread_server.url, options, on_failure="raise").score_sync(prompts, completions)
    (remote_nones, remote_values), (local_nones, local_values) = _nones_and_values(remote), _nones_and_values(local)
    assert remote_nones == local_nones
    assert remote_values == pytest.approx(local_values, abs=1e-5)


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


class _Handler(BaseHTTPRequestHandler):
    """A quiet test server's handler that answers JSON (``GET /health`` as a server of a 3-turn scorer would)."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_GET(self):
        self._reply(200, {"scorer": {"trained_context_turns": 3}, "reward_options": {"max_chars": 100_000}})

    def _reply(self, status: int, payload: dict, headers: dict | None = None) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        try:
            self.wfile.write(data)
        except BrokenPipeError:  # the client gave up waiting
            self.close_connection = True


class _Flaky(_Handler):
    """Fails the first ``failures`` /score requests with ``status`` (or sleeps ``delay``), then answers; failures
    carry ``Retry-After: retry_after`` when it is set."""

    calls = 0
    failures, status, delay, retry_after = 2, 503, 0.0, None

    def do_GET(self):
        self._reply(200, {"scorer": {"trained_context_turns": None}})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).calls += 1
        if type(self).calls <= self.failures:
            if self.delay:
                time.sleep(self.delay)
            else:
                headers = {"Retry-After": self.retry_after} if self.retry_after is not None else None
                return self._reply(self.status, {"error": "try later", "status": self.status}, headers)
        self._reply(200, {"scores": [1.5] * len(body["pairs"])})


@pytest.fixture
def serve():
    """Starts a threading HTTP server on a loopback port with the handler class given; returns its URL."""

    def start(handler: type) -> str:
        server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"

    servers: list = []
    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


@pytest.fixture
def flaky(serve):
    def start(failures: int, status: int = 503, delay: float = 0.0, retry_after: str | None = None):
        attributes = {"calls": 0, "failures": failures, "status": status, "delay": delay, "retry_after": retry_after}
        handler = type("Handler", (_Flaky,), attributes)
        return serve(handler), handler

    return start


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


def test_remote_failures_averages_to_the_share_of_calls_that_failed(flaky):
    """``<name>/remote_failures`` was logged only by a failed call, so a trainer's mean of it (TRL: the sum over the
    values logged) read 1.0 whenever any call failed; each answered call now logs 0.0."""
    url, _ = flaky(failures=1)
    reward = RemotePMIReward(url, retries=0, name="pmi")
    logged: dict[str, list[float]] = {}

    async def calls() -> None:
        for _ in range(4):
            await reward(["c"], ["x"], log_metric=lambda k, v: logged.setdefault(k, []).append(v))

    asyncio.run(calls())
    assert logged["pmi/remote_failures"] == [1.0, 0.0, 0.0, 0.0]


def test_client_errors_are_not_retried(flaky):
    url, handler = flaky(failures=1, status=422)
    with pytest.raises(RemoteRewardError, match="HTTP 422"):
        RemotePMIReward(url, retries=3, backoff=0.01, on_failure="raise").score_sync(["c"], ["x"])
    assert handler.calls == 1


def test_timeouts_are_retried(flaky):
    url, handler = flaky(failures=1, delay=1.0)
    assert RemotePMIReward(url, timeout=0.3, retries=1, backoff=0.01).score_sync(["c"], ["x"]) == [1.5]
    assert handler.calls == 2


def test_retry_after_is_honoured(flaky, monkeypatch):
    """A 429/503's Retry-After was ignored: the retries came after the backoff alone (here 0.01 s), while the server
    had said when to come back. The wait is the longer of the two, a server's ask capped at 30 s."""
    waits: list[float] = []
    real_sleep = asyncio.sleep

    async def sleep(seconds, *args, **kwargs):  # record the waits, do not wait them
        waits.append(seconds)
        await real_sleep(0)

    monkeypatch.setattr(asyncio, "sleep", sleep)
    url, handler = flaky(failures=2, status=429, retry_after="7")
    assert RemotePMIReward(url, retries=2, backoff=0.01).score_sync(["c"], ["x"]) == [1.5]
    assert waits == [7.0, 7.0] and handler.calls == 3
    waits.clear()
    url, _ = flaky(failures=1, retry_after="86400")  # a day: capped
    assert RemotePMIReward(url, retries=1, backoff=0.01).score_sync(["c"], ["x"]) == [1.5]
    assert waits == [30.0]
    waits.clear()
    url, _ = flaky(failures=1, retry_after=email.utils.formatdate(time.time() + 20, usegmt=True))  # an HTTP date
    assert RemotePMIReward(url, retries=1, backoff=0.01).score_sync(["c"], ["x"]) == [1.5]
    assert len(waits) == 1 and 10 < waits[0] <= 20
    waits.clear()
    url, _ = flaky(failures=1, retry_after="1")  # a longer backoff stays
    assert RemotePMIReward(url, retries=1, backoff=2.0).score_sync(["c"], ["x"]) == [1.5]
    assert waits == [2.0]
    url, _ = flaky(failures=1, retry_after="7")
    with pytest.raises(RemoteRewardError) as info:
        RemotePMIReward(url, retries=0, on_failure="raise").score_sync(["c"], ["x"])
    assert info.value.status == 503 and info.value.retry_after == 7.0


def test_timeout_bounds_the_whole_answer(serve):
    """``timeout`` was per socket operation: a server trickling its answer a byte at a time (here for 20 s or more)
    was never cut off. Each try now gets ``timeout`` seconds in all, and running out is retried like a timeout."""
    stop = threading.Event()

    class Trickle(_Handler):
        calls = 0

        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            type(self).calls += 1
            data = json.dumps({"scores": [1.5]}).encode() + b" " * 400
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Connection", "close")
            self.end_headers()
            for byte in data:  # 0.05 s a byte, until the test is done
                if stop.wait(0.05):
                    break
                self.wfile.write(bytes([byte]))

    url = serve(Trickle)
    reward = RemotePMIReward(url, timeout=1.0, retries=1, backoff=0.01, max_context_turns=3, on_failure="raise")

    async def call():
        try:
            return await reward(["c"], ["x"])
        finally:
            stop.set()  # the abandoned tries' threads end as the server stops

    with pytest.raises(RemoteRewardError, match="no complete answer within 1.0 s") as info:
        asyncio.run(call())
    assert info.value.status is None and Trickle.calls == 2  # retried


class _Trickle(_Handler):
    """Answers every request 200 with a body it sends a byte every 0.05 s (20 s in all), until ``stop`` is set."""

    stop = threading.Event()

    def _trickle(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        data = json.dumps({"scores": [1.5]}).encode() + b" " * 400
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Connection", "close")
        self.end_headers()
        for byte in data:
            if self.stop.wait(0.05):
                break
            self.wfile.write(bytes([byte]))

    do_GET = do_POST = _trickle


def test_score_sync_gives_up_within_the_timeout(serve):
    """verl's path (``score_sync``: ``asyncio.run``) against a server trickling its answer: the try was given up on
    after ``timeout``, but its thread ran in asyncio's default executor, which ``asyncio.run`` waits for, so the call
    raised only when the answer ended (20 s here). It now raises after about ``timeout``."""
    handler = type("Handler", (_Trickle,), {"stop": threading.Event()})
    url = serve(handler)
    reward = RemotePMIReward(url, timeout=1.0, retries=0, max_context_turns=3, on_failure="raise")
    t0 = time.monotonic()
    try:
        with pytest.raises(RemoteRewardError, match="no complete answer within 1.0 s"):
            reward.score_sync(["c"], ["x"])
        elapsed = time.monotonic() - t0
    finally:
        handler.stop.set()
    assert elapsed < 3.0


def test_a_try_given_up_on_frees_its_request_slot(serve, monkeypatch):
    """Request slots are per event loop and a try holds one only while it runs: with one slot, the retry after a try
    given up on (its thread still being trickled an answer) is sent at once, and its wait is not the try's time."""
    import pmi_reward.rewards.remote as remote

    monkeypatch.setattr(remote, "MAX_REQUESTS", 1)
    handler = type("Handler", (_Trickle,), {"stop": threading.Event(), "calls": 0})
    original = handler._trickle

    def counted(self):
        type(self).calls += 1
        original(self)

    handler.do_GET = handler.do_POST = counted
    reward = RemotePMIReward(
        serve(handler), timeout=1.0, retries=2, backoff=0.01, max_context_turns=3, on_failure="raise"
    )
    t0 = time.monotonic()
    try:
        with pytest.raises(RemoteRewardError, match="no complete answer within 1.0 s"):
            asyncio.run(reward(["c"], ["x"]))
        elapsed = time.monotonic() - t0
    finally:
        handler.stop.set()
    assert handler.calls == 3 and elapsed < 5.0


def test_request_json_reads_an_answer_within_its_timeout(serve):
    """The socket timeout bounds each read, not the answer: a server trickling its answer held the request's thread,
    socket and a server slot for as long as it kept sending (20 s here); the answer is read within ``timeout``."""
    from pmi_reward.rewards.remote import request_json

    handler = type("Handler", (_Trickle,), {"stop": threading.Event()})
    url = serve(handler)
    t0 = time.monotonic()
    try:
        with pytest.raises(RemoteRewardError, match="longer than the timeout"):
            request_json(url + "/score", {"pairs": []}, timeout=1.0)
        elapsed = time.monotonic() - t0
    finally:
        handler.stop.set()
    assert elapsed < 3.0


def test_finished_event_loops_do_not_stay_in_the_request_slots(monkeypatch):
    """A semaphore that made a caller wait holds its loop, so the weak key never let a finished asyncio.run's loop
    go: verl's sync calls (one loop each) left one entry per call."""
    import pmi_reward.rewards.remote as remote

    monkeypatch.setattr(remote, "MAX_REQUESTS", 1)
    monkeypatch.setattr(remote, "_LOOP_SLOTS", type(remote._LOOP_SLOTS)())

    async def contended():
        slots = remote._request_slots()

        async def hold():
            async with slots:
                await asyncio.sleep(0.01)

        await asyncio.gather(hold(), hold())  # the second waits: the semaphore takes hold of the loop

    for _ in range(3):
        asyncio.run(contended())

    async def entries():
        remote._request_slots()
        return len(remote._LOOP_SLOTS)

    assert asyncio.run(entries()) == 1


def test_request_slots_are_safe_from_many_threads(monkeypatch):
    """verl's reward loop calls from many threads, each in its own event loop: one thread pruning the loops' slots
    while another added its own raised 'dictionary changed size during iteration' out of the reward call."""
    import sys

    import pmi_reward.rewards.remote as remote

    class Open:
        """A loop still running elsewhere: kept by the prune, it makes each pass over the slots longer."""

        def is_closed(self) -> bool:
            return False

    others = [Open() for _ in range(1000)]
    monkeypatch.setattr(remote, "_LOOP_SLOTS", type(remote._LOOP_SLOTS)(dict.fromkeys(others)))
    errors: list[str] = []

    async def one() -> None:
        async with remote._request_slots():
            await asyncio.sleep(0)

    def work() -> None:
        for _ in range(100):
            try:
                asyncio.run(one())
            except Exception as err:  # noqa: BLE001 - counted, the assertion names them
                errors.append(f"{type(err).__name__}: {err}")

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # thread switches between almost every bytecode: the race shows within the test
    try:
        threads = [threading.Thread(target=work) for _ in range(16)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(interval)
    assert not errors, errors[:3]


def test_a_request_given_up_on_does_not_hold_the_process_at_exit(serve):
    """Nor does the thread of a try given up on keep the interpreter from exiting (it would join a
    ``concurrent.futures`` thread at exit): a script that calls ``score_sync`` exits as soon as the call raises."""
    import subprocess
    import sys

    handler = type("Handler", (_Trickle,), {"stop": threading.Event()})
    url = serve(handler)
    script = (
        "import time\n"
        "from pmi_reward.rewards.remote import RemotePMIReward, RemoteRewardError\n"
        f"reward = RemotePMIReward({url!r}, timeout=1.0, retries=0, max_context_turns=3, on_failure='raise')\n"
        "try:\n"
        "    reward.score_sync(['c'], ['x'])\n"
        "except RemoteRewardError:\n"
        "    print(time.monotonic(), flush=True)\n"
    )
    try:
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
        exited = time.monotonic()  # the same clock as the script's (CLOCK_MONOTONIC is system-wide)
    finally:
        handler.stop.set()
    assert done.returncode == 0, done.stderr
    assert exited - float(done.stdout.strip()) < 5.0


@pytest.mark.parametrize("code", [302, 307])
def test_redirects_are_not_followed(serve, code):
    """urllib followed a redirect to any host, the bearer key with it (and a 302's POST became a GET); a 3xx is now
    a failure naming the status, not retried, and the other host sees nothing."""
    seen = []

    class Elsewhere(_Handler):
        def do_GET(self):
            seen.append((self.path, self.headers.get("Authorization")))
            self._reply(200, {"scorer": {"trained_context_turns": 3}, "scores": [1.5]})

        do_POST = do_GET

    elsewhere = serve(Elsewhere)

    class Redirect(_Handler):
        calls = 0

        def do_GET(self):
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            type(self).calls += 1
            self._reply(code, {}, {"Location": elsewhere + self.path})

        do_POST = do_GET

    url = serve(Redirect)
    for turns in (None, 3):  # GET /health comes first either way
        options = {"api_key": "s3cret", "retries": 3, "backoff": 0.01, "max_context_turns": turns}
        with pytest.raises(RemoteRewardError, match=f"HTTP {code}: redirect") as info:
            RemotePMIReward(url, on_failure="raise", **options).score_sync(["c"], ["x"])
        assert info.value.status == code and not info.value.retryable
        assert RemotePMIReward(url, **options).score_sync(["c"], ["x"]) == [None]
    with pytest.raises(RemoteRewardError, match=f"HTTP {code}: redirect"):  # and a POST /score
        request_json(url + "/score", {"pairs": [{"context": "c", "response": "x"}]}, api_key="s3cret")
    assert seen == [] and Redirect.calls == 5


def test_an_api_key_over_plain_http_beyond_loopback_is_warned_about(caplog, monkeypatch):
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    warned = ["http://203.0.113.7:8000", "HTTP://rm-host:8000/score", "http://[2001:db8::1]:8000"]
    quiet = [
        "http://127.0.0.1:8000",
        "http://127.3.4.5",
        "http://localhost:8000",
        "http://[::1]:8000",
        "https://rm-host",
    ]
    for url in warned + quiet:
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="pmi_reward.rewards.remote"):
            RemotePMIReward(url, api_key="s3cret")
        messages = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(messages) == (url in warned), url
        assert all("plain http" in m and "s3cret" not in m for m in messages)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="pmi_reward.rewards.remote"):
        RemotePMIReward("http://rm-host:8000")  # no key: nothing to leak
        assert not caplog.records
        monkeypatch.setenv(API_KEY_ENV, "s3cret")
        RemotePMIReward("http://rm-host:8000")
        assert len(caplog.records) == 1


def test_a_pair_too_large_alone_is_unscorable_not_the_call(spread_server, spread_scorer, caplog):
    """One pair over the server's body limit (270 kB of CJK against 256 KiB) was refused with 413 even alone, which
    raised, and the whole call came back None; now only that sample is unscorable (``empty_score``)."""
    prompts = ["I love jazz.", "What did you cook?", "我喜欢爵士乐" * 15_000]
    completions = ["Coltrane", "Pasta", "ok"]
    local = PMIReward(spread_scorer)(prompts[:2], completions[:2])
    for empty_score in (-5.0, None):
        reward = RemotePMIReward(spread_server.url, on_failure="raise", empty_score=empty_score)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="pmi_reward.rewards.remote"):
            got = reward.score_sync(prompts, completions)
        assert got[:2] == pytest.approx(local, abs=1e-5) and got[2] == empty_score
        assert "HTTP 413" in caplog.text and "unscorable" in caplog.text


def test_a_server_cutting_texts_shorter_than_max_chars_is_refused(spread_scorer):
    """A server started with a smaller ``--max_chars`` cuts ``/score`` pairs to it too, so a RemotePMIReward with the
    default max_chars got other rewards than PMIReward under the same options. Its ``/health`` reports the limit, and
    the reward refuses the mismatch at its first call (a ValueError, whether or not it learns its turns there)."""
    from pmi_reward.serving.server import RewardServer, ServerConfig

    prompts = ["I love jazz and I play the saxophone every evening.\nWho do you like?"]
    completions = ["Coltrane, and also Miles Davis, and Charlie Parker of course."]
    server = RewardServer(spread_scorer, ServerConfig(port=0), RewardOptions(max_chars=20)).start()
    try:
        assert http(server.url, "GET", "/health")[1]["reward_options"]["max_chars"] == 20
        for turns in (None, 3):
            reward = RemotePMIReward(server.url, max_context_turns=turns)  # on_failure="none": a setting still raises
            with pytest.raises(ValueError, match="--max_chars 20, below this reward's max_chars 100000"):
                reward.score_sync(prompts, completions)
        for max_chars in (20, 12):
            got = RemotePMIReward(server.url, max_chars=max_chars, on_failure="raise").score_sync(prompts, completions)
            assert got == pytest.approx(PMIReward(spread_scorer, max_chars=max_chars)(prompts, completions), abs=1e-5)
    finally:
        server.close()


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
    data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(data) + data


HEALTH = _ok({"scorer": {"trained_context_turns": 3}})
NESTED = b"[" * 100_000 + b"]" * 100_000  # deeper than json's recursion limit: RecursionError, which escaped


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
        (HEALTH, _ok(b'{"scores": ' + NESTED + b"}")),
        (_ok(NESTED), _ok({"scores": [1.0]})),
        (HEALTH, b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: %d\r\n\r\n" % len(NESTED) + NESTED),
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
        "nested-scores",
        "nested-health",
        "nested-error",
    ],
)
def test_a_broken_server_is_a_remote_failure(broken_server, health, score):
    """Whatever a broken server (or something else at its address) answers, the reward returns None for every
    sample (or raises RemoteRewardError with on_failure="raise"), never another exception that would end a run."""
    url = broken_server(health, score)
    assert RemotePMIReward(url, retries=1, backoff=0.01, timeout=5).score_sync(["c"], ["x"]) == [None]
    with pytest.raises(RemoteRewardError):
        RemotePMIReward(url, retries=0, timeout=5, on_failure="raise").score_sync(["c"], ["x"])


def test_an_endpoint_without_health_scores_when_the_turns_are_given_and_a_numeric_key_is_text():
    """A gateway exposing POST /score alone answers 404 on /health: with ``max_context_turns`` given the client
    never needed /health, and scores (only turns that must be learnt need it; then the 404 is a failure). A key
    of digits, as YAML/Hydra read it (an int), is the same key as text."""
    seen: list[str | None] = []

    class ScoreOnly(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:
            pass

        def _reply(self, code: int, obj: dict) -> None:
            data = json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            self._reply(404, {"error": "not found"})

        def do_POST(self) -> None:
            seen.append(self.headers.get("Authorization"))
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            self._reply(200, {"scores": [1.5] * len(body["pairs"])})

    server = ThreadingHTTPServer(("127.0.0.1", 0), ScoreOnly)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        reward = RemotePMIReward(url, max_context_turns=3, api_key=123456, on_failure="raise")
        assert reward.score_sync(["I love jazz."], ["Me too!"]) == [1.5]
        assert seen == ["Bearer 123456"]
        with pytest.raises(RemoteRewardError):
            RemotePMIReward(url, on_failure="raise", retries=1, backoff=0.01).score_sync(["I love jazz."], ["Hi."])
    finally:
        server.shutdown()

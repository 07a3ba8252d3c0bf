"""Hostile clients against the reward server (issue 11): pathological chat templates, maximal requests beside small
ones, floods of idle sockets, slow senders, garbled and smuggling-prone request lines, cross-origin content types,
missing keys, and the SIGTERM drain.

No assertion is on a tight wall time (the machine is shared): each test checks an order of events or a count instead
(the small request is answered while the large one is still being scored, the scorer was called in bounded batches,
...); a bound on seconds, where there is one, is several times what it measures.
The timings, measured once with the MiniLM scorer (benchmarks/health_latency.py), are in docs/serving.md."""

import contextlib
import json
import logging
import os
import socket
import threading
import time
from types import SimpleNamespace

import pytest
from conftest import http, raw_http
from hypothesis import given, settings
from hypothesis import strategies as st
from test_server import SlowScorer

import pmi_reward.serving.handler as handler
from pmi_reward.rewards.options import RewardOptions
from pmi_reward.rewards.reward import PMIReward
from pmi_reward.serving.handler import json_values
from pmi_reward.serving.server import RewardServer, ServerConfig

KEY = "s3cret-key-for-tests"
# small limits, so that a maximal request is quick to build
LIMITS = dict(port=0, max_pairs=64, max_body_bytes=4 * 2**20, max_request_chars=1_000_000, request_timeout=30.0)


@contextlib.contextmanager
def serving(scorer, options=None, **config):
    server = RewardServer(scorer, ServerConfig(**{**LIMITS, **config}), options).start()
    try:
        yield server
    finally:
        server.close()


def timed(fn, *args, **kwargs):
    start = time.perf_counter()
    result = fn(*args, **kwargs)
    return result, time.perf_counter() - start


def pairs(n: int, chars: int = 20) -> dict:
    return {"pairs": [{"context": f"context {i} " + "x" * chars, "response": f"reply {i}"} for i in range(n)]}


def in_thread(fn, *args) -> tuple[threading.Thread, list]:
    out: list = []
    thread = threading.Thread(target=lambda: out.append(timed(fn, *args)), daemon=True)
    thread.start()
    return thread, out


# -- 1. bounded work per request ------------------------------------------------------------------------------
def test_a_pathological_template_query_is_answered_and_parsed_after_the_cut(tiny_scorer, monkeypatch):
    """``"[INST]" * 32000`` (192 kB) froze every endpoint for 58 s; now it is answered (no reply in it: empty_score),
    and what is parsed is cut first: at most the last 4 x max_chars characters of a query, whole lines."""
    import pmi_reward.data.conversation as conversation

    parsed: list[int] = []
    real = conversation._parse_chat  # what split_query and parse_chat both call

    def recording(text, partial=False):
        parsed.append(len(text))
        return real(text, partial)

    monkeypatch.setattr(conversation, "_parse_chat", recording)
    with serving(tiny_scorer, RewardOptions(max_chars=1000)) as server:
        queries = ["[INST]" * 32000, "[INST]\n" * 32000 + "hi [/INST] Hello!"]
        status, answer = http(server.url, "POST", "/get_reward", {"query": queries})
        assert status == 200 and answer["rewards"][0] == -5.0 and answer["rewards"][1] > -5.0
        assert parsed and max(parsed) < 4000  # the query's last 4 x max_chars characters, not its 192000+


def test_a_rerank_context_is_read_once_not_once_per_candidate(tiny_scorer, monkeypatch):
    """/rerank's one context was read (made plain, cut into turns) once per candidate: 20000 messages and 4096
    candidates, a 700 kB body within every limit, held the interpreter for 5 minutes. It is read once."""
    import pmi_reward.rewards.path as path

    read, made_plain = [], []
    real_read, real_plain = path.prompt_to_context, path.plain

    def reading(prompt, *args, **kwargs):
        read.append(prompt)
        return real_read(prompt, *args, **kwargs)

    def making_plain(value, depth=0):
        if depth == 0 and isinstance(value, list):
            made_plain.append(value)
        return real_plain(value, depth)

    monkeypatch.setattr(path, "prompt_to_context", reading)
    monkeypatch.setattr(path, "plain", making_plain)
    context = [{"role": "user" if i % 2 else "assistant", "content": f"turn {i}"} for i in range(2000)]
    candidates = [f"reply {i}" for i in range(64)]
    with serving(tiny_scorer) as server:
        status, answer = http(server.url, "POST", "/rerank", {"context": context, "candidates": candidates})
    assert status == 200 and len(read) == 1 and len(made_plain) == 1
    copies = [[dict(m) for m in context] for _ in candidates]  # distinct objects: each read on its own
    assert answer["scores"] == pytest.approx(PMIReward(tiny_scorer, empty_score=None)(copies, candidates))


def test_total_characters_per_request_are_bounded_413(tiny_scorer):
    """160 replies x 100k characters held the scorer for 30 s; a request over ``max_request_chars`` is refused."""
    with serving(tiny_scorer) as server:
        body = {"pairs": [{"context": "c", "response": "r" * 20_000}] * 60}  # 1.2M characters, 60 pairs
        status, answer = http(server.url, "POST", "/score", body)
        assert status == 413 and "characters of text" in answer["error"] and "1000000" in answer["error"]


def test_a_body_over_the_byte_limit_gets_its_413_and_the_client_splits_it(tiny_scorer):
    """A body over ``max_body_bytes`` was refused unread and its socket closed: a client that sends its whole body
    before it reads (http.client, RemotePMIReward) saw a broken pipe instead of the 413, resent the same body and
    gave every sample None. Now the server reads and drops the body after answering; the client splits it."""
    from pmi_reward.rewards.remote import RemotePMIReward

    prompts = [f"I love jazz {i}. " * 5000 for i in range(50)]  # 4 MB of JSON against a 1 MiB limit
    completions = [f"Coltrane {i}" for i in range(50)]
    with serving(tiny_scorer, max_body_bytes=2**20, max_request_chars=50_000_000) as server:
        body = {"pairs": [{"context": c, "response": r} for c, r in zip(prompts, completions, strict=True)]}
        status, answer = http(server.url, "POST", "/score", body)
        assert status == 413 and "exceeds the limit of 1048576 bytes" in answer["error"]
        remote = RemotePMIReward(server.url, batch_size=50, retries=0, on_failure="raise")
        assert None not in remote.score_sync(prompts, completions)


def test_a_1_pair_request_during_a_maximal_one_is_answered_before_it(tiny_scorer):
    """Fair queueing: a 64-pair request is scored in 16 batches of 4 pairs; a 1-pair request sent during it is
    taken into the next batch and answered while the large one is still being scored."""
    slow = SlowScorer(tiny_scorer, 0.1)
    with serving(slow, max_batch_pairs=4, chunk_pairs=4) as server:
        big, big_out = in_thread(http, server.url, "POST", "/score", pairs(64))
        deadline = time.monotonic() + 30
        while slow.calls < 2 and time.monotonic() < deadline:  # the large request is being scored
            time.sleep(0.01)
        assert slow.calls >= 2, "the large request was not taken into batches"
        status, answer = http(server.url, "POST", "/score", pairs(1))
        assert status == 200 and len(answer["scores"]) == 1
        assert big.is_alive() and slow.calls < 16  # answered before the large request's last batch
        big.join(60)
        (status, answer), _ = big_out[0]
        assert status == 200 and len(answer["scores"]) == 64 and slow.calls == 17
        expected = tiny_scorer.score(
            [p["context"] for p in pairs(64)["pairs"]], [p["response"] for p in pairs(64)["pairs"]]
        )
        assert answer["scores"] == pytest.approx(expected.tolist(), abs=1e-4)  # chunks keep their scores


class SizedScorer(SlowScorer):
    """A SlowScorer that records the characters (contexts and responses) of each batch it is given."""

    def __init__(self, scorer, delay: float) -> None:
        super().__init__(scorer, delay)
        self.batch_chars: list[int] = []

    def score(self, contexts, responses, progress=False):
        self.batch_chars.append(sum(map(len, contexts)) + sum(map(len, responses)))
        return super().score(contexts, responses, progress)


def test_health_answers_while_a_maximal_request_is_scored(tiny_scorer):
    """A maximal request (64 pairs, 1M characters) is scored in batches bounded in characters (the pair bounds allow
    all 64 pairs in one batch: only the character bound splits it); /health answers meanwhile, five times, each while
    the request is still being scored. Its texts are distinct and have no spaces, so that the encoder reads each whole
    and once (the batcher counts a text read through a window, or given twice in a batch, as the encoder reads it)."""
    slow, max_chars = SizedScorer(tiny_scorer, 0.05), 128 * 1024
    with serving(slow, max_batch_pairs=64, chunk_pairs=64, max_batch_chars=max_chars) as server:
        pairs = [{"context": f"{i:02d}" + "h" * 7798, "response": f"{i:02d}" + "y" * 7798} for i in range(64)]
        body = {"pairs": pairs}  # 998k characters
        big, big_out = in_thread(http, server.url, "POST", "/score", body)
        time.sleep(0.2)
        for _ in range(5):
            status, health = http(server.url, "GET", "/health")
            assert status == 200 and health["inflight"] >= 1
        probed_in_flight = big.is_alive()
        big.join(60)
        assert big_out[0][0][0] == 200
        # 998k characters in batches of at most 128k: 8 pairs of 15.6k characters each
        assert sum(slow.batch_chars) == 64 * 15_600 and max(slow.batch_chars) <= max_chars
        assert slow.batch_chars == [8 * 15_600] * 8
        assert probed_in_flight, "the maximal request ended before the probes; make it larger"


def marks(value) -> int:
    """Brackets, braces, commas and colons of ``value`` written as JSON (outside its strings)."""
    if isinstance(value, dict):
        return 1 + max(len(value) - 1, 0) + len(value) + sum(marks(v) for v in value.values())
    if isinstance(value, list):
        return 1 + max(len(value) - 1, 0) + sum(marks(v) for v in value)
    return 0


TRICKY = st.text(alphabet=st.sampled_from(',:[{}]"\\ \n\u00e9\u200b\U0001f600ab'), max_size=12)
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | TRICKY,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(TRICKY, inner, max_size=5),
    max_leaves=40,
)


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(JSON_VALUES, st.integers(1, 60), st.booleans(), st.sampled_from([None, 1]))
def test_json_values_refuses_exactly_the_bodies_with_too_many_values(value, limit, ascii_only, indent):
    """A body is over the limit exactly when it has ``limit`` or more marks outside its strings, whatever its strings
    hold (commas, colons, brackets, escaped quotes and backslashes, non-ASCII, written escaped or not)."""
    text = json.dumps(value, ensure_ascii=ascii_only, indent=indent)
    assert (json_values(text, limit) > limit) == (marks(value) >= limit)


def test_a_body_of_too_many_json_values_is_refused_before_it_is_parsed(tiny_scorer, monkeypatch):
    """16 MiB of ``[0,0,...]`` held the interpreter lock for seconds in ``json.loads`` (every request and /health
    waited); too many values are refused 413 without parsing, while texts full of JSON punctuation are not
    mistaken for values."""
    parsed: list[int] = []

    def loads(text, **kwargs):
        parsed.append(len(text))
        return json.loads(text, **kwargs)

    monkeypatch.setattr(
        handler, "json", SimpleNamespace(dumps=json.dumps, detect_encoding=json.detect_encoding, loads=loads)
    )
    with serving(tiny_scorer, max_json_values=1000) as server:
        status, answer = http(server.url, "POST", "/score", b'{"pairs": [' + b"0," * 500_000 + b"0]}")
        assert status == 413 and "1000 JSON values" in answer["error"] and not parsed
        text = ',:[{"\\' * 300  # 1800 characters of JSON punctuation, quotes and backslashes
        body = {"pairs": [{"context": f"{i} {text}", "response": f"{text} {i}"} for i in range(8)]}
        status, answer = http(server.url, "POST", "/score", body)
        assert status == 200 and len(answer["scores"]) == 8 and len(parsed) == 1
        unterminated = b'{"pairs": ["' + b'\\",' * 2000  # scanned as far as its broken string, then refused
        assert http(server.url, "POST", "/score", unterminated)[0] == 400


def _leave_after(server, seconds: float) -> None:
    """A client that sends a 64-pair request and closes its connection after ``seconds`` (gave up on its own)."""
    body = json.dumps(pairs(64)).encode()
    head = b"POST /score HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as client:
        client.sendall(head % len(body) + body)
        time.sleep(seconds)


@pytest.mark.parametrize("how", ["times out", "client leaves"])
def test_an_abandoned_request_is_not_scored_to_its_end(tiny_scorer, how):
    """A request that times out (503), or whose client closed its connection (gave up: its own timeout, and perhaps
    a resend of the same work), stops taking batches: the scorer is free for the others at once, not scoring it
    for nobody."""
    slow = SlowScorer(tiny_scorer, 0.1)
    timeout = 0.3 if how == "times out" else 30.0
    with serving(slow, max_batch_pairs=4, chunk_pairs=4, request_timeout=timeout) as server:
        if how == "times out":
            assert http(server.url, "POST", "/score", pairs(64))[0] == 503
        else:
            _leave_after(server, 0.25)  # a batch or two in
        deadline = time.monotonic() + 30
        while server.batcher.queued and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not server.batcher.queued, "the abandoned request stayed queued"
        time.sleep(0.3)  # the batch that was running, if any
        calls = slow.calls
        assert http(server.url, "POST", "/score", pairs(1))[0] == 200
        assert calls < 16 and slow.calls == calls + 1  # not all 16 batches; nothing of it after the next request


def test_a_connection_on_a_descriptor_past_1023_is_not_taken_for_gone(tiny_scorer):
    """select.select refuses descriptors past 1023 (a busy server's): the client check read that as 'gone' and
    answered a healthy waiting request 503."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 1200 and hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip("fewer than 1200 file descriptors allowed")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    filler = [open(os.devnull) for _ in range(1100)]  # noqa: SIM115 - held open on purpose, closed below
    try:
        with serving(SlowScorer(tiny_scorer, 0.4), max_batch_pairs=4, chunk_pairs=4) as server:
            assert http(server.url, "POST", "/score", pairs(8))[0] == 200  # waits past one 0.25 s check
    finally:
        for f in filler:
            f.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_refused_body_is_dropped_within_the_idle_timeout_on_any_route(tiny_scorer):
    """The body of a request refused unread is read and dropped after its answer, bounded by the idle timeout in all:
    after a GET (whose request had already counted as read) a client dripping a byte at a time held its thread."""
    with serving(tiny_scorer, max_body_bytes=1024, idle_timeout=1.0) as server:
        host, port = server.url.removeprefix("http://").split(":")
        for head in (b"GET /health", b"POST /score"):
            with socket.create_connection((host, int(port))) as client:
                client.sendall(
                    head + b" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 4096\r\n\r\n"
                )
                with contextlib.suppress(OSError):
                    for _ in range(8):  # 4 s of dripping, four times the idle timeout
                        time.sleep(0.5)
                        client.sendall(b"x")
                assert server._inflight == 0, head  # while the client is still there


def test_the_time_limit_runs_from_the_requests_arrival(tiny_scorer, monkeypatch):
    """``request_timeout`` covers parsing and validation too, not only the wait for scores: a request whose parsing
    took the whole limit gets 503 without being queued for scoring."""
    import pmi_reward.serving.endpoints as endpoints

    slow = SlowScorer(tiny_scorer, 0.0)
    real = endpoints.split_query

    def slow_split(*args, **kwargs):
        time.sleep(3.0)
        return real(*args, **kwargs)

    monkeypatch.setattr(endpoints, "split_query", slow_split)
    # a limit generous enough for the tiny scorer on a loaded machine, and parsing that outlasts it
    with serving(slow, request_timeout=2.0) as server:
        status, answer = http(server.url, "POST", "/get_reward", {"query": ["Hi!\nHello."]})
        assert status == 503 and "parsing the request took it all" in answer["error"] and slow.calls == 0
        status, answer = http(server.url, "POST", "/score", pairs(2))  # no slow parsing: scored in time
        assert status == 200 and slow.calls == 1


def test_a_server_closed_before_it_serves_does_not_serve(tiny_scorer):
    """A SIGTERM between start-up and ``serve_forever()`` used to leave the server polling a closed socket forever
    (at 100% CPU, never exiting); now ``serve_forever()`` returns at once."""
    server = RewardServer(tiny_scorer, ServerConfig(port=0))
    server.close()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    thread.join(30)
    assert not thread.is_alive()


# -- 3. the HTTP layer ----------------------------------------------------------------------------------------
GARBLED = [
    b"GARBAGE\r\n\r\n",
    b"GET /health\r\n\r\n",  # HTTP/0.9
    b"GET /health HTTP/1.1 extra\r\n\r\n",
    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(range(40)) + b"\r\n\r\n",  # a TLS ClientHello
    b"GET /health HTTP/2.0\r\n\r\n",
    b"GET /health HTTP/1.x\r\n\r\n",
    b"POST /score HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}",
    b"POST /score HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\n{}",
    b"POST /score HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: +2\r\n\r\n{}",
    b"POST /score HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: 2, 2\r\n\r\n{}",
    b"POST /score HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: 2\r\nTransfer-Encoding: chunked"
    b"\r\n\r\n{}",
    b"GET /" + b"a" * 70000 + b" HTTP/1.1\r\n\r\n",
    b"GET /health HTTP/1.1\r\n" + b"X: y\r\n" * 120 + b"\r\n",
]


@pytest.mark.parametrize("request_bytes", GARBLED, ids=range(len(GARBLED)))
def test_garbled_requests_get_a_4xx_status_line_json_and_close(reward_server, request_bytes):
    answer = raw_http(reward_server.url, request_bytes)  # reads until the server closes the connection
    head, _, body = answer.partition(b"\r\n\r\n")
    status = int(head.split(b" ")[1])
    assert head.startswith(b"HTTP/1.1 4") and 400 <= status < 500, head
    assert json.loads(body)["status"] == status and b"Connection: close" in head
    assert b"Server: pmi-reward\r\n" in head and b"Python" not in head


def test_posts_must_be_json_415(reward_server):
    """A web page can POST text/plain or a form cross-origin without a preflight; only application/json is taken."""
    body = json.dumps(pairs(1)).encode()
    for media in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", None):
        headers = {"Content-Type": media} if media else {"Content-Type": ""}
        status, answer = http(reward_server.url, "POST", "/score", body, headers)
        assert status == 415 and "application/json" in answer["error"]
    assert (
        http(reward_server.url, "POST", "/score", body, {"Content-Type": "application/json; charset=utf-8"})[0] == 200
    )


def test_the_api_key_is_required_on_every_route(tiny_scorer):
    with serving(tiny_scorer, api_key=KEY) as server:
        for method, path, body in (("GET", "/health", None), ("POST", "/score", pairs(1)), ("GET", "/nowhere", None)):
            for headers in (
                {},
                {"Authorization": "Bearer wrong"},
                {"Authorization": KEY},
                {"Authorization": "Basic x"},
            ):
                status, answer = http(server.url, method, path, body, headers)
                assert status == 401 and "API key" in answer["error"]
        assert http(server.url, "GET", "/health", headers={"Authorization": f"Bearer {KEY}"})[0] == 200
        assert http(server.url, "POST", "/score", pairs(1), {"Authorization": f"bearer {KEY}"})[0] == 200
        head = raw_http(server.url, b"GET /health HTTP/1.1\r\nConnection: close\r\n\r\n").split(b"\r\n\r\n")[0]
        assert b"WWW-Authenticate: Bearer" in head


def test_clients_send_the_key(tiny_scorer, monkeypatch):
    """RemotePMIReward, the verl adapter and the OpenRLHF reward function all authenticate."""
    from pmi_reward.rewards.openrlhf import reward_func
    from pmi_reward.rewards.remote import RemotePMIReward, RemoteRewardError
    from pmi_reward.rewards.verl import compute_score_batch

    prompts, replies = ["I love jazz.", "I ran ten miles."], ["Coltrane!", "Wow, how long did it take?"]
    expected = PMIReward(tiny_scorer)(prompts, replies)
    with serving(tiny_scorer, api_key=KEY) as server:
        assert RemotePMIReward(server.url, api_key=KEY).score_sync(prompts, replies) == pytest.approx(expected)
        with pytest.raises(RemoteRewardError, match="401"):
            RemotePMIReward(server.url, on_failure="raise").score_sync(prompts, replies)
        infos = [{"context": p} for p in prompts]
        got = compute_score_batch(["d"] * 2, replies, [None] * 2, infos, url=server.url, api_key=KEY)
        assert [g["score"] for g in got] == pytest.approx(expected)
        monkeypatch.setenv("PMI_REWARD_API_KEY", KEY)
        monkeypatch.setenv("PMI_REWARD_URL", server.url)
        assert RemotePMIReward(server.url).score_sync(prompts, replies) == pytest.approx(expected)
        answer = reward_func([f"{prompts[0]}\n{replies[0]}"], [f"{prompts[0]}\n"], [""])
        assert answer["rewards"] == pytest.approx(expected[:1])


def test_a_key_read_with_its_newline_works_and_a_bad_key_is_refused_unshown(tiny_scorer, monkeypatch, caplog):
    """A key read from a secret file ends with a newline: http.client refused the header with an error holding the
    key, which was retried, logged in clear at INFO and WARNING, and every reward was None. Every client strips the
    key's surrounding whitespace now, and refuses a key no header can carry at once, naming where it came from (the
    argument or the variable), never the key; ``request_json`` refuses one before sending, not retried."""
    from pmi_reward.rewards.openrlhf import reward_func
    from pmi_reward.rewards.remote import RemotePMIReward, request_json
    from pmi_reward.rewards.verl import compute_score_batch

    prompts, replies = ["I love jazz.", "I ran ten miles."], ["Coltrane!", "Wow, how long did it take?"]
    expected = PMIReward(tiny_scorer)(prompts, replies)
    with serving(tiny_scorer, api_key=KEY) as server, caplog.at_level(logging.DEBUG):
        reward = RemotePMIReward(server.url, api_key=KEY + "\n", retries=1, backoff=0.01, on_failure="raise")
        assert reward.score_sync(prompts, replies) == pytest.approx(expected)
        monkeypatch.setenv("PMI_REWARD_API_KEY", f" {KEY}\r\n")
        monkeypatch.setenv("PMI_REWARD_URL", server.url)
        assert RemotePMIReward(server.url, on_failure="raise").score_sync(prompts, replies) == pytest.approx(expected)
        infos = [{"context": p} for p in prompts]
        got = compute_score_batch(["d"] * 2, replies, [None] * 2, infos, url=server.url)
        assert [g["score"] for g in got] == pytest.approx(expected)
        assert reward_func([f"{prompts[0]}\n{replies[0]}"], [f"{prompts[0]}\n"], [""])["rewards"] == pytest.approx(
            expected[:1]
        )
        for bad in ("s3cret key", "s3cret\nkey", "s3cret\x1bkey", "s3cr\u00e9t", " \n"):
            with pytest.raises(ValueError, match="^api_key must be printable ASCII without spaces"):
                RemotePMIReward(server.url, api_key=bad)
            with pytest.raises(ValueError, match="^api_key must be printable ASCII without spaces"):
                request_json(server.url + "/health", api_key=bad)
            monkeypatch.setenv("PMI_REWARD_API_KEY", bad)
            for client in (
                lambda: RemotePMIReward(server.url),
                lambda: reward_func([f"{prompts[0]}\n{replies[0]}"], [f"{prompts[0]}\n"], [""]),
                lambda: compute_score_batch(["d"], replies[:1], [None], infos[:1], url=server.url),
            ):
                with pytest.raises(ValueError, match=r"^\$PMI_REWARD_API_KEY must be printable ASCII") as info:
                    client()
                assert "s3c" not in str(info.value)
        assert "s3c" not in caplog.text and server.responses[401] == 0


def test_a_warning_when_listening_beyond_loopback_without_a_key(tiny_scorer, caplog):
    with caplog.at_level(logging.WARNING, "pmi_reward.serving.server"):
        RewardServer(tiny_scorer, ServerConfig(host="0.0.0.0", port=0)).close()
        assert "WITHOUT AN API KEY" in caplog.text
        caplog.clear()
        RewardServer(tiny_scorer, ServerConfig(host="0.0.0.0", port=0, api_key=KEY)).close()
        RewardServer(tiny_scorer, ServerConfig(host="127.0.0.1", port=0)).close()
        assert "WITHOUT AN API KEY" not in caplog.text


def test_each_request_is_logged_once_at_info(reward_server, caplog):
    with caplog.at_level(logging.INFO, "pmi_reward.serving.access"):
        http(reward_server.url, "POST", "/score?token=hidden", pairs(3), {"Authorization": "Bearer hidden"})
        http(reward_server.url, "GET", "/nowhere")
    lines = [r.getMessage() for r in caplog.records if r.name == "pmi_reward.serving.access"]
    assert len(lines) == 2 and "hidden" not in caplog.text
    assert '"POST /score" 200 items=3 ms=' in lines[0] and '"GET /nowhere" 404 items=- ms=' in lines[1]


def test_connections_over_the_cap_wait_for_a_free_one_without_a_thread(tiny_scorer):
    """50 idle sockets against a cap of 8: 8 are held, the others wait in the listen backlog without a thread; a
    request behind them was answered 503 at once, and is now answered once the sockets close. With a short
    queue_timeout it gets the 503, saying why."""
    with serving(tiny_scorer, max_connections=8, idle_timeout=30.0) as server:
        before = threading.active_count()
        host, port = server.httpd.server_address[:2]
        idle = [socket.create_connection((host, port)) for _ in range(50)]
        time.sleep(0.5)
        assert threading.active_count() - before <= 8
        waiting, out = in_thread(raw_http, server.url, b"GET /health HTTP/1.1\r\nConnection: close\r\n\r\n", 60.0)
        time.sleep(0.5)
        assert not out  # not answered while every slot is held
        assert threading.active_count() - before <= 8 + 1  # the client's thread
        for sock in idle:
            sock.close()
        waiting.join(60)
        assert out[0][0].startswith(b"HTTP/1.1 200")
        assert not server.responses[503]
    with serving(tiny_scorer, max_connections=8, idle_timeout=30.0, queue_timeout=0.5) as server:
        host, port = server.httpd.server_address[:2]
        idle = [socket.create_connection((host, port)) for _ in range(8)]
        answer = raw_http(server.url, b"GET /health HTTP/1.1\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 503") and b"Retry-After: 1" in answer
        assert b"too many connections" in answer and b"none closed within 0.5 s" in answer
        for sock in idle:
            sock.close()
        time.sleep(0.5)
        assert http(server.url, "GET", "/health")[0] == 200


def test_a_burst_over_the_connection_cap_is_served_not_refused(tiny_scorer):
    """OpenRLHF >= 0.9.1 opens a connection per sample, a whole rollout's at once; verl's reward loop calls from up
    to 256 threads. 40 one-pair requests at once against a cap of 4 (each held 0.05 s by the scorer): every one was
    answered 200 (most got 503 at once before), with never more than 4 connections open."""
    with serving(SlowScorer(tiny_scorer, 0.05), max_connections=4) as server:
        peak = []
        real = server._admit

        def admit(conn):
            reason = real(conn)
            peak.append(len(server._connections))
            return reason

        server._admit = admit
        barrier = threading.Barrier(40)

        def one(i):
            barrier.wait()
            return http(server.url, "POST", "/score", pairs(1), timeout=60)[0]

        clients = [in_thread(one, i) for i in range(40)]
        for thread, _ in clients:
            thread.join(60)
        assert [out[0][0] for _, out in clients] == [200] * 40
        deadline = time.monotonic() + 5  # the server counts an answer once it is sent, so after its client has it
        while server.responses[200] < 40 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert max(peak) <= 4 and server.responses[200] == 40 and not server.responses[503]


def test_close_refuses_a_connection_waiting_for_a_slot_at_once(tiny_scorer):
    """A connection waiting over the cap (queue_timeout 300 s) is answered 503 as soon as the drain starts, and
    close() returns: the accept loop it held wakes up."""
    server = RewardServer(tiny_scorer, ServerConfig(**{**LIMITS, "max_connections": 2, "queue_timeout": 300.0}))
    server.start()
    host, port = server.httpd.server_address[:2]
    idle = [socket.create_connection((host, port)) for _ in range(2)]
    waiting, out = in_thread(raw_http, server.url, b"GET /health HTTP/1.1\r\n\r\n", 60.0)
    time.sleep(0.5)
    assert not out
    closer = threading.Thread(target=server.close)
    closer.start()
    waiting.join(30)
    closer.join(30)
    assert not closer.is_alive()
    assert out[0][0].startswith(b"HTTP/1.1 503") and b"shutting down" in out[0][0]
    for sock in idle:
        sock.close()


def _final(answer: bytes) -> bytes:
    """An answer without the interim ``100 Continue`` responses before it."""
    while answer.startswith(b"HTTP/1.1 100 "):
        answer = answer.split(b"\r\n\r\n", 1)[1]
    return answer


def test_a_client_that_half_closes_still_gets_its_answer(tiny_scorer):
    """Some clients shut down their sending side once the request is out, and read on: the end of input was taken for
    a client that left, and a request that waited past the first check (0.25 s) was answered 503. A client that
    closed its connection is still told apart (test_an_abandoned_request_is_not_scored_to_its_end)."""
    with serving(SlowScorer(tiny_scorer, 0.2), max_batch_pairs=1, chunk_pairs=1) as server:
        body = json.dumps(pairs(4)).encode()  # 4 batches of at least 0.2 s each: checked several times
        head = b"POST /score HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
        host, port = server.httpd.server_address[:2]
        with socket.create_connection((host, port), timeout=60) as client:
            client.sendall(head % len(body) + body)
            client.shutdown(socket.SHUT_WR)
            answer = b""
            while chunk := client.recv(65536):
                answer += chunk
        answer = _final(answer)
        assert answer.startswith(b"HTTP/1.1 200"), answer[:300]
        assert len(json.loads(answer.split(b"\r\n\r\n", 1)[1])["scores"]) == 4


def test_idle_and_slow_connections_are_closed_after_idle_timeout(tiny_scorer):
    """idle_timeout 0.5 s: a silent socket and one that sends a header byte every 0.2 s (it would need 200 s to
    finish its request) are both closed by the server."""
    with serving(tiny_scorer, idle_timeout=0.5) as server:
        host, port = server.httpd.server_address[:2]
        silent, slow = socket.create_connection((host, port)), socket.create_connection((host, port))
        silent.settimeout(3)
        start = time.perf_counter()
        slowloris = b"GET /health HTTP/1.1\r\nX-Slow: " + b"a" * 1000
        closed = False
        for byte in slowloris:
            try:
                slow.sendall(bytes([byte]))
            except OSError:
                closed = True
                break
            time.sleep(0.2)
            if time.perf_counter() - start > 60:
                break
        assert closed
        silent.settimeout(60)
        assert silent.recv(100) == b""
        silent.close()
        slow.close()


def test_during_the_drain_new_connections_get_503_and_in_flight_requests_finish(tiny_scorer):
    server = RewardServer(SlowScorer(tiny_scorer, 1.0), ServerConfig(**LIMITS)).start()
    inflight, out = in_thread(http, server.url, "POST", "/score", pairs(1))
    time.sleep(0.3)
    closer = threading.Thread(target=server.close)
    closer.start()
    time.sleep(0.2)
    answer = raw_http(server.url, b"GET /health HTTP/1.1\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 503") and b"shutting down" in answer
    inflight.join(10)
    closer.join(10)
    assert out[0][0][0] == 200
    with pytest.raises(OSError):
        http(server.url, "GET", "/health", timeout=2)


def test_strings_back_to_back_are_counted_over_the_limit_in_bounded_steps(monkeypatch):
    """A body of strings with no separators (plus enough commas to be scanned) made the pre-scan take one step per
    string: 16 s of CPU for a 16 MB body. It is not JSON: counted over the limit after 2 x limit + 1 steps."""
    text = "{" + '""' * 400_000 + "," * 2_000 + "}"
    calls = []
    real = handler.scanstring
    monkeypatch.setattr(handler, "scanstring", lambda *a: calls.append(1) or real(*a))
    assert json_values(text, 1_000) > 1_000 and len(calls) <= 2 * 1_000 + 1  # was one call per string: 400,000


def test_an_answer_json_cannot_hold_is_a_500_not_a_dropped_connection(tiny_scorer, monkeypatch):
    """A ValueError while encoding the answer dropped the socket, printed a traceback and was counted as 200."""
    import pmi_reward.serving.server as server_module

    with serving(tiny_scorer) as server:
        monkeypatch.setattr(server_module.RewardServer, "health", lambda self: {"broken": float("inf")})
        status, body = http(server.url, "GET", "/health")[:2]
        assert status == 500 and "could not encode" in json.dumps(body)
        for _ in range(50):  # counted when the handler is done, just after the answer is written
            if server.responses[500]:
                break
            time.sleep(0.02)
        assert server.responses[500] == 1 and not server.responses[200]


def test_close_spends_one_drain_timeout_in_all(tiny_scorer):
    """The drain waited drain_timeout for in-flight requests, then as long again for the batcher: a 30-s grace
    period (Kubernetes' default) ended in SIGKILL. Requests still queued at the deadline get 503."""
    server = RewardServer(
        SlowScorer(tiny_scorer, 0.5), ServerConfig(**{**LIMITS, "drain_timeout": 1.0, "max_batch_pairs": 1})
    ).start()
    given: list[float | None] = []
    close_batcher = server.batcher.close
    server.batcher.close = lambda timeout=None: (given.append(timeout), close_batcher(timeout))[1]
    clients = [in_thread(http, server.url, "POST", "/score", pairs(4)) for _ in range(4)]
    time.sleep(0.3)
    _, seconds = timed(server.close)
    for thread, _ in clients:
        thread.join(10)
    # 8 s of queued work: the in-flight requests spent the whole budget, so none of it is left for the batcher
    assert given == [0.0]
    assert seconds < 5  # generous (two budgets take 2 s; waiting for the queued work, 8 s)
    assert {out[0][0][0] for _, out in clients} <= {200, 503}
    # the batch that outlived the drain runs on in the worker: ended before the tests do, or the interpreter's exit
    # meets it inside torch and aborts ("terminate called without an active exception", exit status 134)
    server.batcher._thread.join(60)
    assert not server.batcher._thread.is_alive()


def test_a_non_finite_clip_is_refused():
    """--clip inf was accepted, then every /health answer failed to encode (RemotePMIReward reads /health)."""
    with pytest.raises(ValueError, match="clip must be positive and finite"):
        RewardOptions(clip=float("inf"))


def test_a_scorer_answer_of_the_wrong_length_fails_no_merged_request():
    """A scorer that returned one score too few: the pieces before the bad one were given slices of the short
    array, a later innocent request failed with the bad one, and the failed request's other chunks kept being
    scored. Its length is checked first; the merged pieces are then scored one by one (NaN where a pair fails)."""
    import numpy as np

    from pmi_reward.rewards.batching import MicroBatcher

    class Short:
        context_turns = None

        def score(self, contexts, responses, progress=False):
            out = np.array([float(len(r)) for r in responses])
            return out[:-1] if any(r.startswith("SHORT") for r in responses) else out

    batcher = MicroBatcher(Short(), max_batch_pairs=4, chunk_pairs=2, max_wait_ms=50)
    try:
        bad = batcher.submit(["c"] * 6, [f"SHORT{i}" for i in range(6)])
        good = [batcher.submit(["c"], ["x" * (i + 1)]) for i in range(6)]
        assert [f.result(5)[0] for f in good] == [float(i + 1) for i in range(6)]
        assert np.isnan(bad.result(5)).all()
    finally:
        batcher.close(5)


@pytest.mark.parametrize("name", ["queue_timeout", "request_timeout", "drain_timeout", "idle_timeout"])
@pytest.mark.parametrize("value", [0.0, float("inf"), float("nan"), threading.TIMEOUT_MAX * 2])
def test_timeouts_a_wait_cannot_take_are_refused(name, value):
    """A condition's wait takes at most threading.TIMEOUT_MAX: --queue_timeout inf raised in the accept loop, and
    every connection over the cap was closed unanswered instead of getting its 503."""
    with pytest.raises(ValueError, match=f"{name} must be > 0 and at most"):
        ServerConfig(**{name: value})


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("max_wait_ms", float("inf"), "max_wait_ms must be >= 0"),  # killed the batcher: every request 503
        ("max_wait_ms", float("nan"), "max_wait_ms must be >= 0"),  # spun the batcher forever
        ("max_wait_ms", -1.0, "max_wait_ms must be >= 0"),
        ("port", 70000, "port must be 0-65535"),  # an OverflowError at bind, after the scorer loaded
        ("port", -1, "port must be 0-65535"),
    ],
)
def test_a_batch_wait_or_port_no_server_can_use_is_refused(name, value, message):
    with pytest.raises(ValueError, match=message):
        ServerConfig(**{name: value})
    assert ServerConfig(max_wait_ms=0.0, port=0).port == 0

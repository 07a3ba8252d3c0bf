"""The reward server on loopback: protocol, errors, micro-batching, timeouts, graceful shutdown, a load test."""

import json
import math
import socket
import threading
import time

import numpy as np
import pytest
from conftest import TOPICS, http, raw_http

from benchmarks.loadtest import run_load, score_bodies
from pmi_reward.rewards.reward import PMIReward
from pmi_reward.serving.server import RewardServer, ServerConfig

CHATML_PROMPT = (
    "<|im_start|>system\nBe nice.<|im_end|>\n<|im_start|>user\nI love jazz.<|im_end|>\n"
    "<|im_start|>assistant\nMe too!<|im_end|>\n<|im_start|>user\nWho is your favourite?<|im_end|>\n"
    "<|im_start|>assistant\n"
)
MESSAGES = [
    {"role": "user", "content": "I love jazz."},
    {"role": "assistant", "content": "Me too!"},
    {"role": "user", "content": "Who is your favourite?"},
]


class SlowScorer:
    """A scorer that takes ``delay`` seconds per call (to hold requests in flight)."""

    def __init__(self, scorer, delay: float) -> None:
        self.inner, self.delay, self.calls = scorer, delay, 0

    def score(self, contexts, responses, progress=False):
        self.calls += 1
        time.sleep(self.delay)
        return self.inner.score(contexts, responses)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as sock:
            sock.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.skipif(not _ipv6_loopback(), reason="no IPv6 loopback on this machine")
@pytest.mark.parametrize("host", ["::1", "[::1]", "::"])
def test_an_ipv6_host_is_served(spread_scorer, host):
    """``--host ::1`` (or ``::``) failed with a raw socket.gaierror after the scorer had loaded: the server's socket
    was IPv4 only. It listens on IPv6 now, its URL has the address in brackets, and clients reach it there."""
    from pmi_reward.rewards.remote import RemotePMIReward

    server = RewardServer(spread_scorer, ServerConfig(host=host, port=0)).start()
    try:
        assert server.url.startswith("http://[") and http(server.url, "GET", "/health")[0] == 200
        got = RemotePMIReward(server.url, on_failure="raise").score_sync(["I love jazz."], ["Coltrane!"])
        assert got == pytest.approx(PMIReward(spread_scorer)(["I love jazz."], ["Coltrane!"]), abs=1e-5)
    finally:
        server.close()


def test_score_matches_the_scorer(spread_server, spread_scorer):
    contexts = ["hi there\nhow are you?", "I like jazz", "So?", "我喜欢音乐"]
    responses = ["fine", "me too", "hello", "🎵"]
    expected = spread_scorer.score(contexts, responses).tolist()
    assert len(set(np.round(expected, 4))) == 4  # the pairs score apart: an answer in another order would show
    status, answer = http(
        spread_server.url,
        "POST",
        "/score",
        {"pairs": [{"context": c, "response": r} for c, r in zip(contexts, responses, strict=True)]},
    )
    assert status == 200
    assert answer["scores"] == pytest.approx(expected, abs=1e-5)
    assert http(spread_server.url, "POST", "/score", {"pairs": []}) == (200, {"scores": []})


def test_get_reward_speaks_openrlhf(spread_server, spread_scorer):
    replies = ["Coltrane, for sure.", "That's interesting.", ""]
    queries = [CHATML_PROMPT + r + "<|im_end|>\n<|endoftext|>" for r in replies]
    status, answer = http(
        spread_server.url,
        "POST",
        "/get_reward",
        {"query": queries, "prompts": [CHATML_PROMPT] * 3, "labels": ["", "", ""]},
    )
    assert status == 200 and set(answer) == {"rewards", "scores", "extra_logs"}
    expected = PMIReward(spread_scorer)([MESSAGES] * 3, replies)
    assert abs(expected[0] - expected[1]) > 1e-3  # the replies score apart: swapped answers would show
    assert answer["rewards"] == pytest.approx(expected, abs=1e-5)
    assert answer["rewards"][2] == -5.0  # empty reply: empty_score
    raw = answer["extra_logs"]["pmi_raw"]
    assert answer["scores"][:2] == pytest.approx([1 / (1 + math.exp(-x)) for x in raw[:2]])
    assert answer["scores"][2] == 0.0 and answer["extra_logs"]["pmi_scored"] == [1.0, 1.0, 0.0]
    # without prompts the last assistant turn of the query is the reply
    status, alone = http(spread_server.url, "POST", "/get_reward", {"query": queries[:2]})
    assert status == 200 and alone["rewards"] == pytest.approx(answer["rewards"][:2], abs=1e-5)


def test_rerank_puts_the_best_first(spread_server, spread_scorer):
    candidates = ["ok", "Coltrane.", "", "Miles Davis, Kind of Blue"]
    context = "I love jazz.\nMe too!\nWho is your favourite?"
    scorable = [c for c in candidates if c]
    direct = dict(zip(scorable, spread_scorer.score([context] * 3, scorable).tolist(), strict=True))
    best_first = sorted(direct, key=direct.get, reverse=True)
    # the candidates score apart, and their own order is not best first: the ranking has to sort them
    assert len(set(np.round(list(direct.values()), 4))) == 3 and best_first != scorable
    status, answer = http(
        spread_server.url, "POST", "/rerank", {"context": MESSAGES, "candidates": candidates, "top_k": 3}
    )
    assert status == 200 and len(answer["ranked"]) == 3 and len(answer["scores"]) == 4
    assert answer["scores"][2] is None
    assert [r["response"] for r in answer["ranked"]] == best_first
    assert [r["score"] for r in answer["ranked"]] == pytest.approx([direct[c] for c in best_first], abs=1e-5)
    finite = [s for s in answer["scores"] if s is not None]  # scores in the candidates' order
    assert finite == pytest.approx([direct[c] for c in scorable], abs=1e-5)


def test_health_describes_the_scorer(reward_server):
    status, answer = http(reward_server.url, "GET", "/health")
    assert status == 200 and answer["status"] == "ok"
    assert answer["scorer"]["trained_context_turns"] == 3 and answer["reward_options"]["empty_score"] == -5.0


BAD = [
    ("GET", "/nowhere", None, {}, 404, "no endpoint"),
    ("GET", "/score", None, {}, 405, "takes POST"),
    ("DELETE", "/health", None, {}, 405, "takes GET"),
    ("POST", "/score", b"{not json", {}, 400, "not valid JSON"),
    ("POST", "/score", b'{"pairs": NaN}', {}, 400, "NaN"),
    ("POST", "/score", b"\xff\xfe\xfa", {}, 400, "not valid JSON"),
    ("POST", "/score", [1, 2], {}, 422, "must be a JSON object"),
    ("POST", "/score", {"pairs": "a"}, {}, 422, "'pairs' must be a list"),
    ("POST", "/score", {"pairs": [{"context": "a", "response": 3}]}, {}, 422, "pairs[0].response must be a string"),
    ("POST", "/score", {"pairs": [["a", "b"]]}, {}, 422, "pairs[0] must be an object"),
    ("POST", "/score", b'{"pairs": [{"context": "\\ud800", "response": "x"}]}', {}, 422, "lone surrogate"),
    ("POST", "/score", {"pairs": [{"context": "a", "response": "b"}] * 65}, {}, 413, "limit is 64"),
    ("POST", "/score", {"pairs": [{"context": "a" * 300_000, "response": "b"}]}, {}, 413, "exceeds the limit"),
    ("POST", "/get_reward", {"query": ["a"], "prompts": ["a", "b"]}, {}, 422, "'prompts' holds 2"),
    ("POST", "/get_reward", {"prompts": ["a"]}, {}, 422, "'query' must be a list"),
    ("POST", "/get_reward", {"query": [None]}, {}, 422, "query[0] must be a string"),
    ("POST", "/rerank", {"context": 5, "candidates": []}, {}, 422, "'context' must be"),
    ("POST", "/rerank", {"context": "a", "candidates": ["b"], "top_k": 0}, {}, 422, "'top_k'"),
    ("POST", "/score", b"{}", {"Content-Length": "-3"}, 400, "invalid Content-Length"),
]


@pytest.mark.parametrize("method,path,body,headers,status,message", BAD, ids=[f"{b[4]}-{b[5]}" for b in BAD])
def test_bad_requests_get_a_4xx_with_a_message(reward_server, method, path, body, headers, status, message):
    got, answer = http(reward_server.url, method, path, body, headers)
    assert got == status and answer["status"] == status and message in answer["error"]
    assert http(reward_server.url, "GET", "/health")[0] == 200


def test_raw_protocol_errors(reward_server):
    no_length = b"POST /score HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n"
    assert raw_http(reward_server.url, no_length).startswith(b"HTTP/1.1 411")
    chunked = b"POST /score HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n"
    assert raw_http(reward_server.url, chunked).startswith(b"HTTP/1.1 411")
    assert raw_http(reward_server.url, b"FETCH /score HTTP/1.1\r\nHost: x\r\n\r\n").startswith(b"HTTP/1.1 405")
    assert raw_http(reward_server.url, b"GET /health HTTP/7.0\r\n\r\n").startswith(b"HTTP/1.1 400")
    assert raw_http(reward_server.url, b"GARBAGE\r\n\r\n").startswith(b"HTTP/1.1 400")  # with a status line
    # keep-alive: two requests on one connection, both answered
    one = b'POST /score HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 12\r\n\r\n{"pairs":[]}'
    both = raw_http(reward_server.url, one + one.replace(b"Host: x", b"Host: x\r\nConnection: close"))
    assert both.count(b"HTTP/1.1 200") == 2


def _sentences(n: int, seed: int) -> list[str]:
    words = " ".join(t for turns in TOPICS.values() for t in turns).split()
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(words, rng.integers(1, 12))) for _ in range(n)]


def test_concurrent_requests_are_merged_and_each_gets_its_own_scores(spread_scorer):
    bodies = score_bodies(_sentences(64, 0), _sentences(64, 1), 4)
    slow = SlowScorer(spread_scorer, 0.05)
    with RewardServer(slow, ServerConfig(port=0, max_batch_pairs=64)) as server:
        result = run_load(server.url, bodies, clients=16)
        stats = server.batcher.stats
    assert not result.errors and stats.requests == 16 and stats.batches < 16
    pairs = [([p["context"] for p in b["pairs"]], [p["response"] for p in b["pairs"]]) for b in bodies]
    expected = [spread_scorer.score(contexts, responses) for contexts, responses in pairs]
    # the pairs score apart: a request answered with another's scores, or its own in another order, would show
    assert len(set(np.round(np.concatenate(expected), 4))) > 60
    for scores, own in zip(result.scores, expected, strict=True):
        np.testing.assert_allclose(scores, own, atol=1e-4)


def test_a_request_that_waits_too_long_gets_503(tiny_scorer):
    with RewardServer(SlowScorer(tiny_scorer, 1.0), ServerConfig(port=0, request_timeout=0.2)) as server:
        status, answer = http(server.url, "POST", "/score", {"pairs": [{"context": "a", "response": "b"}]})
        assert status == 503 and "not scored within 0.2 s" in answer["error"]
        assert http(server.url, "GET", "/health")[0] == 200


def test_close_drains_in_flight_requests_then_refuses(tiny_scorer):
    slow = SlowScorer(tiny_scorer, 0.5)
    server = RewardServer(slow, ServerConfig(port=0)).start()
    idle = socket.create_connection(server.httpd.server_address[:2])  # an idle keep-alive client
    answers = []
    worker = threading.Thread(
        target=lambda: answers.append(
            http(server.url, "POST", "/score", {"pairs": [{"context": "a", "response": "b"}]})
        )
    )
    worker.start()
    deadline = time.monotonic() + 10  # until the request is being scored: in flight when the server closes
    while not slow.calls and time.monotonic() < deadline:
        time.sleep(0.01)
    assert slow.calls == 1 and not answers
    t0 = time.perf_counter()
    server.close()
    worker.join()
    assert time.perf_counter() - t0 < 5
    assert answers[0][0] == 200 and len(answers[0][1]["scores"]) == 1
    with pytest.raises(OSError):
        http(server.url, "GET", "/health", timeout=2)
    idle.close()


def test_keep_alive_clients_give_their_slots_up_while_a_connection_waits(tiny_scorer):
    """Pooled keep-alive clients held every slot between their requests, so a new connection over the cap waited until
    they sat idle for idle_timeout (or got 503 at queue_timeout). While one waits, every answer now says
    ``Connection: close``, and the client that reads it gives its slot up: the waiting one is admitted at once."""
    from http.client import HTTPConnection

    config = ServerConfig(port=0, max_connections=2, queue_timeout=10.0, idle_timeout=30.0)
    with RewardServer(tiny_scorer, config) as server:
        host, port = server.httpd.server_address[:2]
        pooled = [HTTPConnection(host, port, timeout=30) for _ in range(2)]

        def ask(conn: HTTPConnection) -> str | None:
            conn.request("GET", "/health")
            response = conn.getresponse()
            response.read()
            assert response.status == 200
            return response.getheader("Connection")

        assert [ask(conn) for conn in pooled] == [None, None]  # kept alive: both slots held, idle
        answers = []
        t0 = time.monotonic()
        third = threading.Thread(
            target=lambda: answers.append((http(server.url, "GET", "/health")[0], time.monotonic() - t0))
        )
        third.start()
        deadline = time.monotonic() + 2  # until the accept loop holds it in _admit
        while not getattr(server, "waiters", 0) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not answers and ask(pooled[0]) == "close"
        third.join(5)
        assert answers and answers[0][0] == 200 and answers[0][1] < 3.0, answers  # queue_timeout is 10 s
        assert server.waiters == 0 and ask(pooled[1]) is None  # nobody waits: kept alive again
        for conn in pooled:
            conn.close()


def test_load_8_clients_x_200_requests(reward_server):
    """Bounded load on loopback: 1600 requests of 4 pairs; every answer complete, none failed."""
    n = 8 * 200 * 4
    bodies = score_bodies(_sentences(n, 2), [f"{s} 🙂" for s in _sentences(n, 3)], 4)
    result = run_load(reward_server.url, bodies, clients=8)
    summary = result.summary()
    print(f"\nload test (tiny scorer, 8 clients x 200 requests x 4 pairs): {json.dumps(summary)}")
    assert result.errors == [] and summary["requests"] == 1600 and summary["pairs"] == n
    assert all(s is not None and len(s) == 4 and all(isinstance(x, float) for x in s) for s in result.scores)


def test_deeply_nested_rerank_input_is_not_a_5xx(reward_server):
    """JSON nested a few hundred deep (within the parser's limit) in /rerank's context or candidates is unreadable:
    answered 200 (an empty context; a null score), not 500 from a RecursionError."""
    nested = "[" * 600 + "]" * 600
    body = f'{{"context": {nested}, "candidates": ["a"]}}'.encode()
    status, answer = http(reward_server.url, "POST", "/rerank", body)
    assert status == 200 and len(answer["scores"]) == 1, answer
    body = f'{{"context": "c", "candidates": ["a", {nested}]}}'.encode()
    status, answer = http(reward_server.url, "POST", "/rerank", body)
    assert status == 200 and isinstance(answer["scores"][0], float) and answer["scores"][1] is None, answer

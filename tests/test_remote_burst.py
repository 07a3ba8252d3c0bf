"""RemotePMIReward on a call of many ``batch_size`` chunks: at most ``CHUNKS_IN_FLIGHT`` of one call's requests are in
flight at once, so a large call is answered where the server cannot score all of it within one try's ``timeout``
(its batcher advances the requests it holds together: every chunk of a call sent at once timed out together), calls
still overlap with each other, and a failed call sends no more of its chunks."""

import asyncio
import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler

import numpy as np
import pytest

import pmi_reward.rewards.remote as remote
from pmi_reward.rewards.remote import RemotePMIReward, RemoteRewardError
from pmi_reward.serving.config import ServerConfig
from pmi_reward.serving.server import RewardServer


class _Counting(BaseHTTPRequestHandler):
    """Answers ``/score`` after ``hold`` seconds with a score of 1.0 a pair (the ``fail_first`` first requests: 422 at
    once), counting the requests received and the most in flight at once; ``/health`` as a 3-turn scorer's server."""

    protocol_version = "HTTP/1.1"
    hold = 0.2
    fail_first = 0
    lock = threading.Lock()
    received = 0
    in_flight = 0
    most_in_flight = 0

    def log_message(self, *args: object) -> None:
        pass

    def _reply(self, status: int, payload: dict) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self._reply(200, {"scorer": {"trained_context_turns": 3}, "reward_options": {"max_chars": 100_000}})

    def do_POST(self) -> None:
        pairs = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["pairs"]
        cls = type(self)
        with cls.lock:
            cls.received += 1
            refused = cls.received <= cls.fail_first
            cls.in_flight += 1
            cls.most_in_flight = max(cls.most_in_flight, cls.in_flight)
        try:
            if refused:
                self._reply(422, {"error": "refused for the test"})
                return
            time.sleep(cls.hold)
            self._reply(200, {"scores": [1.0] * len(pairs)})
        finally:
            with cls.lock:
                cls.in_flight -= 1


@pytest.fixture
def counting(stub_http_server) -> Callable[..., tuple[str, type[_Counting]]]:
    """A starter of loopback servers (``stub_http_server``) each with a fresh ``_Counting`` handler class (its own
    lock, its attributes given) that returns the URL and the class (whose counters the test reads)."""

    def start(**attributes: object) -> tuple[str, type[_Counting]]:
        return stub_http_server(_Counting, **{"lock": threading.Lock(), **attributes})

    return start


def test_a_call_larger_than_one_try_can_hold_is_answered(tiny_scorer, monkeypatch):
    """repro_2 of review 29, scaled down: a server scoring 160 pairs/s, a call of 16 chunks of 16 pairs (1.6 s of
    scoring) and 0.8 s a try. Sent all at once (up to ``MAX_REQUESTS``), the chunks were merged into the same batches
    and answered together, after 0.8 s: the call failed, every sample None. Two at a time, each try waits for about
    32 pairs (0.2 s), and every reward comes back."""
    rate = 160.0

    def slow_score(contexts: list[str], responses: list[str], progress: bool = False) -> np.ndarray:
        time.sleep(len(contexts) / rate)
        return np.ones(len(contexts))

    monkeypatch.setattr(tiny_scorer, "score", slow_score)
    monkeypatch.setattr(remote, "MAX_REQUESTS", 16)  # as on a 12-core trainer host, whatever this one has
    server = RewardServer(tiny_scorer, ServerConfig(port=0, request_timeout=30.0)).start()
    try:
        reward = RemotePMIReward(
            server.url, timeout=0.8, retries=0, batch_size=16, max_context_turns=3, on_failure="raise"
        )
        n = 16 * 16
        rewards = reward.score_sync([f"context {i // 8}" for i in range(n)], [f"reply {i}" for i in range(n)])
    finally:
        server.close()
    assert rewards == [1.0] * n
    assert server.batcher.stats.pairs == n  # each pair scored once: no try timed out and was sent again


def test_one_call_keeps_two_chunks_in_flight_and_calls_still_overlap(counting):
    """One call of 6 chunks has at most ``CHUNKS_IN_FLIGHT`` (2) requests in flight (all 6 were sent at once, as many
    as ``MAX_REQUESTS``, at least 5, allowed); two calls on one event loop (TRL gathers its reward functions) still
    run side by side: 4 in flight."""
    url, handler = counting()
    reward = RemotePMIReward(url, retries=0, batch_size=4, max_context_turns=3, on_failure="raise")
    contexts, replies = ["c"] * 24, [f"reply {i}" for i in range(24)]
    assert reward.score_sync(contexts, replies) == [1.0] * 24
    assert handler.received == 6 and handler.most_in_flight == 2

    handler.received = handler.most_in_flight = 0

    async def two_calls() -> list[list[float | None]]:
        return await asyncio.gather(reward(contexts, replies), reward(contexts, replies))

    assert asyncio.run(two_calls()) == [[1.0] * 24] * 2
    assert handler.received == 12 and handler.most_in_flight == 4


def test_a_failed_call_sends_no_more_of_its_chunks(counting):
    """The first chunk refused (422, not retried) fails the call; its chunks not yet sent are cancelled. Before, on
    an event loop that outlives the call (TRL's), the rest of its chunks went on being sent and scored for a call
    already given up."""
    url, handler = counting(fail_first=1)
    reward = RemotePMIReward(url, retries=0, batch_size=4, max_context_turns=3, on_failure="raise")

    async def call_then_wait() -> None:
        with pytest.raises(RemoteRewardError, match="HTTP 422: refused for the test"):
            await reward(["c"] * 40, [f"reply {i}" for i in range(40)])
        await asyncio.sleep(1.0)  # the loop runs on: a chunk left behind would be sent now

    asyncio.run(call_then_wait())
    assert handler.received <= 2  # the refused chunk and the one sent with it

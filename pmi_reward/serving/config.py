"""``ServerConfig``: where the reward server listens, who may call it, how it batches, and its limits."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from ..rewards.remote import check_api_key

__all__ = ["ServerConfig"]


@dataclass
class ServerConfig:
    """Where the server listens, who may call it, how it batches, and its limits (``docs/serving.md``, Security)."""

    host: str = field(
        default="127.0.0.1",
        metadata={"help": "address to listen on (0.0.0.0: every IPv4 interface; IPv6: ::1, or :: for every interface)"},
    )
    port: int = field(default=8000, metadata={"help": "port (0: any free port)"})
    api_key: str | None = field(
        default=None,
        metadata={
            "help": "require 'Authorization: Bearer <key>' on every request (default: $PMI_REWARD_API_KEY; prefer "
            "the variable: a flag shows in the process list)"
        },
    )
    max_batch_pairs: int = field(default=256, metadata={"help": "pairs merged into one encoder call"})
    max_batch_chars: int = field(
        default=64 * 1024,
        metadata={
            "help": "characters of text in one encoder call (those it tokenizes: a long text's window, a text "
            "several pairs share once): bounds how long a batch runs, so how long a small "
            "request waits behind a large one (with MiniLM on one CPU thread: <= 20.2 s, docs/serving.md); raise it "
            "on a GPU"
        },
    )
    chunk_pairs: int = field(
        default=32, metadata={"help": "pairs a request gives a batch per round-robin turn (fair queueing)"}
    )
    max_wait_ms: float = field(default=2.0, metadata={"help": "how long a free batcher waits for requests to merge"})
    max_body_bytes: int = field(default=16 * 2**20, metadata={"help": "larger request bodies get 413"})
    max_pairs: int = field(default=4096, metadata={"help": "pairs, queries or candidates per request; more: 413"})
    max_request_chars: int = field(
        default=4_000_000, metadata={"help": "characters of text per request (all its strings); more: 413"}
    )
    max_json_values: int = field(
        default=131_072,
        metadata={
            "help": "JSON values per request body (strings, numbers, lists, objects, keys); more: 413 before the body "
            "is parsed (parsing holds the interpreter: a 16 MiB body of [0,0,...] froze every request for seconds)"
        },
    )
    max_connections: int = field(
        default=256,
        metadata={
            "help": "open connections (a thread each); one more waits in the listen backlog for a free one, up to "
            "queue_timeout"
        },
    )
    queue_timeout: float = field(
        default=30.0,
        metadata={
            "help": "seconds a new connection over max_connections waits for one to close (a burst of one-sample "
            "requests: OpenRLHF, verl); the server full that long, it and those behind it get 503 until one closes"
        },
    )
    request_timeout: float = field(
        default=60.0,
        metadata={"help": "seconds from a request's arrival (its body read) to its scores, parsing included; then 503"},
    )
    drain_timeout: float = field(default=30.0, metadata={"help": "seconds shutdown waits for in-flight requests"})
    idle_timeout: float = field(
        default=30.0,
        metadata={
            "help": "seconds a keep-alive connection may wait before its next request's line and headers are in, and "
            "seconds a request's body may take after its headers (idle or slow); then closed"
        },
    )
    header_timeout: float = field(
        default=10.0,
        metadata={
            "help": "seconds a new connection may take to send its first request line and headers (at most "
            "idle_timeout); then closed: sockets that send nothing, with or without the key, free their slot soon"
        },
    )

    def __post_init__(self) -> None:
        if self.api_key is not None:
            check_api_key(self.api_key, "api_key")  # the clients' check: a key they can send
        for name in (
            "max_batch_pairs",
            "max_batch_chars",
            "chunk_pairs",
            "max_body_bytes",
            "max_pairs",
            "max_request_chars",
            "max_json_values",
            "max_connections",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        for name in ("request_timeout", "drain_timeout", "idle_timeout", "header_timeout", "queue_timeout"):
            # a condition's wait takes at most threading.TIMEOUT_MAX: inf raised in the accept loop, unanswered
            if not 0 < getattr(self, name) <= threading.TIMEOUT_MAX:
                raise ValueError(f"{name} must be > 0 and at most {threading.TIMEOUT_MAX:g} s")
        if not 0 <= self.max_wait_ms / 1000 <= threading.TIMEOUT_MAX:  # inf killed the batcher, nan spun it: all 503
            raise ValueError(f"max_wait_ms must be >= 0 and at most {threading.TIMEOUT_MAX * 1000:g}")
        if not 0 <= self.port <= 65535:  # else an OverflowError at bind, after the scorer loaded
            raise ValueError("port must be 0-65535 (0: any free port)")

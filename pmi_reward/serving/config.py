"""``ServerConfig``: where the reward server listens, how it batches, and its limits."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["ServerConfig"]


@dataclass
class ServerConfig:
    """Where the server listens, how it batches, and its limits."""

    host: str = field(default="127.0.0.1", metadata={"help": "address to listen on (0.0.0.0: every interface)"})
    port: int = field(default=8000, metadata={"help": "port (0: any free port)"})
    max_batch_pairs: int = field(default=256, metadata={"help": "pairs merged into one encoder call"})
    max_wait_ms: float = field(default=2.0, metadata={"help": "how long a free batcher waits for requests to merge"})
    max_body_bytes: int = field(default=16 * 2**20, metadata={"help": "larger request bodies get 413"})
    max_pairs: int = field(default=4096, metadata={"help": "pairs, queries or candidates per request; more: 413"})
    request_timeout: float = field(default=60.0, metadata={"help": "seconds a request may wait for scores; then 503"})
    drain_timeout: float = field(default=30.0, metadata={"help": "seconds shutdown waits for in-flight requests"})
    idle_timeout: float = field(default=75.0, metadata={"help": "seconds a keep-alive connection may stay idle"})

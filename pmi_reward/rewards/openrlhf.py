"""OpenRLHF's custom reward function: its ``--remote_rm_url`` (``--reward.remote_url``) set to this file's path.

OpenRLHF posts ``{"query", "prompts", "labels"}`` to a reward URL without custom headers, so it cannot send the
API key of a server that requires one. Given a ``.py`` file instead of a URL, it calls the file's
``reward_func(queries, prompts, labels)`` and uses the dict it returns as it would use the server's answer. This
one forwards the call to a ``pmi-reward serve`` server's ``/get_reward`` with the key: the URL from
``$PMI_REWARD_URL`` and the key from ``$PMI_REWARD_API_KEY`` in the workers' environment (its surrounding whitespace
stripped; one no header can carry raises a ValueError naming the variable, never the key). It retries connection
errors, timeouts, 429 and 5xx, as OpenRLHF retries its own requests. OpenRLHF loads the file by path under
another module name, so it imports the library by absolute name; ``docs/serving.md`` has the command.
"""

from __future__ import annotations

import os
import time
from typing import Any

from pmi_reward.rewards.remote import RemoteRewardError, api_key_from_env, request_json

__all__ = ["reward_func"]

RETRIES, BACKOFF, TIMEOUT = 4, 1.0, 180.0  # OpenRLHF's own: 5 attempts, 1 s apart, 180 s each


def reward_func(queries: list[str], prompts: list[str], labels: list[Any] | None = None, **kwargs: Any) -> dict:
    """The server's ``/get_reward`` answer (``rewards``, ``scores``, ``extra_logs``) for OpenRLHF's samples."""
    url = (kwargs.get("url") or os.environ.get("PMI_REWARD_URL") or "").rstrip("/")
    if not url:
        raise ValueError("pmi_reward openrlhf: set $PMI_REWARD_URL to the `pmi-reward serve` server's address")
    if not url.endswith("/get_reward"):
        url += "/get_reward"
    payload = {"query": list(queries), "prompts": list(prompts), "labels": list(labels or [""] * len(queries))}
    api_key = api_key_from_env(kwargs.get("api_key"))
    for attempt in range(RETRIES + 1):
        try:
            return request_json(url, payload, TIMEOUT, api_key)
        except RemoteRewardError as err:
            if not err.retryable or attempt == RETRIES:
                raise
            time.sleep(BACKOFF)
    raise AssertionError("unreachable")

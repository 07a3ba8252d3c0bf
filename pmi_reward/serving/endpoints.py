"""What the reward server answers: one method per route, each going through the one reward path.

- ``POST /get_reward``: OpenRLHF's remote reward-model protocol (``--reward.remote_url``, before v0.10.2
  ``--remote_rm_url``): chat-templated full texts in ``query`` (prompt + reply), optionally the ``prompts``;
  ``rewards``, ``scores`` and ``extra_logs`` out, shaped by the server's ``RewardOptions`` exactly as
  ``PMIReward`` shapes them. OpenRLHF >= 0.9.1 sends one sample per request (and an empty one to each extra
  URL, answered 200); ``center: group`` cannot work on such requests and is refused with a 422 saying so.
- ``POST /score``: raw PMI of ``{"context", "response"}`` pairs, each read as ``/rerank`` reads a string context and
  its candidate (``RemotePMIReward`` calls this); ``"as_given": true`` scores the texts as they are sent.
- ``POST /rerank``: one context's candidate replies, best first.

Malformed input gets an ``ApiError`` (a 4xx with a message naming the field, never a 5xx); ``docs/serving.md``
has the full protocol.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

from ..data.conversation import split_query
from ..rewards.batching import MicroBatcher, ScoreTimeout
from ..rewards.options import RewardOptions
from ..rewards.path import GroupError, RewardPath, cut_context, cut_reply, readable, visible
from ..rewards.rerank import ranking
from .config import ServerConfig

__all__ = ["ApiError", "Endpoints", "check_options", "type_name", "items_of", "text_chars"]

ITEM_KEYS = ("pairs", "query", "candidates")  # what each route's items are, for the access log

logger = logging.getLogger(__name__)


class ApiError(Exception):
    """A request the server refuses, with the HTTP status and a message for the caller."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


def type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def items_of(body: dict) -> int | None:
    """How many items (pairs, queries or candidates) a request body holds, or None."""
    for key in ITEM_KEYS:
        if isinstance(body.get(key), list):
            return len(body[key])
    return None


def text_chars(body: Any) -> int:
    """Characters of text in a parsed JSON body (every string, keys included), counted without recursion."""
    total, stack = 0, [body]
    while stack:
        value = stack.pop()
        if isinstance(value, str):
            total += len(value)
        elif isinstance(value, dict):
            stack.extend(value)
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
    return total


def _optional_list(body: dict, key: str, limit: int) -> list | None:
    return None if body.get(key) is None else _list(body, key, limit)


def _list(body: dict, key: str, limit: int) -> list:
    value = body.get(key)
    if not isinstance(value, list):
        raise ApiError(422, f"{key!r} must be a list, got {type_name(value)}")
    if len(value) > limit:
        raise ApiError(413, f"{key!r} holds {len(value)} items; the limit is {limit} per request")
    return value


def _optional_text(value: Any, where: str) -> str | None:
    return None if value is None else _text(value, where)


def _text(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise ApiError(422, f"{where} must be a string, got {type_name(value)}")
    if not readable(value):
        raise ApiError(422, f"{where} is not valid Unicode (it holds a lone surrogate)")
    return value


def _number(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


def check_options(options: RewardOptions) -> None:
    """Refuse options under which ``/get_reward`` could answer a null reward: OpenRLHF, its only client, wraps each
    reward in ``torch.tensor([reward])`` outside any error handling, so a null (``empty_score`` None, for an empty or
    unreadable reply) ends the run. ``/score`` is unaffected: ``RemotePMIReward`` applies its own ``empty_score``
    (None included) on the trainer's side, so the server's never reaches it."""
    if options.empty_score is None:
        raise ValueError(
            "empty_score None: /get_reward would answer null rewards for empty or unreadable replies, and OpenRLHF "
            "cannot take a null (torch.tensor([None]) fails and ends the run); give a number (e.g. --empty_score -5). "
            "RemotePMIReward (TRL) sets its own empty_score, None included, on the trainer's side"
        )


class Endpoints:
    """The routes' answers for one scorer (scored through ``batcher``) under one set of reward options."""

    def __init__(self, batcher: MicroBatcher, config: ServerConfig, options: RewardOptions) -> None:
        self.batcher, self.config = batcher, config
        self.path = RewardPath(options)
        # /score's reading: the server's (turns, reasoning, max_chars), as /rerank reads a string context and its
        # candidate; a pair's response is a whole reply, never the rest of a think block its prompt opened (there is
        # no prompt to tell, and RemotePMIReward sends answers it already took out of their block: read as opened,
        # every one would be unfinished reasoning). Centring and the length baseline shape rewards, which /score
        # does not: off here, so that its reading does no work for them
        self.pair_path = RewardPath(replace(options, think_opened=False, center="none", length_baseline=None))
        self._warned_group = False

    @property
    def options(self) -> RewardOptions:
        return self.path.options

    def _scorer(
        self, deadline: float | None, alive: Callable[[], bool] | None = None
    ) -> Callable[[list[str], list[str]], np.ndarray]:
        """Scores pairs through the batcher by ``deadline`` (``time.monotonic()``; default: ``request_timeout`` from
        now), or raises ``ScoreTimeout``: a request's time limit runs from its arrival, not from its scoring."""
        limit = self.config.request_timeout
        if deadline is None:
            deadline = time.monotonic() + limit

        def score(contexts: list[str], responses: list[str]) -> np.ndarray:
            if not contexts:
                return np.zeros(0)
            left = deadline - time.monotonic()
            if left <= 0:
                raise ScoreTimeout(f"not scored within {limit:g} s (reading and parsing the request took it all)")
            try:
                return self.batcher.score(contexts, responses, timeout=left, alive=alive)
            except ScoreTimeout:
                raise ScoreTimeout(f"not scored within {limit:g} s (queue: {self.batcher.queued} requests)") from None

        return score

    def score_pairs(self, body: dict, deadline: float | None = None, alive: Callable[[], bool] | None = None) -> dict:
        """``{"pairs": [{"context", "response"}, ...], "as_given": bool?}`` -> ``{"scores": [...]}`` (raw PMI; null
        if unscorable).

        Each pair is read as ``pmi-reward score`` reads a row and ``PMIReward`` a string prompt and its completion
        (``RewardPath.texts``, under the server's ``--max_context_turns``, ``--strip_think`` and ``--max_chars``): the
        context's newest turns (lines) without reasoning, the reply after its last ``</think>``; null for a pair with
        no readable context (blank) or no visible reply, as those paths give. Read once already
        (``RemotePMIReward``'s texts, built under the same settings), a pair reads the same again. ``as_given``: only
        the ``max_chars`` cut (contexts keep their last, responses their first characters), null for a response
        with nothing visible in it; for a client that reads its texts itself under other settings."""
        pairs = _list(body, "pairs", self.config.max_pairs)
        as_given = body.get("as_given", False)
        if not isinstance(as_given, bool):
            raise ApiError(422, f"'as_given' must be true or false, got {type_name(as_given)}")
        contexts, responses = [], []
        for i, pair in enumerate(pairs):
            if not isinstance(pair, dict):
                raise ApiError(
                    422, f"pairs[{i}] must be an object with 'context' and 'response', got {type_name(pair)}"
                )
            contexts.append(_text(pair.get("context"), f"pairs[{i}].context"))
            responses.append(_text(pair.get("response"), f"pairs[{i}].response"))
        score = self._scorer(deadline, alive)
        if as_given:
            scores = self._as_given(contexts, responses, score)
        else:
            _, scores = self.pair_path.measure(contexts, responses, score)
        return {"scores": [_number(s) for s in scores]}

    def _as_given(
        self, contexts: list[str], responses: list[str], score: Callable[[list[str], list[str]], np.ndarray]
    ) -> np.ndarray:
        """Raw PMI of pairs as sent, cut to ``max_chars`` only; NaN where the response shows nothing."""
        limit = self.options.max_chars
        shown = [i for i, r in enumerate(responses) if visible(cut_reply(r, limit))]
        scores = np.full(len(responses), np.nan)
        scores[shown] = score(
            [cut_context(contexts[i], limit) for i in shown], [cut_reply(responses[i], limit) for i in shown]
        )
        return scores

    def rerank(self, body: dict, deadline: float | None = None, alive: Callable[[], bool] | None = None) -> dict:
        """``{"context": str | messages, "candidates": [...], "top_k": int?}`` -> candidates best first."""
        context = body.get("context")
        if not isinstance(context, (str, list)):
            raise ApiError(422, f"'context' must be a string or a list of chat messages, got {type_name(context)}")
        candidates = _list(body, "candidates", self.config.max_pairs)
        for i, c in enumerate(candidates):
            if not isinstance(c, (str, list)):
                raise ApiError(422, f"candidates[{i}] must be a string or a list of chat messages, got {type_name(c)}")
        top_k = body.get("top_k")
        if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
            raise ApiError(422, f"'top_k' must be a positive integer, got {top_k!r}")
        batch, raw = self.path.measure([context] * len(candidates), candidates, self._scorer(deadline, alive))
        replies = batch.replies
        ranked = [{"index": i, "response": replies[i], "score": _number(raw[i])} for i in ranking(raw.tolist())]
        return {"ranked": ranked[:top_k] if top_k else ranked, "scores": [_number(s) for s in raw]}

    def get_reward(self, body: dict, deadline: float | None = None, alive: Callable[[], bool] | None = None) -> dict:
        """OpenRLHF's ``{"query", "prompts", "labels"}`` -> ``{"rewards", "scores", "extra_logs"}``.

        ``rewards`` are shaped by the server's options; ``scores`` (OpenRLHF's 0-1 value for dynamic filtering)
        are sigmoid(PMI), the probability that the pair is a real one rather than a random match; ``labels``
        are not needed and ignored."""
        queries = _list(body, "query", self.config.max_pairs)
        prompts = _optional_list(body, "prompts", self.config.max_pairs)
        labels = _optional_list(body, "labels", self.config.max_pairs)
        for key, other in (("prompts", prompts), ("labels", labels)):
            if other is not None and len(other) != len(queries):
                raise ApiError(422, f"'query' holds {len(queries)} items but {key!r} holds {len(other)}")
        contexts: list[Any] = []
        replies: list[Any] = []
        for i, query in enumerate(queries):
            query = _text(query, f"query[{i}]")
            prompt = _optional_text(prompts[i], f"prompts[{i}]") if prompts is not None else None
            split = split_query(query, prompt, self.options.max_chars)  # cut before parsing
            contexts.append(split[0] if split else None)
            replies.append(split[1] if split else None)
        try:
            # a group is a prompt's samples: the prompt given, else the context scored (a query parsed alone is cut
            # to a window that depends on its reply's length, so its parsed prompt differs from reply to reply)
            group_by = list(prompts) if prompts is not None else [None] * len(queries)
            result = self.path.run(contexts, replies, self._scorer(deadline, alive), group_by=group_by)
        except GroupError as err:
            self._warn_group(err)
            raise ApiError(422, f"this server runs with --center group: {err}") from None
        raw = result.raw
        scored = np.isfinite(raw)
        sigmoid = np.where(scored, 1 / (1 + np.exp(-np.nan_to_num(raw))), 0.0)
        no_context = np.zeros(len(raw))
        no_context[result.batch.no_context] = 1.0
        return {
            "rewards": result.rewards,
            "scores": sigmoid.tolist(),
            "extra_logs": {
                "pmi_raw": np.where(scored, raw, 0.0).tolist(),
                "pmi_scored": scored.astype(float).tolist(),
                "pmi_no_context": no_context.tolist(),
            },
        }

    def _warn_group(self, err: GroupError) -> None:
        """The refusal in the server's log too (OpenRLHF logs only the status of a failed request)."""
        logger.log(logging.DEBUG if self._warned_group else logging.WARNING, "/get_reward refused: %s", err)
        self._warned_group = True

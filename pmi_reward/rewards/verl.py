"""PMIScore as verl's ``custom_reward_function``: ``compute_score`` (one response) and ``compute_score_batch``.

verl hands a reward function the decoded response (``solution_str``) and the dataset row's ``extra_info``;
a PMI reward needs the conversation the response answers, so each row must carry it in ``extra_info``
under ``context`` (a string, one turn per line), ``messages`` or ``prompt`` (chat messages or a string) or
``history`` (a list of turn strings). ``ground_truth`` is not needed and ignored. Where the score comes
from is set through ``custom_reward_function.reward_kwargs`` (or the environment): ``url`` of a
``pmi-reward serve`` server (``$PMI_REWARD_URL``) or ``scorer``, a saved scorer directory loaded once per
worker (``$PMI_REWARD_SCORER``); every other ``RewardOptions`` field (``center``, ``scale``, ``clip``,
``empty_score``, ...) may be given there too. Either way the rewards come from the one reward path
(``pmi_reward.rewards.path``), as ``PMIReward``'s do. verl loads this file by path under another module name,
so it imports the library by absolute name. ``docs/serving.md`` has the config.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping, Sequence
from typing import Any, cast

import numpy as np

from pmi_reward.data.conversation import clean_reply
from pmi_reward.data.pairs import join_turns
from pmi_reward.rewards.options import RewardOptions
from pmi_reward.rewards.remote import RemotePMIReward
from pmi_reward.rewards.reward import PMIReward

__all__ = ["compute_score", "compute_score_batch", "context_of"]

CONTEXT_KEYS = ("context", "messages", "prompt", "history")
_OPTIONS = set(RewardOptions.__dataclass_fields__)


def _plain(value: Any) -> Any:
    """Lists and dicts as Python objects (parquet rows come back holding numpy arrays)."""
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def context_of(extra_info: Any) -> Any:
    """The conversation a response answers, from a row's ``extra_info`` (None when it holds none)."""
    if not isinstance(extra_info, Mapping):
        return None
    for key in CONTEXT_KEYS:
        value = _plain(extra_info.get(key))
        if isinstance(value, list) and value and all(isinstance(t, str) for t in value):
            return join_turns(value)
        if value is not None:
            return value
    return None


@functools.lru_cache(maxsize=8)
def _reward(
    url: str | None, scorer: str | None, device: str | None, options: tuple[tuple[str, Any], ...]
) -> PMIReward | RemotePMIReward:
    opts = RewardOptions(**dict(options))
    if url:
        return RemotePMIReward(url, opts, on_failure="raise")
    return PMIReward.from_pretrained(scorer or "", device=device, options=opts)


def _settings(kwargs: dict) -> tuple:
    url = kwargs.get("url") or os.environ.get("PMI_REWARD_URL")
    scorer = kwargs.get("scorer") or os.environ.get("PMI_REWARD_SCORER")
    if bool(url) == bool(scorer):
        raise ValueError(
            "pmi_reward verl: give exactly one of url (a `pmi-reward serve` server) or scorer (a saved "
            "scorer directory), in custom_reward_function.reward_kwargs or as $PMI_REWARD_URL / "
            "$PMI_REWARD_SCORER"
        )
    options = {k: v for k, v in kwargs.items() if k in _OPTIONS}
    if "empty_score" in options and options["empty_score"] is None:
        raise ValueError("pmi_reward verl: verl needs a number for every response; empty_score cannot be None")
    return url, scorer, kwargs.get("device"), tuple(sorted(options.items()))


def compute_score_batch(
    data_sources: Sequence[Any],
    solution_strs: Sequence[str],
    ground_truths: Sequence[Any],
    extra_infos: Sequence[Any] | None = None,
    **kwargs: Any,
) -> list[float]:
    """PMI rewards of a batch of responses (verl's ``batch`` reward manager); contexts from ``extra_infos``."""
    reward = _reward(*_settings(kwargs))
    responses = [clean_reply(s) if isinstance(s, str) else s for s in solution_strs]
    infos = list(extra_infos) if extra_infos is not None else [None] * len(responses)
    if len(infos) != len(responses):
        raise ValueError(f"pmi_reward verl: {len(responses)} responses but {len(infos)} extra_infos")
    contexts = [context_of(info) for info in infos]
    out = reward.score_sync(contexts, responses) if isinstance(reward, RemotePMIReward) else reward(contexts, responses)
    return [float(cast(float, x)) for x in out]  # empty_score is a number (see _settings): no reward is None


def compute_score(
    data_source: Any, solution_str: str, ground_truth: Any, extra_info: Any = None, **kwargs: Any
) -> float:
    """PMI reward of one response (verl's default ``naive`` reward manager)."""
    return compute_score_batch([data_source], [solution_str], [ground_truth], [extra_info], **kwargs)[0]

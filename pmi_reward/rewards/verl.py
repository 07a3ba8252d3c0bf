"""PMIScore as verl's ``custom_reward_function``: ``compute_score`` (one response) and ``compute_score_batch``.

``compute_score`` is what verl >= 0.7's reward loop (the default, ``reward_model.use_reward_loop: true``) and the
legacy ``naive`` manager call, one response per call (the reward loop from a thread pool, so it is thread-safe, and
an in-process scorer merges the calls that come at once into shared scorer calls: ``MergedReward``);
``compute_score_batch`` is for the legacy ``batch`` manager (``use_reward_loop: false``), which passes numpy
object arrays. verl hands a reward function the decoded response (``solution_str``) and ``extra_info``; a PMI
reward needs the conversation the response answers, read from ``extra_info``: ``context`` (a string, one turn per
line), ``messages`` or ``prompt`` (chat messages or a string) or ``history`` (a list of turn strings) when the
dataset row puts one there, else ``raw_prompt``, which verl >= 0.7's reward loop adds by itself when the agent loop
scores each sample (no colocated reward model): the agent loop keeps the row's prompt messages (the dataset's
``prompt`` column) as ``extra_fields["raw_prompt"]`` (``verl/experimental/agent_loop/agent_loop.py``) and the reward
loop's ``naive``, ``rate_limited`` and ``remote`` managers merge those fields into ``extra_info``
(``verl/experimental/reward_loop/reward_manager/naive.py``), so verl's standard data layout needs no copy. Elsewhere
(``dapo``, the legacy managers) the row must carry its conversation. A row without any, or whose conversation
holds no readable user or assistant turn (system only, an image alone), gets ``empty_score``, a warning in the log
and ``pmi_no_context = 1`` in the result, which verl keeps per sample (its validation metrics and rollout dumps;
not its training step's metrics). Results are dicts (``score`` plus that flag), which every verl manager reads but
the legacy ``prime`` (it reads ``result[0]``). ``ground_truth`` is not needed and ignored. Where the score comes
from is set through ``custom_reward_function.reward_kwargs`` (or, when they name neither, the environment): ``url`` of a
``pmi-reward serve`` server (``$PMI_REWARD_URL``) or ``scorer``, a saved scorer directory or Hub repo id loaded
once per worker (``$PMI_REWARD_SCORER``; ``device``, ``backend``, ``quantize`` and ``dtype`` choose how it runs,
``cache_dir`` an embedding cache for it (a folder that grows for the whole run), ``revision``, ``token``,
``hub_cache_dir`` and ``local_files_only`` which Hub copy it is; better ``$HF_TOKEN`` in the workers' environment
than ``token`` here: verl prints its config at start);
every other ``RewardOptions`` field (``center``, ``scale``, ``clip``, ``empty_score``, ...) may be given there too,
and ``api_key`` for a server that requires one (better: ``$PMI_REWARD_API_KEY`` in the workers' environment, out
of the config files). Any other key is ignored with a warning naming it (a misspelling; not an error, so that a
keyword a later verl passes does not stop a run), except those verl passes itself (``reward_router_address``, ...).
Either way the rewards come from the one reward path (``pmi_reward.rewards.path``), as ``PMIReward``'s do;
``center: group`` needs a whole group per call, so it works with ``compute_score_batch`` only and is refused with a
clear error by ``compute_score``. verl loads this file by path (or as ``pkg://pmi_reward.rewards.verl``), so it
imports the library by absolute name. ``docs/serving.md`` has the configs.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
import threading
import weakref
from collections.abc import Mapping, Sequence
from typing import Any, cast

import numpy as np

from pmi_reward.data.conversation import clean_reply, parse_chat, templated_prompt
from pmi_reward.data.pairs import join_turns
from pmi_reward.rewards.batching import MicroBatcher
from pmi_reward.rewards.options import RewardOptions
from pmi_reward.rewards.path import Rewards, plain
from pmi_reward.rewards.remote import RemotePMIReward, api_key_from_env, run_sync
from pmi_reward.rewards.reward import PMIReward
from pmi_reward.scoring.encoder import RUNTIME_FIELDS
from pmi_reward.scoring.scorer import HUB_OPTIONS, PMIScorer

__all__ = ["compute_score", "compute_score_batch", "context_of", "MergedReward"]

Result = dict[str, float]

logger = logging.getLogger("pmi_reward.rewards.verl")  # by name: verl may load this file as another module

CONTEXT_KEYS = ("context", "messages", "prompt", "history")
# verl >= 0.7's reward loop puts the row's prompt messages in extra_info under this key (agent_loop.py
# ``_agent_loop_postprocess``: ``output.extra_fields["raw_prompt"] = kwargs["raw_prompt"]``; reward_loop/
# reward_manager/naive.py ``run_single``: ``extra_info.update(tool_extra_fields.items())``); read after CONTEXT_KEYS
RAW_PROMPT_KEY = "raw_prompt"
_OPTIONS = set(RewardOptions.__dataclass_fields__)
# how a scorer is loaded (PMIScorer.from_pretrained's keywords): the runtime, the Hub copy and the embedding cache
_LOADING_KEYS = (*RUNTIME_FIELDS, *HUB_OPTIONS, "cache_dir")
# what _settings reads besides the RewardOptions fields
_SETTINGS = {"url", "scorer", "device", "api_key", *_LOADING_KEYS}
# keywords verl itself adds to a reward function's call (verl @ b178a3c): the reward loop's managers pass
# reward_router_address and reward_model_tokenizer when a reward model's router runs (reward_loop/reward_manager/
# naive.py, limited.py, dapo.py); strict_box_verify is a keyword of verl's own math_dapo scorer that DAPO configs
# may set in reward_kwargs; the legacy batch manager passes on
# reward_model.reward_kwargs, which DAPO recipes fill with overlong_buffer_cfg and max_resp_len. The call's own
# arguments (data_source, solution_str, ...) are listed too, should a manager pass them by keyword to the other
# function. None of them is a misspelt setting.
_VERL_KEYWORDS = {
    "data_source",
    "solution_str",
    "ground_truth",
    "extra_info",
    "data_sources",
    "solution_strs",
    "ground_truths",
    "extra_infos",
    "reward_router_address",
    "reward_model_tokenizer",
    "strict_box_verify",
    "overlong_buffer_cfg",
    "max_resp_len",
}
_KNOWN = _OPTIONS | _SETTINGS | _VERL_KEYWORDS
_unknown_warned: set[str] = set()


def _conversation(value: Any) -> Any:
    """A conversation field as the reward reads it (a list of turn strings joined one per line), or None when it
    is empty and holds none."""
    value = plain(value)
    if isinstance(value, list) and value and all(isinstance(t, str) for t in value):
        return join_turns(value)
    if value is None or (isinstance(value, str) and not value.strip()) or (isinstance(value, list) and not value):
        return None
    return value


def context_of(extra_info: Any) -> Any:
    """The conversation a response answers, from ``extra_info`` (None when it holds none): the first non-empty of
    ``CONTEXT_KEYS`` (what the dataset row carries), else verl >= 0.7's ``raw_prompt``. ``raw_prompt`` is the row's
    chat messages (verl's ``RLHFDataset._build_messages``, a list or numpy array of ``{role, content}`` dicts, content
    a string or text/image parts), returned as messages: the reward path reads them as any prompt (system messages
    only with ``include_system``). A string there is parsed as a chat-templated prompt when it is one."""
    if not isinstance(extra_info, Mapping):
        return None
    for key in CONTEXT_KEYS:
        value = _conversation(extra_info.get(key))
        if value is not None:  # an empty field holds no conversation: the next key may
            return value
    raw = plain(extra_info.get(RAW_PROMPT_KEY))
    if isinstance(raw, str) and raw.strip():  # a chat-templated one is read by the reward path (``read_prompt``),
        return raw if templated_prompt(raw) is not None else parse_chat(raw) or raw  # its opened <think> seen too
    return _conversation(raw)


_LOADING = threading.Lock()
_RESTARTING = threading.Lock()  # a forked child's first calls start one batcher of their own


def _fresh_locks() -> None:
    """New locks in a forked child: one held by another thread of the parent at the fork would stay held."""
    global _LOADING, _RESTARTING
    _LOADING, _RESTARTING = threading.Lock(), threading.Lock()


os.register_at_fork(after_in_child=_fresh_locks)
# how long the merging worker, once free, waits for more calls (ms), as the server's default; the legacy naive
# manager, one call at a time, pays it on every call (benchmarks/verl_merge.py times both; benchmarks/RESULTS.md)
MERGE_WAIT_MS = 2.0


class MergedReward(PMIReward):
    """``PMIReward`` whose scoring step goes through a ``MicroBatcher`` (the server's): verl's reward loop calls
    ``compute_score`` once per response from a thread pool, and ``PMIReward``'s lock made those calls take turns, one
    pair per scorer call, so the G responses of a prompt each embedded its context (and line features) again. The
    batcher's one worker thread owns the scorer and merges the calls waiting into one scorer call of up to
    ``batch_size`` pairs (as ``PMIReward`` bounds its calls; no bound in characters), in which the scorer embeds
    each distinct context once. The scores are ``PMIReward``'s up to float32 noise (a text's embedding can move in
    its last bits with the other texts of its encoder batch); a failed merged call is scored again call by call,
    then pair by pair (``score_robustly``). A process forked after a call, or during one (the fork waits for the
    tokenization or cache access in flight: ``scoring/forking.py``), starts a batcher of its own."""

    def __init__(self, scorer: PMIScorer, options: RewardOptions | None = None, **kwargs: Any) -> None:
        super().__init__(scorer, options, **kwargs)
        self._start_batcher()

    def _start_batcher(self) -> None:
        self._pid = os.getpid()
        self.batcher = MicroBatcher(
            self.scorer, max_batch_pairs=self.options.batch_size, max_wait_ms=MERGE_WAIT_MS, max_batch_chars=sys.maxsize
        )
        # its worker thread stops once the reward is gone (the settings' cache let it go); at exit it is a daemon
        weakref.finalize(self, self.batcher.close).atexit = False

    def _score(self, contexts: list[str], replies: list[str]) -> np.ndarray:
        """Raw PMI of the readable pairs, scored with the pairs of the calls that wait at the same time."""
        if self._pid != os.getpid():  # a forked child (a Pool after a first call): its parent's worker is not here,
            with _RESTARTING:  # and a job queued for it waited forever
                if self._pid != os.getpid():
                    self._start_batcher()
        return self.batcher.score(contexts, replies)

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        self._start_batcher()


def _reward(*settings: Any) -> PMIReward | RemotePMIReward:
    """The reward of these settings, loaded once: verl's reward loop calls from up to 32 threads at once, and an
    unguarded cache miss loaded one scorer per thread (N copies on the device)."""
    with _LOADING:
        return _load_reward(*settings)


@functools.lru_cache(maxsize=8)
def _load_reward(
    url: str | None,
    scorer: str | None,
    device: str | None,
    options: tuple[tuple[str, Any], ...],
    runtime: tuple[tuple[str, Any], ...] = (),
    api_key: str | None = None,
) -> PMIReward | RemotePMIReward:
    opts = RewardOptions(**dict(options))
    if url:
        return RemotePMIReward(url, opts, on_failure="raise", api_key=api_key)
    return MergedReward(PMIScorer.from_pretrained(scorer or "", device=device, **dict(runtime)), opts)


def _settings(kwargs: dict) -> tuple:
    url, scorer = kwargs.get("url"), kwargs.get("scorer")
    where = "custom_reward_function.reward_kwargs"
    if not (url or scorer):  # reward_kwargs win: $PMI_REWARD_URL may be set on the same workers for OpenRLHF's shim
        url, scorer = os.environ.get("PMI_REWARD_URL"), os.environ.get("PMI_REWARD_SCORER")
        where = "the environment ($PMI_REWARD_URL, $PMI_REWARD_SCORER)"
    if bool(url) == bool(scorer):
        raise ValueError(
            "pmi_reward verl: give exactly one of url (a `pmi-reward serve` server) or scorer (a saved scorer "
            f"directory), in custom_reward_function.reward_kwargs or as $PMI_REWARD_URL / $PMI_REWARD_SCORER; "
            f"{where} gave {'both' if url else 'neither'}"
        )
    _warn_unknown(kwargs)
    options = {k: v for k, v in kwargs.items() if k in _OPTIONS}
    if "empty_score" in options and options["empty_score"] is None:
        raise ValueError("pmi_reward verl: verl needs a number for every response; empty_score cannot be None")
    runtime = {k: v for k, v in kwargs.items() if k in _LOADING_KEYS and v is not None}
    return (
        url,
        scorer,
        kwargs.get("device"),
        tuple(sorted(options.items())),
        tuple(sorted(runtime.items())),
        api_key_from_env(kwargs.get("api_key")),
    )


def _warn_unknown(kwargs: Mapping[str, Any]) -> None:
    """A warning, once per key, for keywords that are neither a setting of this adapter nor one verl passes: a
    misspelt ``reward_kwargs`` key (``emtpy_score``, ``centre``) was ignored without a word. Not an error, so that a
    keyword a later verl adds does not stop a run."""
    unknown = sorted(k for k in kwargs if k not in _KNOWN and k not in _unknown_warned)
    if not unknown:
        return
    _unknown_warned.update(unknown)
    logger.warning(
        "pmi_reward verl: ignoring unknown keyword(s) %s (misspelt in custom_reward_function.reward_kwargs?); the "
        "adapter reads %s and the RewardOptions fields %s",
        ", ".join(map(repr, unknown)),
        ", ".join(sorted(_SETTINGS)),
        ", ".join(sorted(_OPTIONS)),
    )


def compute_score_batch(
    data_sources: Sequence[Any],
    solution_strs: Sequence[str],
    ground_truths: Sequence[Any],
    extra_infos: Sequence[Any] | None = None,
    **kwargs: Any,
) -> list[Result]:
    """PMI rewards of a batch of responses (verl's legacy ``batch`` reward manager); contexts from ``extra_infos``.
    Each result is ``{"score": reward, "pmi_no_context": 1.0 if the row held no readable conversation else 0.0}``:
    as the reward path reads it, so a conversation of no user or assistant turn (system only, an image alone) or
    of text no tokenizer can encode (a lone surrogate) counts, as it gets ``empty_score`` too."""
    reward = _reward(*_settings(kwargs))
    responses = [clean_reply(s) if isinstance(s, str) else s for s in solution_strs]
    infos = list(extra_infos) if extra_infos is not None else [None] * len(responses)
    if len(infos) != len(responses):
        raise ValueError(f"pmi_reward verl: {len(responses)} responses but {len(infos)} extra_infos")
    contexts = [context_of(info) for info in infos]
    result = _rewards(reward, contexts, responses)
    # the samples the path found no context in, from the texts the rewards were computed from (a remote reward
    # builds them after learning max_context_turns from the server)
    missing = set(result.batch.no_context)
    if missing:
        _warn_missing(infos[min(missing)], len(missing), len(infos))
    return [  # empty_score is a number (see _settings): no reward is None
        {"score": float(cast(float, x)), "pmi_no_context": float(i in missing)} for i, x in enumerate(result.rewards)
    ]


def _rewards(reward: PMIReward | RemotePMIReward, contexts: list[Any], responses: list[Any]) -> Rewards:
    """One pass down the reward path: the rewards with the texts they were computed from, which the flags read
    (building the texts again for them read and cut every context and reply twice, a share of each call on CPU)."""
    if isinstance(reward, RemotePMIReward):
        return run_sync(reward.run_remote(contexts, responses))  # errors raise: the reward was made on_failure="raise"
    # PMIReward's call, less its seconds counter (unread here); a MergedReward's scoring step merges concurrent calls
    return reward.run(contexts, responses, reward._score)


def compute_score(
    data_source: Any, solution_str: str, ground_truth: Any, extra_info: Any = None, **kwargs: Any
) -> Result:
    """PMI reward of one response (verl's reward loop and legacy ``naive`` manager): ``{"score", "pmi_no_context"}``."""
    return compute_score_batch([data_source], [solution_str], [ground_truth], [extra_info], **kwargs)[0]


_warned: list[bool] = []  # one entry once the warning has been given


def _warn_missing(info: Any, n: int, total: int) -> None:
    """A warning the first time rows come without a readable conversation (then at debug level)."""
    keys = sorted(info) if isinstance(info, Mapping) else type(info).__name__
    logger.log(
        logging.DEBUG if _warned else logging.WARNING,
        "pmi_reward verl: %d of %d responses come without a readable conversation in extra_info (a user or "
        "assistant turn of text under one of %s; this row has %s); they get empty_score. Put the prompt's "
        "conversation in each row's extra_info (verl >= 0.7's reward loop adds raw_prompt by itself; the legacy "
        "managers and the reward loop's dapo manager do not).",
        n,
        total,
        "/".join((*CONTEXT_KEYS, RAW_PROMPT_KEY)),
        keys,
    )
    if not _warned:
        _warned.append(True)

"""``PMIReward``: a trained PMIScorer as a TRL reward function (GRPO, RLOO, Online DPO, our PPO).

A plain callable with TRL's signature, not an ``nn.Module`` (TRL would take a module for a
sequence-classification model). Each distinct context in a call is encoded once, so a GRPO group of G
completions for one prompt costs one context encoding plus G response encodings. Calls from several threads
(verl's reward loop runs reward functions in a thread pool) take turns on the scorer: a tokenizer is not
safe to share between threads.
"""

from __future__ import annotations

import sqlite3
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from typing_extensions import Unpack

from ..scoring.cache import EmbeddingCache
from ..scoring.encoder import RUNTIME_FIELDS, RuntimeKwargs, missing_device
from ..scoring.forking import hold_across_fork
from ..scoring.scorer import DEFAULT_SCORER, HUB_OPTIONS, HubKwargs, PMIScorer
from .length import LengthBaseline
from .options import RewardOptions, RewardOptionsKwargs
from .path import RewardPath, score_robustly
from .remote import RemoteKwargs, RemotePMIReward

__all__ = ["PMIReward", "PretrainedRewardKwargs"]

_LOADING = (*HUB_OPTIONS, "cache_dir")  # PMIScorer.from_pretrained's


class PretrainedRewardKwargs(RewardOptionsKwargs, HubKwargs, RuntimeKwargs, total=False):
    """``PMIReward.from_pretrained``'s keyword options, typed for a checker (PEP 692's ``Unpack``): the reward's
    (``RewardOptions``' fields) and the loading ones it passes on to ``PMIScorer.from_pretrained`` (``_LOADING``
    and ``RUNTIME_FIELDS``). A test holds its keys equal to those."""

    cache_dir: str | Path | None


class PMIReward(RewardPath):
    """``reward(prompts, completions, completion_ids=None, **kwargs) -> list[float | None]``."""

    # declared here as well as set in RewardPath.__init__: ``__setstate__`` assigns it from the pickled state (a
    # plain dict), which would otherwise leave its type unknown to a checker that infers it (pyright)
    length_baseline: LengthBaseline | None

    def __init__(
        self, scorer: PMIScorer, options: RewardOptions | None = None, **kwargs: Unpack[RewardOptionsKwargs]
    ) -> None:
        if options is not None and kwargs:
            raise TypeError("pass either options or keyword options, not both")
        super().__init__((options or RewardOptions(**kwargs)).resolved(scorer.context_turns))
        self.scorer = scorer
        self.seconds = 0.0  # wall time spent inside calls (a trainer reports the reward's share of a step)
        self._lock = threading.Lock()
        hold_across_fork(self, "_lock", threading.Lock, hold=False)  # a forked child's calls do not wait for ever

    @staticmethod
    def remote(url: str, options: RewardOptions | None = None, **kwargs: Unpack[RemoteKwargs]) -> RemotePMIReward:
        """The same reward computed by a ``pmi-reward serve`` server at ``url`` (an async TRL reward callable)."""
        return RemotePMIReward(url, options, **kwargs)

    @classmethod
    def from_pretrained(
        cls,
        scorer_dir: str | Path = DEFAULT_SCORER,
        device: str | torch.device | None = None,
        options: RewardOptions | None = None,
        **kwargs: Unpack[PretrainedRewardKwargs],
    ) -> PMIReward:
        """Load a saved scorer as a reward; by default the recommended scorer that `make scorer` trains. Keywords
        are the reward's options (``RewardOptions``; or ``options``) and ``PMIScorer.from_pretrained``'s own (a Hub
        id's ``revision``, ``token``, ``hub_cache_dir``, ``local_files_only``; the embedding ``cache_dir``; the
        encoder's runtime: ``backend``, ``quantize``, ``dtype``, ``encode_batch_size``), checked before it loads."""
        rest: dict[str, Any] = dict(kwargs)  # a plain dict: a checker allows no pop of a computed key on a TypedDict
        loading = {k: rest.pop(k) for k in (*_LOADING, *RUNTIME_FIELDS) if k in rest}
        bad = sorted(set(rest) - {f.name for f in fields(RewardOptions)})
        if bad:
            raise TypeError(
                f"PMIReward.from_pretrained: unexpected arguments {bad}; loading takes {[*_LOADING, *RUNTIME_FIELDS]}, "
                f"the reward's options are RewardOptions' fields ({sorted(f.name for f in fields(RewardOptions))})"
            )
        if options is not None and rest:
            raise TypeError("pass either options or keyword options, not both")
        return cls(PMIScorer.from_pretrained(scorer_dir, device=device, **loading), options, **rest)

    # -- the TRL contract ---------------------------------------------------------------------------
    def __call__(
        self,
        prompts: Sequence[Any],
        completions: Sequence[Any],
        completion_ids: Any = None,
        log_metric: Callable[[str, float], None] | None = None,
        **kwargs: Any,
    ) -> list[float | None]:
        start = time.perf_counter()
        out = self.run(prompts, completions, self._score, log_metric).rewards
        elapsed = time.perf_counter() - start
        self.seconds += elapsed
        if log_metric is not None and len(out):
            log_metric(f"{self.__name__}/seconds", elapsed)
        return out

    def _score(self, contexts: list[str], replies: list[str]) -> np.ndarray:
        """Raw PMI of the readable pairs, ``batch_size`` pairs per scorer call."""
        size = self.options.batch_size
        with self._lock:
            parts = [
                score_robustly(self.scorer, contexts[s : s + size], replies[s : s + size])
                for s in range(0, len(replies), size)
            ]
        return np.concatenate(parts) if parts else np.zeros(0)

    # -- pickling (TRL may copy reward functions across processes) -------------------------------
    def __getstate__(self) -> dict:
        """The scorer as its config and numpy head weights, with what was chosen when it was loaded: the encoder's
        full runtime spec (backend, quantize, dtype, batch; config.json leaves the machine's choices out), its
        device, its embedding cache's directory and the dtype it was saved in; and the length baseline as loaded
        (its file's path may be relative to this process's folder, or the file refitted since)."""
        encoder = self.scorer.encoder
        head = {k: v.detach().cpu().numpy() for k, v in self.scorer.head.state_dict().items()}
        return {
            "options": asdict(self.options),
            "scorer_config": self.scorer.config(),
            "head": head,
            "metadata": self.scorer.metadata,
            "directory": str(self.scorer.directory) if self.scorer.directory is not None else None,
            # the spec it runs with, but a dtype asked as "auto" resolved again where it is rebuilt (bfloat16 here
            # may be an emulated, slow bfloat16 on a CPU without it)
            "encoder_spec": {
                **encoder.spec.to_dict(),
                **({"dtype": "auto"} if getattr(encoder, "requested_dtype", None) == "auto" else {}),
            },
            "device": str(encoder.device),
            "cache_dir": str(encoder.cache.path.parent.resolve()) if encoder.cache is not None else None,
            "saved_dtype": self.scorer.saved_dtype,
            "length_baseline": self.length_baseline,
        }

    def __setstate__(self, state: dict) -> None:
        config = state["scorer_config"]
        if state.get("encoder_spec") is not None:  # the spec it ran with, not only the saved one
            config = {**config, "encoder": state["encoder_spec"]}
        device, cache_dir = _device_here(state.get("device")), state.get("cache_dir")
        cache = None
        if cache_dir is not None:
            try:
                cache = EmbeddingCache(cache_dir)
            except (OSError, sqlite3.Error) as error:  # the cache's folder cannot be made or opened here
                warnings.warn(
                    f"PMIReward: embedding cache {cache_dir} unusable here ({error}); scoring without one", stacklevel=2
                )
        try:
            self.scorer = PMIScorer.from_config(
                config, state["head"], device, metadata=state.get("metadata"), directory=state.get("directory")
            )
        except BaseException:
            if cache is not None:
                cache.close()
            raise
        self.scorer.encoder.cache = cache
        self.scorer.saved_dtype = state.get("saved_dtype")
        options = RewardOptions(**state["options"])
        if "length_baseline" in state:  # the baseline it ran with, not the file its path names here
            RewardPath.__init__(self, replace(options, length_baseline=None))
            self.options, self.length_baseline = options, state["length_baseline"]
        else:
            RewardPath.__init__(self, options)
        self.seconds = 0.0
        self._lock = threading.Lock()
        hold_across_fork(self, "_lock", threading.Lock, hold=False)  # a forked child's calls do not wait for ever


def _device_here(device: str | None) -> str | None:
    """The device a pickled reward ran on, where this process has it (a CUDA index it has); else None (the default:
    a CPU-only worker (e.g. a Ray reward worker) of a run on a GPU machine still scores."""
    return device if device is None or missing_device(device) is None else None

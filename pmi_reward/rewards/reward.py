"""``PMIReward``: a trained PMIScorer as a TRL reward function (GRPO, RLOO, Online DPO, our PPO).

A plain callable with TRL's signature, not an ``nn.Module`` (TRL would take a module for a
sequence-classification model). Each distinct context in a call is encoded once, so a GRPO group of G
completions for one prompt costs one context encoding plus G response encodings.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..data.conversation import completion_to_text, prompt_to_context
from ..scoring.scorer import PMIScorer

__all__ = ["PMIReward", "RewardBatch", "RewardOptions", "RewardShaper", "readable", "score_robustly"]

logger = logging.getLogger(__name__)


@dataclass
class RewardOptions:
    """How raw PMI becomes a reward: raw -> minus baseline (``center``) -> times ``scale`` -> clipped.

    ``center``: "none" keeps raw PMI; "group" subtracts the mean over completions that share a context in
    the same call (a GRPO/RLOO group). ``empty_score`` is returned for empty, whitespace-only or unreadable
    completions (None hands TRL an unscorable sample, which gets zero advantage); it is not centred.
    """

    center: str = "none"
    scale: float = 1.0
    clip: float | None = None  # symmetric bound after scaling; None: the scorer's softcap bounds it
    empty_score: float | None = -5.0
    include_system: bool = False
    max_context_turns: int | None = None  # None: as the scorer was trained (else every turn)
    batch_size: int = 256
    max_chars: int = 100_000  # longer contexts keep their end, longer replies their start (bounds tokenizing time)
    name: str = "pmi_reward"

    def __post_init__(self) -> None:
        if self.center not in ("none", "group"):
            raise ValueError(f"center must be 'none' or 'group', got {self.center!r}")
        if not math.isfinite(self.scale):
            raise ValueError("scale must be finite")
        if self.clip is not None and not self.clip > 0:
            raise ValueError("clip must be positive")
        if self.empty_score is not None and not math.isfinite(self.empty_score):
            raise ValueError("empty_score must be finite or None")
        if self.batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        if self.max_chars < 1:
            raise ValueError("max_chars must be >= 1")


def score_robustly(scorer: PMIScorer, contexts: list[str], replies: list[str]) -> np.ndarray:
    """Scores of a batch; if the batch fails, pair by pair (NaN where a pair fails), so that one bad sample
    cannot sink the rest."""
    try:
        return scorer.score(contexts, replies).astype(np.float64)
    except Exception as err:  # noqa: BLE001 - a reward call must not crash a training run
        logger.warning("pmi_reward: batch of %d failed (%s); scoring pair by pair", len(replies), err)
    out = np.full(len(replies), np.nan)
    for j, (c, r) in enumerate(zip(contexts, replies)):
        try:
            out[j] = scorer.score([c], [r])[0]
        except Exception as err:  # noqa: BLE001
            logger.warning("pmi_reward: unscorable pair (%s)", err)
    return out


def readable(text: str) -> bool:
    """Whether ``text`` is valid Unicode (no lone surrogates, which no tokenizer can encode)."""
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


@dataclass
class RewardBatch:
    """One reward call's samples as scorer text: per-sample context and reply (None when unreadable) and the
    indices of the samples worth scoring."""

    contexts: list[str | None]
    replies: list[str | None]
    valid: list[int]

    def chunks(self, size: int) -> Iterator[tuple[list[int], list[str], list[str]]]:
        """(indices, contexts, replies) of the scorable samples, ``size`` at a time."""
        for s in range(0, len(self.valid), size):
            idx = self.valid[s:s + size]
            yield idx, [self.contexts[i] for i in idx], [self.replies[i] for i in idx]


class RewardShaper:
    """What a PMI reward does around the scorer: prompts and completions to text, raw PMI to rewards, metrics.

    Shared by the in-process ``PMIReward`` and the HTTP ``RemotePMIReward`` so that both return the same
    rewards for the same samples and options.
    """

    def __init__(self, options: RewardOptions) -> None:
        self.options = options
        self.__name__ = options.name

    def prepare(self, prompts: Sequence[Any], completions: Sequence[Any]) -> RewardBatch | None:
        """The samples as scorer text; None when prompts and completions differ in length (a caller bug that
        cannot be scored row by row)."""
        opts = self.options
        prompts, completions = list(prompts or []), list(completions or [])
        if len(prompts) != len(completions):
            return None
        contexts = [prompt_to_context(p, opts.include_system, opts.max_context_turns) for p in prompts]
        replies = [completion_to_text(c) for c in completions]
        contexts = [c[-opts.max_chars:] if c is not None and readable(c) else None for c in contexts]
        replies = [r.strip()[:opts.max_chars] if r is not None and readable(r) else None for r in replies]
        valid = [i for i, (c, r) in enumerate(zip(contexts, replies)) if c is not None and r]
        return RewardBatch(contexts, replies, valid)

    def empty(self, n: int) -> list[float | None]:
        return [self.options.empty_score] * n

    def finish(self, batch: RewardBatch, raw: np.ndarray,
               log_metric: Callable[[str, float], None] | None = None) -> list[float | None]:
        """Rewards from raw PMI (NaN where unscored): centred, scaled, clipped; ``empty_score`` for the rest."""
        opts = self.options
        rewards = self._shape(raw, batch.contexts)
        out = [float(r) if math.isfinite(r) else opts.empty_score for r in rewards]
        if log_metric is not None and len(raw):
            self._log(log_metric, raw, rewards, len(batch.valid))
        return out

    def _shape(self, raw: np.ndarray, contexts: list[str | None]) -> np.ndarray:
        opts = self.options
        shaped = raw.copy()
        if opts.center == "group":
            groups: dict[str, list[int]] = {}
            for i, c in enumerate(contexts):
                if c is not None and math.isfinite(raw[i]):
                    groups.setdefault(c, []).append(i)
            for members in groups.values():
                shaped[members] -= raw[members].mean()
        shaped *= opts.scale
        if opts.clip is not None:
            shaped = np.clip(shaped, -opts.clip, opts.clip)
        return shaped

    def _log(self, log_metric, raw: np.ndarray, rewards: np.ndarray, n_valid: int) -> None:
        name, n = self.__name__, len(raw)
        log_metric(f"{name}/empty_frac", 1.0 - n_valid / n)
        if n_valid:
            ok = np.isfinite(raw)
            log_metric(f"{name}/raw_pmi_mean", float(raw[ok].mean()))
            clipped = np.abs(rewards[ok]) >= self.options.clip if self.options.clip else np.zeros(n_valid, bool)
            log_metric(f"{name}/clipped_frac", float(clipped.mean()))


class PMIReward(RewardShaper):
    """``reward(prompts, completions, completion_ids=None, **kwargs) -> list[float | None]``."""

    def __init__(self, scorer: PMIScorer, options: RewardOptions | None = None, **kwargs: Any) -> None:
        if options is not None and kwargs:
            raise TypeError("pass either options or keyword options, not both")
        super().__init__(options or RewardOptions(**kwargs))
        self.scorer = scorer
        self.seconds = 0.0  # wall time spent inside calls (a trainer reports the reward's share of a step)
        if self.options.max_context_turns is None:
            self.options.max_context_turns = scorer.trained_context_turns

    @staticmethod
    def remote(url: str, options: RewardOptions | None = None, **kwargs: Any):
        """The same reward computed by a ``pmi-reward serve`` server at ``url`` (an async TRL reward callable)."""
        from .remote import RemotePMIReward

        return RemotePMIReward(url, options, **kwargs)

    @classmethod
    def from_pretrained(cls, scorer_dir: str | Path, device: str | None = None, **options: Any) -> "PMIReward":
        return cls(PMIScorer.from_pretrained(scorer_dir, device=device), RewardOptions(**options))

    # -- the TRL contract ---------------------------------------------------------------------------
    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], completion_ids: Any = None,
                 log_metric: Callable[[str, float], None] | None = None, **kwargs: Any) -> list[float | None]:
        start = time.perf_counter()
        batch = self.prepare(prompts, completions)
        if batch is None:
            return self.empty(len(list(completions or [])))
        raw = np.full(len(batch.contexts), np.nan, dtype=np.float64)
        for idx, contexts, replies in batch.chunks(self.options.batch_size):
            raw[idx] = self._score(contexts, replies)
        out = self.finish(batch, raw, log_metric)
        elapsed = time.perf_counter() - start
        self.seconds += elapsed
        if log_metric is not None and len(out):
            log_metric(f"{self.__name__}/seconds", elapsed)
        return out

    def _score(self, contexts: list[str], replies: list[str]) -> np.ndarray:
        return score_robustly(self.scorer, contexts, replies)

    # -- pickling (TRL may copy reward functions across processes) -------------------------------
    def __getstate__(self) -> dict:
        head = {k: v.detach().cpu().numpy() for k, v in self.scorer.head.state_dict().items()}
        return {"options": asdict(self.options), "scorer_config": self.scorer.config(), "head": head}

    def __setstate__(self, state: dict) -> None:
        self.scorer = PMIScorer.from_config(state["scorer_config"], state["head"])
        self.options = RewardOptions(**state["options"])
        self.__name__ = self.options.name
        self.seconds = 0.0

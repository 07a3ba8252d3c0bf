"""``PMIReward``: a trained PMIScorer as a TRL reward function (GRPO, RLOO, Online DPO, our PPO).

A plain callable with TRL's signature, not an ``nn.Module`` (TRL would take a module for a
sequence-classification model). Each distinct context in a call is encoded once, so a GRPO group of G
completions for one prompt costs one context encoding plus G response encodings.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .chat import completion_to_text, prompt_to_context
from .scorer import PMIScorer

__all__ = ["PMIReward", "RewardOptions"]

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


class PMIReward:
    """``reward(prompts, completions, completion_ids=None, **kwargs) -> list[float | None]``."""

    def __init__(self, scorer: PMIScorer, options: RewardOptions | None = None, **kwargs: Any) -> None:
        self.scorer = scorer
        self.options = options or RewardOptions(**kwargs)
        if options is not None and kwargs:
            raise TypeError("pass either options or keyword options, not both")
        self.__name__ = self.options.name
        self.seconds = 0.0  # wall time spent inside calls (a trainer reports the reward's share of a step)
        if self.options.max_context_turns is None:
            trained = (scorer.metadata.get("data") or {}).get("max_context_turns")
            self.options.max_context_turns = int(trained) if trained else None

    @classmethod
    def from_pretrained(cls, scorer_dir: str | Path, device: str | None = None, **options: Any) -> "PMIReward":
        return cls(PMIScorer.from_pretrained(scorer_dir, device=device), RewardOptions(**options))

    # -- the TRL contract ---------------------------------------------------------------------------
    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], completion_ids: Any = None,
                 log_metric: Callable[[str, float], None] | None = None, **kwargs: Any) -> list[float | None]:
        start = time.perf_counter()
        opts = self.options
        prompts, completions = list(prompts or []), list(completions or [])
        if len(prompts) != len(completions):
            # TRL always passes equal lengths; anything else is a caller bug we cannot score row by row
            return [opts.empty_score] * len(completions)
        contexts = [prompt_to_context(p, opts.include_system, opts.max_context_turns) for p in prompts]
        replies = [completion_to_text(c) for c in completions]
        valid = [i for i, (c, r) in enumerate(zip(contexts, replies)) if c is not None and r is not None and r.strip()]
        raw = np.full(len(prompts), np.nan, dtype=np.float64)
        for s in range(0, len(valid), opts.batch_size):
            idx = valid[s:s + opts.batch_size]
            raw[idx] = self._score([contexts[i] for i in idx], [replies[i].strip() for i in idx])
        rewards = self._shape(raw, contexts)
        out = [float(r) if math.isfinite(r) else opts.empty_score for r in rewards]
        elapsed = time.perf_counter() - start
        self.seconds += elapsed
        if log_metric is not None and len(prompts):
            self._log(log_metric, raw, rewards, len(valid))
            log_metric(f"{self.__name__}/seconds", elapsed)
        return out

    def _score(self, contexts: list[str], replies: list[str]) -> np.ndarray:
        """Scores of a batch; if the batch fails, pair by pair, so one bad sample cannot sink the rest."""
        try:
            return self.scorer.score(contexts, replies)
        except Exception as err:  # noqa: BLE001 - a reward call must not crash a training run
            logger.warning("pmi_reward: batch of %d failed (%s); scoring pair by pair", len(replies), err)
        out = np.full(len(replies), np.nan)
        for j, (c, r) in enumerate(zip(contexts, replies)):
            try:
                out[j] = self.scorer.score([c], [r])[0]
            except Exception as err:  # noqa: BLE001
                logger.warning("pmi_reward: unscorable pair (%s)", err)
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

    # -- pickling (TRL may copy reward functions across processes) -------------------------------
    def __getstate__(self) -> dict:
        head = {k: v.detach().cpu().numpy() for k, v in self.scorer.head.state_dict().items()}
        return {"options": asdict(self.options), "scorer_config": self.scorer.config(), "head": head}

    def __setstate__(self, state: dict) -> None:
        self.scorer = PMIScorer.from_config(state["scorer_config"], state["head"])
        self.options = RewardOptions(**state["options"])
        self.__name__ = self.options.name
        self.seconds = 0.0

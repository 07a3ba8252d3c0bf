"""Several TRL reward functions as one, summed with weights as TRL's GRPO/RLOO sum them: None from an extra function
counts as 0; None from the first (PMI: an unscorable reply) makes the sample unscorable, whatever the others say (an
unfinished or empty reply must not win a group of negative PMI on a penalty's 0). Our PPO, RFT and DPO use it."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from .remote import run_sync

__all__ = ["CombinedReward"]


class CombinedReward:
    """``reward(prompts, completions, **kwargs)``: the weighted sum of ``rewards``; ``seconds`` is the first
    (PMI) reward's wall time, ``rewards[0].options`` its options."""

    def __init__(self, rewards: list[Callable], weights: list[float] | None = None) -> None:
        if weights is not None and len(weights) != len(rewards):
            raise ValueError(f"got {len(weights)} reward_weights for {len(rewards)} reward functions")
        self.rewards, self.weights = rewards, weights or [1.0] * len(rewards)
        self.__name__ = "+".join(getattr(r, "__name__", type(r).__name__) for r in rewards)

    @property
    def seconds(self) -> float:
        return getattr(self.rewards[0], "seconds", 0.0)

    def __call__(self, prompts: list, completions: list, **kwargs: Any) -> list[float | None]:
        parts = [r(prompts=prompts, completions=completions, **kwargs) for r in self.rewards]
        parts = [run_sync(p) if inspect.isawaitable(p) else p for p in parts]  # TRL allows async reward functions
        for reward, part in zip(self.rewards, parts, strict=True):
            if part is None or len(part) != len(completions):
                size = "None" if part is None else f"{len(part)} values"
                raise ValueError(
                    f"reward function {getattr(reward, '__name__', type(reward).__name__)} returned {size} for "
                    f"{len(completions)} completions; each must return one value (or None) per completion"
                )
        out: list[float | None] = []
        for i in range(len(completions)):
            got = [(w, p[i]) for w, p in zip(self.weights, parts, strict=True) if p[i] is not None]
            out.append(sum(w * v for w, v in got) if got and parts[0][i] is not None else None)
        return out

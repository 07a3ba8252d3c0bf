"""Several TRL reward functions as one, summed with weights as TRL's GRPO/RLOO sum them: None from an extra function
counts as 0; None from the first (PMI: an unscorable reply) makes the sample unscorable, whatever the others say (an
unfinished or empty reply must not win a group of negative PMI on a penalty's 0). A NaN or infinite value counts as
None (TRL's nansum skips NaN; summed here it made the reward NaN). Our PPO, RFT and DPO use it."""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable, Sequence
from typing import Any

from .remote import run_sync

__all__ = ["CombinedReward", "reward_name", "check_reward_names"]


def reward_name(function: Callable) -> str:
    """The name TRL logs a reward function under (``trl.trainer.utils.get_callable_name``): a partial's function's,
    else its ``__name__``, else its class's name."""
    while isinstance(function, functools.partial):
        function = function.func
    return getattr(function, "__name__", type(function).__name__)


def check_reward_names(rewards: Sequence[Callable]) -> None:
    """Refuse reward functions that share a name: TRL keys its metrics and its completions table by name, so two
    with one name merged their metrics and crashed the table (``log_completions``)."""
    names = [reward_name(r) for r in rewards]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(
            f"reward functions must have distinct names (TRL logs each under its name), got {names}: {twice} "
            "more than once; rename one: PMIReward(..., name=...) or RewardOptions(name=...) (--name on the "
            "command line), name=... for FluencyPenalty, TruncationPenalty and DiversityReward, or set a "
            "function's __name__"
        )


def _finite(value: Any) -> bool:
    """Whether ``value`` is a score: not None, NaN or infinite (TRL treats NaN as None)."""
    return value is not None and math.isfinite(value)


class CombinedReward:
    """``reward(prompts, completions, **kwargs)``: the weighted sum of ``rewards``; ``seconds`` is the first
    (PMI) reward's wall time, ``rewards[0].options`` its options."""

    def __init__(self, rewards: list[Callable], weights: list[float] | None = None) -> None:
        if weights is not None and len(weights) != len(rewards):
            raise ValueError(f"got {len(weights)} reward_weights for {len(rewards)} reward functions")
        check_reward_names(rewards)
        self.rewards, self.weights = rewards, weights or [1.0] * len(rewards)
        self.__name__ = "+".join(reward_name(r) for r in rewards)

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
                    f"reward function {reward_name(reward)} returned {size} for "
                    f"{len(completions)} completions; each must return one value (or None) per completion"
                )
        out: list[float | None] = []
        for i in range(len(completions)):
            got = [(w, p[i]) for w, p in zip(self.weights, parts, strict=True) if _finite(p[i])]
            out.append(sum(w * v for w, v in got) if got and _finite(parts[0][i]) else None)
        return out

"""A penalty for completions cut at the token limit, as a TRL reward function beside PMI.

A completion whose ids do not end with an end-of-sequence (or pad) token ran into ``max_completion_length``:
its text is unfinished, and PMI would still score it. TRL's ``mask_truncated_completions`` leaves such
completions out of the loss; this penalises them instead (``pmi-reward grpo|rloo|ppo --truncation_penalty -2``
adds it). Reward: ``penalty`` for a cut completion, 0 for a finished one, None without ``completion_ids``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

__all__ = ["TruncationPenalty", "is_truncated"]


def is_truncated(ids: Sequence[int], stop_ids: set[int]) -> bool:
    """Whether a completion's ids end without a stop token (an empty completion is not cut)."""
    return bool(len(ids)) and int(ids[-1]) not in stop_ids


class TruncationPenalty:
    """``reward(prompts, completions, completion_ids, **kwargs) -> list[float | None]``."""

    def __init__(self, stop_ids: Iterable[int], penalty: float = -2.0, name: str = "truncation_penalty") -> None:
        self.stop_ids = {int(i) for i in stop_ids}
        if not self.stop_ids:
            raise ValueError("TruncationPenalty needs the end-of-sequence token ids")
        self.penalty = float(penalty)
        self.__name__ = name

    def __call__(
        self,
        prompts: Sequence[Any] | None = None,
        completions: Sequence[Any] | None = None,
        completion_ids: Sequence[Sequence[int]] | None = None,
        **kwargs: Any,
    ) -> list[float | None]:
        n = len(completions) if completions is not None else len(completion_ids or [])
        if completion_ids is None:
            return [None] * n
        ids = [row.tolist() if hasattr(row, "tolist") else list(row) for row in completion_ids]
        if len(ids) != n:
            raise ValueError(f"got {n} completions but {len(ids)} completion_ids")
        return [self.penalty if is_truncated(row, self.stop_ids) else 0.0 for row in ids]

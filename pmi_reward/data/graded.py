"""Partially relevant replies for graded supervision: other turns of the same dialogue.

A binary positive/negative signal teaches a head to tell the true reply from wrong ones, not to grade replies the
way people do (recipes/scorer/RESULTS.md). Another turn of the same conversation is on its topic without being the
answer: counted as a positive of weight w < 1 (``TrainConfig.graded_in_dialogue``), it makes the positive
distribution the mixture p_w = (p + w p_dialogue) / (1 + w), and a calibrated objective's optimum is then
log p_w(c, r) / q(c, r): full credit for the reply, partial credit for the conversation's topic, none for a
random reply. The context's own lines stay out (copying the context must not earn credit), as does the gold reply.
"""

from __future__ import annotations

import numpy as np

from .negatives import context_lines, draw_from_pool
from .pairs import PairSet

__all__ = ["partial_replies"]


def partial_replies(pairs: PairSet, k: int, rng: np.random.Generator, rows: np.ndarray | None = None) -> np.ndarray:
    """(len(rows), k) response-table indices: for each pair, turns of its dialogue that are neither its gold reply
    nor a line of its context, drawn with replacement; -1 where its dialogue has no such turn."""
    rows = np.arange(len(pairs)) if rows is None else np.asarray(rows)
    lines, group = context_lines(pairs, rows), pairs.group[rows]
    cols = [draw_from_pool(pairs, rows, rng, pairs.pool_ptr, pairs.pool, group, None, avoid=lines) for _ in range(k)]
    return np.stack(cols, axis=1) if cols else np.full((len(rows), 0), -1, dtype=np.int64)

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

from .pairs import PairSet

__all__ = ["partial_replies"]

_TRIES = 32


def partial_replies(pairs: PairSet, k: int, rng: np.random.Generator, rows: np.ndarray | None = None) -> np.ndarray:
    """(len(rows), k) response-table indices: for each pair, turns of its dialogue that are neither its gold reply
    nor a line of its context, drawn with replacement; -1 where its dialogue has no such turn."""
    rows = np.arange(len(pairs)) if rows is None else np.asarray(rows)
    out = np.full((len(rows), k), -1, dtype=np.int64)
    group, gold, ctx = pairs.group[rows], pairs.resp[rows], pairs.ctx[rows]
    start, size = pairs.pool_ptr[group], pairs.pool_ptr[group + 1] - pairs.pool_ptr[group]
    line_start, line_size = pairs.line_ptr[ctx], pairs.line_ptr[ctx + 1] - pairs.line_ptr[ctx]
    for col in range(k):
        todo = np.flatnonzero(size > 0)
        for _ in range(_TRIES):
            if not len(todo):
                break
            cand = pairs.pool[start[todo] + (rng.random(len(todo)) * size[todo]).astype(np.int64)]
            ok = cand != gold[todo]
            for j in range(int(line_size.max(initial=0))):
                has = line_size[todo] > j
                line = pairs.lines[np.where(has, line_start[todo] + j, 0)]
                ok &= ~(has & (line == cand))
            out[todo[ok], col] = cand[ok]
            todo = todo[~ok]
    return out

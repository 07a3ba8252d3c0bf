"""Reranking candidate replies by PMI (best-of-n sampling is ``pmi_reward.policy.sampling.best_of_n``).

A context is a string (turns one per line, oldest first) or chat messages; candidates are strings.
Given a ``PMIScorer``, scoring goes through ``PMIReward`` with no shaping, so contexts are cut as the scorer was
trained and unscorable candidates (empty, whitespace) get ``None`` and sort last instead of raising. Given a
``PMIReward``, its own options apply: the values are its rewards (scaled, clipped: ties that clipping makes keep
input order) and unscorable candidates get its ``empty_score``. ``ranking`` is the one sort, shared with the
server's ``/rerank``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from ..scoring.scorer import PMIScorer
from .reward import PMIReward

__all__ = ["rerank", "rerank_many", "ranking", "Ranked"]

Ranked = list[tuple[str, float | None]]


def ranking(scores: Sequence[float | None]) -> list[int]:
    """Indices of ``scores`` best first; unscorable ones (None or NaN) last; ties keep input order."""

    def key(i: int) -> tuple[bool, float, int]:
        s = scores[i]
        if s is None or not math.isfinite(s):
            return True, 0.0, i
        return False, -s, i

    return sorted(range(len(scores)), key=key)


def _reward(scorer: PMIScorer | PMIReward) -> PMIReward:
    return scorer if isinstance(scorer, PMIReward) else PMIReward(scorer, empty_score=None)


def rerank_many(
    scorer: PMIScorer | PMIReward, contexts: Sequence[Any], candidates: Sequence[Sequence[str]]
) -> list[Ranked]:
    """For each context, its candidates as ``(text, pmi)`` best first (ties keep input order), in one scoring pass."""
    if len(contexts) != len(candidates):
        raise ValueError(f"got {len(contexts)} contexts but {len(candidates)} candidate lists")
    reward = _reward(scorer)
    flat_ctx = [c for c, cands in zip(contexts, candidates, strict=True) for _ in cands]
    flat = [x for cands in candidates for x in cands]
    scores = reward(flat_ctx, flat)
    out, at = [], 0
    for cands in candidates:
        mine = scores[at : at + len(cands)]
        out.append([(cands[i], mine[i]) for i in ranking(mine)])
        at += len(cands)
    return out


def rerank(scorer: PMIScorer | PMIReward, context: Any, candidates: Sequence[str]) -> Ranked:
    """``candidates`` as ``(text, pmi)`` pairs, best first; unscorable ones last with ``None``."""
    return rerank_many(scorer, [context], [list(candidates)])[0]

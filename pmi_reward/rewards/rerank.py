"""Reranking candidate replies by PMI (best-of-n sampling is ``pmi_reward.policy.sampling.best_of_n``).

A context is a string (turns one per line, oldest first) or chat messages; candidates are strings.
Given a ``PMIScorer``, scoring goes through ``PMIReward`` with no shaping, so contexts are cut as the scorer was
trained and unscorable candidates (empty, whitespace) get ``None`` and sort last instead of raising. Given a
``PMIReward``, its own options apply: the values are its rewards (scaled, clipped: ties that clipping makes keep
input order) and unscorable candidates get its ``empty_score``. ``ranking`` is the one sort, shared with the
server's ``/rerank``.

A scorer that fails (raises) gives its candidates ``None`` too, by the reward's contract (a trainer's step goes on);
``strict=True`` lets its error propagate instead, as ``PMIScorer.score`` raises it: ``pmi-reward rerank`` has no run
to protect, and a broken scorer made it exit 0 with every score and ``best`` null.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..scoring.scorer import PMIScorer
from .path import checked_scores
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


def _strict_scores(reward: PMIReward, contexts: list[str], replies: list[str]) -> np.ndarray:
    """Raw PMI of the readable pairs, ``batch_size`` pairs per scorer call as the reward scores them, but with the
    scorer's errors raised (the reward's own scoring step gives a failed pair NaN, then its ``empty_score``)."""
    size = reward.options.batch_size
    parts = []
    with reward._lock:  # the reward's turn-taking: one tokenizer is not safe to share between threads
        for s in range(0, len(replies), size):
            chunk = replies[s : s + size]
            parts.append(checked_scores(reward.scorer.score(contexts[s : s + size], chunk), len(chunk)))
    return np.concatenate(parts) if parts else np.zeros(0)


def rerank_many(
    scorer: PMIScorer | PMIReward,
    contexts: Sequence[Any],
    candidates: Sequence[Sequence[str]],
    strict: bool = False,
) -> list[Ranked]:
    """For each context, its candidates as ``(text, pmi)`` best first (ties keep input order), in one scoring pass.
    ``strict``: an error of the scorer propagates (else its candidates get ``None``, or the reward's
    ``empty_score``); the values are the same either way."""
    if len(contexts) != len(candidates):
        raise ValueError(f"got {len(contexts)} contexts but {len(candidates)} candidate lists")
    reward = _reward(scorer)
    flat_ctx = [c for c, cands in zip(contexts, candidates, strict=True) for _ in cands]
    flat = [x for cands in candidates for x in cands]
    if strict:
        scores = reward.run(flat_ctx, flat, lambda c, r: _strict_scores(reward, c, r)).rewards
    else:
        scores = reward(flat_ctx, flat)
    out, at = [], 0
    for cands in candidates:
        mine = scores[at : at + len(cands)]
        out.append([(cands[i], mine[i]) for i in ranking(mine)])
        at += len(cands)
    return out


def rerank(scorer: PMIScorer | PMIReward, context: Any, candidates: Sequence[str], strict: bool = False) -> Ranked:
    """``candidates`` as ``(text, pmi)`` pairs, best first; unscorable ones last with ``None`` (``strict``: as in
    ``rerank_many``)."""
    return rerank_many(scorer, [context], [list(candidates)], strict)[0]

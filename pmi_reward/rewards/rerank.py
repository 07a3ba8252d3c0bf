"""Reranking candidate replies by PMI, and best-of-n: sample N replies from a chat model, keep the best.

A context is a string (turns one per line, oldest first) or chat messages; candidates are strings.
Scoring goes through ``PMIReward`` with no shaping, so contexts are cut as the scorer was trained and
unscorable candidates (empty, whitespace) get ``None`` and sort last instead of raising.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..data.conversation import turns_to_messages
from ..policy.sampling import SamplingSettings, sample_replies
from ..scoring.scorer import PMIScorer
from .reward import PMIReward

__all__ = ["rerank", "rerank_many", "best_of_n"]

Ranked = list[tuple[str, float | None]]


def _reward(scorer: PMIScorer | PMIReward) -> PMIReward:
    return scorer if isinstance(scorer, PMIReward) else PMIReward(scorer, empty_score=None)


def _sort(candidates: Sequence[str], scores: Sequence[float | None]) -> Ranked:
    order = sorted(range(len(candidates)), key=lambda i: (scores[i] is None, -(scores[i] or 0.0), i))
    return [(candidates[i], scores[i]) for i in order]


def rerank_many(scorer: PMIScorer | PMIReward, contexts: Sequence[Any],
                candidates: Sequence[Sequence[str]]) -> list[Ranked]:
    """For each context, its candidates as ``(text, pmi)`` best first (ties keep input order), in one scoring pass."""
    if len(contexts) != len(candidates):
        raise ValueError(f"got {len(contexts)} contexts but {len(candidates)} candidate lists")
    reward = _reward(scorer)
    flat_ctx = [c for c, cands in zip(contexts, candidates) for _ in cands]
    flat = [x for cands in candidates for x in cands]
    scores = reward(flat_ctx, flat)
    out, at = [], 0
    for cands in candidates:
        out.append(_sort(cands, scores[at:at + len(cands)]))
        at += len(cands)
    return out


def rerank(scorer: PMIScorer | PMIReward, context: Any, candidates: Sequence[str]) -> Ranked:
    """``candidates`` as ``(text, pmi)`` pairs, best first; unscorable ones last with ``None``."""
    return rerank_many(scorer, [context], [list(candidates)])[0]


def best_of_n(scorer: PMIScorer | PMIReward, model, tokenizer, context: Any, n: int = 8,
              settings: SamplingSettings | None = None, system_prompt: str | None = None) -> Ranked:
    """Sample ``n`` replies to ``context`` from a chat model and return them ranked (best first)."""
    messages = context if isinstance(context, list) else turns_to_messages(context, system_prompt)
    replies = sample_replies(model, tokenizer, [messages], n, settings)[0]
    return rerank(scorer, messages, replies)

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

``progress=True`` draws one bar over the scorer calls (on stderr, ``progress.progress_bar``), where there are two
or more: ``pmi-reward rerank`` printed nothing while it scored many candidates, and its stdout is its output.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..progress import progress_bar
from ..scoring.scorer import PMIScorer
from .path import checked_scores, score_robustly
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


def _chunked_scores(
    reward: PMIReward,
    contexts: list[str],
    replies: list[str],
    score: Callable[[list[str], list[str]], np.ndarray],
    progress: bool,
) -> np.ndarray:
    """Raw PMI of the readable pairs, ``batch_size`` pairs per ``score`` call as the reward scores them, with one bar
    over the calls when ``progress`` is asked and there are two or more (one call has nothing to show in between)."""
    size = reward.options.batch_size
    starts = range(0, len(replies), size)
    parts = []
    bar = progress_bar(total=len(replies), desc="reranking", unit="pair", disable=not progress or len(starts) < 2)
    with bar, reward._lock:  # the reward's turn-taking: one tokenizer is not safe to share between threads
        for s in starts:
            chunk = replies[s : s + size]
            parts.append(score(contexts[s : s + size], chunk))
            bar.update(len(chunk))
    return np.concatenate(parts) if parts else np.zeros(0)


def rerank_many(
    scorer: PMIScorer | PMIReward,
    contexts: Sequence[Any],
    candidates: Sequence[Sequence[str]],
    strict: bool = False,
    progress: bool = False,
) -> list[Ranked]:
    """For each context, its candidates as ``(text, pmi)`` best first (ties keep input order), in one scoring pass.
    ``strict``: an error of the scorer propagates (else its candidates get ``None``, or the reward's
    ``empty_score``); the values are the same either way. ``progress``: a bar on stderr while the candidates are
    scored (the same values)."""
    if len(contexts) != len(candidates):
        raise ValueError(f"got {len(contexts)} contexts but {len(candidates)} candidate lists")
    reward = _reward(scorer)
    flat_ctx = [c for c, cands in zip(contexts, candidates, strict=True) for _ in cands]
    flat = [x for cands in candidates for x in cands]
    if strict or progress:
        # strict: the scorer's errors raised (the reward's own step gives a failed pair NaN, then its empty_score)
        def strict_score(c: list[str], r: list[str]) -> np.ndarray:
            return checked_scores(reward.scorer.score(c, r), len(r))

        def loose_score(c: list[str], r: list[str]) -> np.ndarray:
            return score_robustly(reward.scorer, c, r)

        one = strict_score if strict else loose_score
        scores = reward.run(flat_ctx, flat, lambda c, r: _chunked_scores(reward, c, r, one, progress)).rewards
    else:
        scores = reward(flat_ctx, flat)
    out, at = [], 0
    for cands in candidates:
        mine = scores[at : at + len(cands)]
        out.append([(cands[i], mine[i]) for i in ranking(mine)])
        at += len(cands)
    return out


def rerank(
    scorer: PMIScorer | PMIReward, context: Any, candidates: Sequence[str], strict: bool = False, progress: bool = False
) -> Ranked:
    """``candidates`` as ``(text, pmi)`` pairs, best first; unscorable ones last with ``None`` (``strict``,
    ``progress``: as in ``rerank_many``)."""
    return rerank_many(scorer, [context], [list(candidates)], strict, progress)[0]

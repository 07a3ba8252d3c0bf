"""Best-of-n at inference as a baseline (and ceiling) for RL: sample n replies, keep the one the reward likes best.

From one pool of ``m`` samples per context, best-of-n for every n dividing ``m`` takes ``m // n`` disjoint
groups of ``n`` and keeps the reward's favourite of each, so best-of-4, -8 and -16 cost one pool of 16 samples
and each gives ``16 / n`` replies per context for the judges. Its KL to the sampling policy is at most
``log n - (n - 1) / n`` nats (the analytic bound for best-of-n), which the report shows in place of a measured
KL.
"""

from __future__ import annotations

import math

import numpy as np

from .sampling import Replies

__all__ = ["best_of_n_replies", "best_of_n_kl_bound"]


def best_of_n_replies(pool: Replies, scores: np.ndarray, n: int) -> Replies:
    """The best of each disjoint group of ``n`` samples (by ``scores``, (contexts, m); NaN never wins unless a
    whole group is NaN)."""
    m = len(pool.texts[0]) if pool.texts else 0
    if n < 1 or m % n:
        raise ValueError(f"best-of-{n} needs a pool whose samples per context ({m}) are a multiple of {n}")
    ranked = np.where(np.isfinite(scores), scores, -np.inf)
    texts, tokens, truncated = [], [], []
    for i in range(len(pool.texts)):
        picks = [g * n + int(np.argmax(ranked[i, g * n : (g + 1) * n])) for g in range(m // n)]
        texts.append([pool.texts[i][j] for j in picks])
        tokens.append([pool.tokens[i][j] for j in picks])
        truncated.append([pool.truncated[i][j] for j in picks])
    return Replies(texts, tokens, truncated)


def best_of_n_kl_bound(n: int) -> float:
    """KL(best-of-n || base) <= log n - (n - 1) / n nats."""
    return math.log(n) - (n - 1) / n

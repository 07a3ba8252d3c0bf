"""Training objectives: variational bounds whose optimum score s(c, r) estimates log p(c, r) / q(c, r).

Each objective is a function of positive scores ``pos`` (B,) and negative scores ``neg`` (B, K) that
returns a loss to minimise. With q the product of marginals (random negatives), log p/q = PMI.

- ``nwj`` (PMIScore): the NWJ / f-GAN dual of KL, -(E_p[s] - E_q[e^s]); optimum s = log p/q exactly.
- ``mine``: the Donsker-Varadhan bound, -(E_p[s] - log E_q[e^s]); optimum s = log p/q + const. The log of the
  mean is taken over one batch's negatives (no moving average), which biases the optimum when a batch holds few
  negatives; at the default batch (256 positives x 4 negatives) the bias is small.
- ``infonce``: softmax over each positive and its K negatives; optimum s = log p/q + c(context) when the K
  negatives are independent draws from q (a fixed mix of kinds per row, e.g. 3 random + 1 context line, moves it
  slightly off log p/q_mix).
- ``js``, ``chi2``, ``hellinger``: f-GAN duals of Jensen-Shannon, Pearson chi^2 and squared Hellinger,
  with the variational function written through s so that the optimum is again s = log p/q.
- ``tv``: the total-variation dual; its optimum only identifies sign(log p/q), so it ranks, not measures.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

__all__ = ["OBJECTIVES", "get_objective", "register", "CALIBRATED"]

Objective = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
OBJECTIVES: dict[str, Objective] = {}
# objectives whose optimum is log p/q itself (no free constant): their scores are PMI estimates
CALIBRATED = {"nwj", "js", "chi2", "hellinger"}


def register(name: str) -> Callable[[Objective], Objective]:
    def wrap(fn: Objective) -> Objective:
        OBJECTIVES[name] = fn
        return fn

    return wrap


def get_objective(name: str) -> Objective:
    try:
        return OBJECTIVES[name]
    except KeyError:
        raise ValueError(f"unknown objective {name!r}; choose from {sorted(OBJECTIVES)}") from None


@register("nwj")
def nwj(pos: torch.Tensor, neg: torch.Tensor) -> torch.Tensor:
    return -(pos.mean() - neg.exp().mean())


@register("mine")
def mine(pos: torch.Tensor, neg: torch.Tensor) -> torch.Tensor:
    return -(pos.mean() - (torch.logsumexp(neg.flatten(), 0) - math.log(neg.numel())))


@register("infonce")
def infonce(pos: torch.Tensor, neg: torch.Tensor) -> torch.Tensor:
    logits = torch.cat([pos.unsqueeze(1), neg], dim=1)
    return -(pos - torch.logsumexp(logits, dim=1)).mean()


@register("js")
def js(pos: torch.Tensor, neg: torch.Tensor) -> torch.Tensor:
    # E_p[log sigmoid(s)] + E_q[log(1 - sigmoid(s))]: a logistic classifier of p against q
    return F.softplus(-pos).mean() + F.softplus(neg).mean()


@register("chi2")
def chi2(pos: torch.Tensor, neg: torch.Tensor) -> torch.Tensor:
    # T = 2(e^s - 1), f*(T) = T^2/4 + T  =>  E_p[2(e^s - 1)] - E_q[e^{2s} - 1]
    return -(2 * (pos.exp() - 1).mean() - (torch.exp(2 * neg) - 1).mean())


@register("hellinger")
def hellinger(pos: torch.Tensor, neg: torch.Tensor) -> torch.Tensor:
    # T = 1 - e^{-s/2}, f*(T) = T / (1 - T)  =>  E_p[1 - e^{-s/2}] - E_q[e^{s/2} - 1]
    return -((1 - torch.exp(-pos / 2)).mean() - (torch.exp(neg / 2) - 1).mean())


@register("tv")
def tv(pos: torch.Tensor, neg: torch.Tensor) -> torch.Tensor:
    # T = tanh(s) / 2 in [-1/2, 1/2], f*(T) = T  =>  E_p[T] - E_q[T]
    return -(torch.tanh(pos).mean() - torch.tanh(neg).mean()) / 2

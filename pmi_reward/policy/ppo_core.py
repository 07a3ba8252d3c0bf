"""The arithmetic of RLHF PPO on response tokens: log-probs, KL-shaped rewards, GAE, whitening, clipped losses.

All tensors are (batch, response_length) with a 0/1 ``mask`` over real response tokens (1 up to and
including the first EOS). Pure functions, so each step of the recipe can be tested on its own.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

__all__ = [
    "token_logprobs",
    "masked_mean",
    "whiten",
    "shaped_rewards",
    "gae",
    "ppo_loss",
    "response_mask",
    "truncated_rows",
]


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """log p(token) under ``logits`` (..., vocab) for each token (...)."""
    return torch.log_softmax(logits.float(), dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (x * mask).sum() / mask.sum().clamp(min=1)


def whiten(
    x: torch.Tensor,
    mask: torch.Tensor,
    shift_mean: bool = True,
    all_reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """Normalise ``x`` to unit variance (and zero mean) over masked entries, pooled across processes
    when ``all_reduce`` sums a tensor over them.

    The sums are taken in float64 (``E[x^2] - mean^2`` cancels digits in float32 when ``|mean| >> std``): on the
    tensors' own device, so that a CUDA run's ``all_reduce`` gets a tensor NCCL takes, but on the CPU for an MPS
    tensor (MPS has no float64; an MPS run is a single process), the mean and variance then moved back to it."""
    on = torch.device("cpu") if x.device.type == "mps" else x.device
    xd, md = x.to(on, torch.float64), mask.to(on, torch.float64)
    stats = torch.stack([(xd * md).sum(), (xd * xd * md).sum(), md.sum()])
    if all_reduce is not None:
        stats = all_reduce(stats)
    n = stats[2].clamp(min=1)
    mean = stats[0] / n
    var = (stats[1] / n - mean * mean).clamp(min=0) * n / (n - 1).clamp(min=1)
    mean, var = mean.float().to(x.device), var.float().to(x.device)  # from the CPU on MPS; a no-op elsewhere
    out = (x - mean) * torch.rsqrt(var + 1e-8)
    return (out if shift_mean else out + mean) * mask


def shaped_rewards(
    scores: torch.Tensor, logprobs: torch.Tensor, ref_logprobs: torch.Tensor, mask: torch.Tensor, kl_coef: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token rewards -kl_coef * (log pi - log ref), plus the sequence score on its last real token.

    Returns ``(rewards, kl)``; ``kl`` is the per-token estimate log pi - log ref (0 where masked).
    """
    kl = (logprobs - ref_logprobs) * mask
    rewards = -kl_coef * kl
    last = (mask.sum(1).long() - 1).clamp(min=0)
    rows = torch.arange(len(scores))
    rewards[rows, last] += scores * (mask.sum(1) > 0)
    return rewards, kl


def gae(
    rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0, lam: float = 0.95
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimates and returns (advantages + values), zero past the last real token."""
    rewards, values = rewards * mask, values * mask
    advantages = torch.zeros_like(rewards)
    running = torch.zeros(rewards.shape[0], dtype=rewards.dtype, device=rewards.device)
    for t in reversed(range(rewards.shape[1])):
        next_value = values[:, t + 1] if t + 1 < rewards.shape[1] else torch.zeros_like(running)
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        running = (delta + gamma * lam * running) * mask[:, t]
        advantages[:, t] = running
    return advantages, (advantages + values) * mask


def ppo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    clip_range: float = 0.2,
    clip_range_value: float = 0.2,
    vf_coef: float = 0.1,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped surrogate policy loss + vf_coef x clipped value loss, token means over the mask."""
    ratio = torch.exp(logprobs - old_logprobs)
    unclipped, clipped = -advantages * ratio, -advantages * ratio.clamp(1 - clip_range, 1 + clip_range)
    surrogate = torch.max(unclipped, clipped)
    policy_loss = masked_mean(surrogate, mask)
    clipped_values = old_values + (values - old_values).clamp(-clip_range_value, clip_range_value)
    value_loss = 0.5 * masked_mean(torch.max((values - returns) ** 2, (clipped_values - returns) ** 2), mask)
    with torch.no_grad():
        stats = {
            "policy_loss": policy_loss.item(),
            "value_loss": value_loss.item(),
            # tokens whose gradient the clip removes (the clipped term wins the max), as TRL's pg_clipfrac
            "clip_frac": masked_mean((clipped > unclipped).float(), mask).item(),
            "approx_kl": masked_mean(0.5 * (logprobs - old_logprobs) ** 2, mask).item(),
        }
    return policy_loss + vf_coef * value_loss, stats


def _is_eos(response: torch.Tensor, eos_ids: set[int]) -> torch.Tensor:
    is_eos = torch.zeros_like(response, dtype=torch.bool)
    for e in eos_ids:
        is_eos |= response == e
    return is_eos


def response_mask(response: torch.Tensor, eos_ids: set[int]) -> torch.Tensor:
    """1 on real response tokens: up to and including the first EOS."""
    is_eos = _is_eos(response, eos_ids)
    after = (is_eos.cumsum(1) - is_eos.long()) > 0
    return (~after).float()


def truncated_rows(response: torch.Tensor, eos_ids: set[int]) -> torch.Tensor:
    """True for responses with no EOS: generation was cut at ``max_new_tokens``."""
    return ~_is_eos(response, eos_ids).any(1)

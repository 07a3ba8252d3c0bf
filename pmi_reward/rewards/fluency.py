"""A penalty for replies the starting chat model would not write, as a TRL reward function beside PMI.

Pushed far (tuning trials dpo-e and dpo-g of recipes/smollm2-135m), a policy can drift into invented words and
another language ("Especially pyrofloakes haha. They're a lifeskiaerwalk!!"). Such replies raise distinct-2, keep
their words under a scramble, and a sentence-encoder reward may still pay for them. The starting model sees them:
they cost it many nats a token. This reads each reply after its prompt under a frozen copy of that model, the way
the LM judge reads a reply (the prompt's turns with the policy's system prompt, the reply closed by its end-of-turn
token; ``LMPMIScorer.log_likelihoods``), and gives ``penalty`` where the negative log-likelihood per token exceeds
``max_nll``, else 0 (``pmi-reward grpo|rloo|ppo|dpo|rft --fluency_penalty -10`` adds it). The default threshold,
2.66 nats a token, is the 95th percentile of SmolLM2-135M-Instruct's own replies at temperature 1 on the tuning
contexts (``recipes/smollm2-135m/fluency.py``), so about 1 in 20 of the starting model's replies is penalised.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..data.conversation import completion_to_text, prompt_to_context
from .path import RewardPath, readable

if TYPE_CHECKING:  # the scorer is built by the caller (evaluation, a later stage): its type only
    from ..evaluation.baselines.lm_pmi import LMPMIScorer

__all__ = ["FluencyPenalty", "BASE_NLL_P95", "FLUENCY_DTYPES", "reply_nll"]

BASE_NLL_P95 = 2.66  # nats/token: SmolLM2-135M-Instruct's replies at T=1, tuning contexts, 95th percentile
FLUENCY_DTYPES = ("float32", "bfloat16")  # the frozen copy's precisions (bfloat16: cheaper where the CPU has bf16)


def reply_nll(lm: LMPMIScorer, contexts: Sequence[str], replies: Sequence[str]) -> np.ndarray:
    """NLL per token (nats) of each reply after its context (turns, one per line) under ``lm``'s model, its
    end-of-turn token included (so an empty reply is the NLL of stopping at once); one pass per distinct context."""
    by_context: dict[str, list[int]] = {}
    for i, c in enumerate(contexts):
        by_context.setdefault(c, []).append(i)
    out = np.zeros(len(replies))
    for c, rows in by_context.items():
        for i, (ll, n) in zip(rows, lm.log_likelihoods(c, [replies[i] for i in rows]), strict=True):
            out[i] = -ll / n
    return out


class FluencyPenalty:
    """``reward(prompts, completions, **kwargs) -> list[float | None]``: ``penalty`` for a reply whose NLL per token
    under ``lm`` (the starting model, frozen) is above ``max_nll``, 0 otherwise, None for a prompt with no turns or a
    completion with no text, and for text no tokenizer reads (a lone surrogate). Prompts and completions may be numpy
    arrays (a dataset's columns). ``penalised`` is the share penalised in the last call (round logs report it), None
    when that call scored nothing (not the share of an earlier call)."""

    def __init__(
        self, lm: LMPMIScorer, max_nll: float = BASE_NLL_P95, penalty: float = -10.0, name: str = "fluency_penalty"
    ) -> None:
        if not np.isfinite(max_nll) or max_nll <= 0:
            raise ValueError(f"max_nll must be a positive number of nats per token, got {max_nll}")
        self.lm, self.max_nll, self.penalty = lm, float(max_nll), float(penalty)
        self.penalised: float | None = None
        self.__name__ = name

    def nll(self, contexts: Sequence[str], replies: Sequence[str]) -> np.ndarray:
        """NLL per token (nats) of each reply after its context (turns, one per line): :func:`reply_nll`."""
        return reply_nll(self.lm, contexts, replies)

    def __call__(
        self, prompts: Sequence[Any] | None = None, completions: Sequence[Any] | None = None, **kwargs: Any
    ) -> list[float | None]:
        prompts, completions = RewardPath.samples(prompts, completions)  # plain lists (arrays: ``plain``), same length
        contexts = [prompt_to_context(p) for p in prompts]
        texts = [completion_to_text(c) for c in completions]
        pairs = [
            (i, c, t)
            for i, (c, t) in enumerate(zip(contexts, texts, strict=True))
            if c and t is not None and readable(c) and readable(t)
        ]
        out: list[float | None] = [None] * len(completions)
        self.penalised = None
        if pairs:
            rows = [i for i, _, _ in pairs]
            nll = self.nll([c for _, c, _ in pairs], [t for _, _, t in pairs])
            for i, v in zip(rows, nll, strict=True):
                out[i] = self.penalty if v > self.max_nll else 0.0
            self.penalised = float(np.mean(nll > self.max_nll))
        return out

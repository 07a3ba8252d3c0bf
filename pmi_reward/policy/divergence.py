"""How far a tuned policy moved from its base: log pi_tuned(y|x) - log pi_base(y|x) on the tuned policy's own
sampled replies (a Monte Carlo estimate of KL(pi_tuned || pi_base)), per reply and per token.

Both log-probabilities are taken at the sampling temperature (the tempered policies the replies were drawn from;
top-p is ignored), over the reply's tokens including the end-of-sequence token when generation stopped, so the
decision to stop counts too. Identical policies give exactly 0.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from ..scoring.models import pad_token_ids
from .ppo_core import token_logprobs
from .sampling import prompt_texts

__all__ = ["reply_logprobs", "kl_to_base"]


@torch.no_grad()
def reply_logprobs(
    model,
    tokenizer,
    prompts: Sequence[list[dict] | str],
    replies: Sequence[Sequence[list[int]]],
    temperature: float = 1.0,
    batch_size: int = 16,
) -> np.ndarray:
    """(prompts, samples) summed log-probabilities of each reply's tokens after its prompt under ``model``."""
    texts = prompt_texts(tokenizer, prompts)
    pairs = [
        (tokenizer(t, add_special_tokens=False)["input_ids"], r)
        for t, row in zip(texts, replies, strict=True)
        for r in row
    ]
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    order = sorted(range(len(pairs)), key=lambda i: len(pairs[i][0]) + len(pairs[i][1]))  # batches of like length
    out = np.zeros(len(pairs), dtype=np.float64)
    try:
        for s in range(0, len(pairs), batch_size):
            rows = order[s : s + batch_size]
            chunk = [pairs[i] for i in rows]
            ids, attention = pad_token_ids([p + list(r) for p, r in chunk], pad, left=True)  # as generation saw it
            width = ids.shape[1]
            reply_mask = torch.zeros(len(chunk), width, dtype=torch.bool)
            for i, (_, r) in enumerate(chunk):
                reply_mask[i, width - len(r) :] = True
            positions = (attention.cumsum(-1) - 1).clamp(min=0)
            keep = max(len(r) for _, r in chunk) + 1  # left padding: every reply lies in the last `keep` positions
            logits = model(
                input_ids=ids.to(device),
                attention_mask=attention.to(device),
                position_ids=positions.to(device),
                logits_to_keep=keep,
            ).logits
            logp = token_logprobs(logits[:, :-1].float() / temperature, ids[:, width - keep + 1 :].to(device)).cpu()
            out[rows] = (logp * reply_mask[:, width - keep + 1 :]).sum(1).double().numpy()
    finally:
        model.train(was_training)
    return out.reshape(len(prompts), -1)


def kl_to_base(
    tuned,
    base,
    tokenizer,
    prompts: Sequence[list[dict] | str],
    replies: Sequence[Sequence[list[int]]],
    temperature: float = 1.0,
    batch_size: int = 16,
) -> dict[str, float]:
    """Mean over the tuned policy's replies of log pi_tuned - log pi_base: per reply (nats) and per token."""
    diff = reply_logprobs(tuned, tokenizer, prompts, replies, temperature, batch_size) - reply_logprobs(
        base, tokenizer, prompts, replies, temperature, batch_size
    )
    tokens = sum(len(r) for row in replies for r in row)
    return {"kl_reply": float(diff.mean()) if diff.size else 0.0, "kl_token": float(diff.sum() / max(tokens, 1))}

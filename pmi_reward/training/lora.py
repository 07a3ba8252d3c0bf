"""Encoder fine-tuning under the head's loss: LoRA adapters trained by the same loop as the head.

``EncoderFeatures`` serves pair-mode head inputs from an encoder whose LoRA adapters (peft) are
trainable: each batch embeds its distinct contexts and responses with gradients, so the one training
loop (``train_head``) updates adapters and head together under any objective of the registry. After
training, ``merge_and_save`` folds the adapters into the weights and writes a plain model directory
that a ``PMIScorer`` loads like any other encoder.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ..data.pairs import PairSet
from ..scoring.encoder import EncoderSpec, TextEncoder
from ..scoring.templates import PromptTemplate

__all__ = ["LoraSpec", "add_lora", "EncoderFeatures", "merge_and_save"]


@dataclass
class LoraSpec:
    """LoRA rank, scale, dropout and which linear layers get adapters (names as in the model)."""

    r: int = 8
    alpha: int = 16
    dropout: float = 0.1
    target_modules: Sequence[str] = ("query", "key", "value", "dense")


def add_lora(encoder: TextEncoder, spec: LoraSpec) -> nn.Module:
    """Wrap the encoder's model with fresh LoRA adapters (only they are trainable); returns the wrapper."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        r=spec.r, lora_alpha=spec.alpha, lora_dropout=spec.dropout, target_modules=list(spec.target_modules)
    )
    encoder.model = get_peft_model(encoder.model, config)
    return encoder.model


class EncoderFeatures:
    """Pair-mode features from a trainable encoder: ``module`` holds the trainable parameters.

    Under ``torch.no_grad`` (validation, scoring) embeddings are computed in chunks without gradients.
    """

    def __init__(self, encoder: TextEncoder, template: PromptTemplate, pairs: PairSet, chunk: int = 256) -> None:
        self.encoder, self.template, self.pairs, self.chunk = encoder, template, pairs, chunk

    @property
    def module(self) -> nn.Module:
        return self.encoder.model

    def prepare(self, ctx: np.ndarray, resp: np.ndarray) -> None:
        return None

    def _embed(self, texts: list[str], template: str, keep: str) -> torch.Tensor:
        if torch.is_grad_enabled():
            return self.encoder.embed_with_grad(texts, template, keep)
        return torch.cat(
            [
                self.encoder.embed_with_grad(texts[s : s + self.chunk], template, keep)
                for s in range(0, len(texts), self.chunk)
            ]
        )

    def __call__(self, ctx: np.ndarray, resp: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        ctx, resp = np.asarray(ctx), np.asarray(resp)
        uc, ic = np.unique(ctx, return_inverse=True)
        ur, ir = np.unique(resp, return_inverse=True)
        u = self._embed([self.pairs.contexts[i] for i in uc], self.template.context_template, "end")
        v = self._embed([self.pairs.responses[i] for i in ur], self.template.response_template, "start")
        return u[torch.as_tensor(ic.reshape(ctx.shape))], v[torch.as_tensor(ir.reshape(resp.shape))]


def merge_and_save(encoder: TextEncoder, directory: str | Path) -> EncoderSpec:
    """Fold the adapters into the weights, save model + tokenizer to ``directory``; the spec to load it."""
    directory = Path(directory)
    merged = encoder.model.merge_and_unload() if hasattr(encoder.model, "merge_and_unload") else encoder.model
    merged.save_pretrained(directory)
    encoder.tokenizer.save_pretrained(directory)
    encoder.model = merged.eval()
    return replace(encoder.spec, model=str(directory), pooling=encoder.pooling)

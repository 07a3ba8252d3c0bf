"""Encoder fine-tuning under the head's loss: the whole encoder (``full``) or LoRA adapters (``lora``), trained by
the same loop as the head.

``TrainableFeatures`` serves head inputs from an encoder with trainable parameters: in pair mode each batch embeds its
distinct contexts, replies and context lines with gradients; in prompt mode its distinct (context, reply) prompts, so
that the encoder learns to read the two together (a cross-encoder). The one training loop (``train_head``) updates
encoder and head together under any objective of the registry. ``finish_tuning``
then folds LoRA adapters into the weights, freezes the encoder and gives its spec a ``revision`` (a digest of the
weights), so that its embeddings never share cache entries with the pretrained encoder's and a saved scorer
carries its own encoder (``PMIScorer.save_pretrained`` writes it under ``encoder/``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ..data.pairs import PairSet
from ..scoring.encoder import EncoderSpec, TextEncoder
from ..scoring.features import PairFeatures, embedding_identity, stack_lines
from ..scoring.scorer import LOCAL_ENCODER
from ..scoring.templates import PromptTemplate

__all__ = [
    "TRAIN_ENCODER",
    "LoraSpec",
    "add_lora",
    "make_trainable",
    "check_top_layers",
    "layer_stack",
    "set_attention_dropout",
    "TrainableFeatures",
    "finish_tuning",
    "lora_targets",
    "weights_digest",
    "merge_and_save",
]

TRAIN_ENCODER = ("none", "full", "lora")


@dataclass
class LoraSpec:
    """LoRA rank, scale, dropout and which linear layers get adapters (names as in the model)."""

    r: int = 8
    alpha: int = 16
    dropout: float = 0.1
    target_modules: Sequence[str] | None = None  # None: the model's attention and MLP projections (lora_targets)


# the linear layers LoRA adapts by default, each family's attention and MLP projections: BERT (MiniLM), MPNet (mpnet:
# its attention's q, k, v, o; its MLP's dense, which BERT's list names too), Llama-style decoders (SmolLM2)
DEFAULT_LORA_TARGETS = (
    ["query", "key", "value", "dense"],
    ["q", "k", "v", "o", "dense"],
    ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
)


def _linear_layers(model: nn.Module) -> dict[str, str]:
    """Each linear layer of ``model``: its full module name and its own (last) name."""
    from transformers.pytorch_utils import Conv1D  # GPT-2's linear layers

    return {name: name.rsplit(".", 1)[-1] for name, m in model.named_modules() if isinstance(m, (nn.Linear, Conv1D))}


def lora_targets(model: nn.Module, spec: LoraSpec) -> list[str]:
    """The module names LoRA adapts in ``model``: ``spec``'s, or the default list that names most of its layers (MPNet's
    ``dense`` is BERT's name too: the first match left its attention without adapters); a ValueError naming the model's
    linear layers when none match (cheap: checked before anything is embedded)."""
    linear = set(_linear_layers(model).values())
    choices = [list(spec.target_modules)] if spec.target_modules is not None else list(DEFAULT_LORA_TARGETS)
    best = max(choices, key=lambda targets: len(linear & set(targets)))  # the first of equals
    if linear & set(best):
        return best
    raise ValueError(
        f"LoRA finds none of {choices[0] if len(choices) == 1 else choices} among this encoder's linear layers "
        f"({sorted(linear)[:12]}); name them in LoraSpec.target_modules"
    )


def add_lora(encoder: TextEncoder, spec: LoraSpec) -> nn.Module:
    """Wrap the encoder's model with fresh LoRA adapters (only they are trainable); returns the wrapper."""
    from peft import LoraConfig, get_peft_model

    targets = lora_targets(encoder.model, spec)
    # the defaults never adapt a pooler (BERT's and MPNet's ``pooler.dense``): the embeddings pool hidden states, not it
    default = spec.target_modules is None
    pooler = [n for n in _linear_layers(encoder.model) if "pooler" in n.split(".")] if default else []
    config = LoraConfig(
        r=spec.r,
        lora_alpha=spec.alpha,
        lora_dropout=spec.dropout,
        target_modules=targets,
        exclude_modules=pooler or None,
    )
    encoder.model = get_peft_model(encoder.model, config)
    return encoder.model


def layer_stack(model: nn.Module) -> nn.ModuleList:
    """The model's stack of transformer layers (BERT's ``encoder.layer``, Llama's ``layers``): its largest list."""
    stacks = [m for m in model.modules() if isinstance(m, nn.ModuleList) and len(m)]
    if not stacks:
        raise ValueError(f"{type(model).__name__} has no stack of layers to train the top of")
    return max(stacks, key=lambda m: sum(p.numel() for p in m.parameters()))


def check_top_layers(
    model: nn.Module, mode: str, top_layers: int | None, lora: LoraSpec | None = None, layer: int = -1
) -> None:
    """A ValueError unless ``mode`` can train the top ``top_layers`` layers of ``model`` (None: every layer), whose
    embeddings pool hidden layer ``layer`` (``EncoderSpec.layer``); cheap, so that ``fit_scorer`` checks it before
    anything is embedded or the warm-up trains."""
    if mode == "lora":
        lora_targets(model, lora or LoraSpec())
    if top_layers is None or mode not in ("full", "lora"):
        return
    if mode == "lora":
        raise ValueError("encoder_layers chooses the layers of train_encoder full; LoRA adapts them all")
    depth = len(layer_stack(model))
    if not 1 <= top_layers <= depth:
        raise ValueError(f"encoder_layers must be in 1..{depth} for this encoder, got {top_layers}")
    if (layer if layer >= 0 else depth + 1 + layer) != depth:  # hidden states: the embeddings', then each layer's
        raise ValueError(
            f"encoder_layers {top_layers} trains the top of the stack, but this encoder pools hidden layer {layer}: "
            "the layers above it never reach the embeddings, so nothing would learn; leave encoder_layers out (every "
            "layer trains) or pool the last layer (layer -1)"
        )


def set_attention_dropout(model: nn.Module, p: float) -> int:
    """Set the dropout on attention probabilities of every attention module (BERT's ``dropout`` of its
    self-attention, Llama's ``attention_dropout``) to ``p``; the number of modules set.

    Why: with attention dropout above 0, PyTorch's CPU attention falls back to materialising every attention matrix
    (and its dropout mask) for the backward pass; at 0 it runs the fused kernel (docs/scorer.md: what it saves and
    what it costs)."""
    if not 0.0 <= p < 1.0:
        raise ValueError(f"attention dropout must be in [0, 1), got {p}")
    count = 0
    for module in model.modules():
        if not type(module).__name__.endswith("Attention"):
            continue
        dropout = getattr(module, "dropout", None)
        if isinstance(dropout, nn.Dropout):
            dropout.p = p
            count += 1
        elif isinstance(getattr(module, "attention_dropout", None), float):
            llama_like: Any = module  # a float attribute, read at each forward
            llama_like.attention_dropout = p
            count += 1
    return count


def make_trainable(
    encoder: TextEncoder,
    mode: str,
    lora: LoraSpec | None = None,
    top_layers: int | None = None,
    attention_dropout: float | None = None,
    activation_checkpointing: bool = False,
) -> nn.Module:
    """Make the encoder's weights (``full``) or fresh LoRA adapters (``lora``) trainable; returns the module.

    ``top_layers`` (``full``) trains only the top N layers of the stack and what follows it (a final norm): the
    embeddings and lower layers keep their pretrained weights, and the backward pass stops below layer N.
    ``attention_dropout`` replaces the model's dropout on attention probabilities while it trains (None keeps
    it); eval mode, and so scoring, never applies it. ``activation_checkpointing`` keeps only each layer's input for
    the backward pass and recomputes the rest (dropout masks replayed): the same gradients in a fraction of the
    memory, for one more forward pass."""
    check_top_layers(encoder.model, mode, top_layers, lora, encoder.spec.layer)
    if attention_dropout is not None and not set_attention_dropout(encoder.model, attention_dropout):
        raise ValueError(f"{type(encoder.model).__name__}: no attention module found to set the dropout of")
    if activation_checkpointing:
        if not getattr(encoder.model, "supports_gradient_checkpointing", False):
            raise ValueError(f"{type(encoder.model).__name__} does not support activation checkpointing")
        encoder.model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    if mode == "full":
        model = encoder.model.requires_grad_(top_layers is None)
        if top_layers is not None:
            stack = layer_stack(model)
            last = id(next(iter(stack[-1].parameters())))
            names = [id(p) for p in model.parameters()]
            after = set(names[names.index(last) :])  # parameters listed after the stack's last layer
            for p in model.parameters():
                p.requires_grad_(id(p) in after)
            stack[len(stack) - top_layers :].requires_grad_(True)
        return model
    if mode == "lora":
        return add_lora(encoder, lora or LoraSpec())
    raise ValueError(f"train_encoder must be one of {TRAIN_ENCODER[1:]} here, got {mode!r}")


class TrainableFeatures:
    """Head inputs from a trainable encoder: ``module`` holds the trainable parameters.

    ``input_mode`` pair: context and reply embedded apart (line features with ``line_turns``); prompt: one embedding
    of each filled pair prompt, every negative one more encoder pass. Under ``torch.no_grad`` (validation, scoring)
    embeddings are computed in chunks without gradients. ``bf16`` runs the encoder under bfloat16 autocast (mixed
    precision: float32 weights, optimizer and embeddings out). The features come back on the CPU, as the frozen
    encoder's cached ones do: the encoder runs on its device (a GPU), the small head and the loop's tensors stay on
    the CPU, and gradients flow back across the copy.
    """

    def __init__(
        self,
        encoder: TextEncoder,
        template: PromptTemplate,
        pairs: PairSet,
        line_turns: int = 0,
        chunk: int = 256,
        bf16: bool = False,
        input_mode: str = "pair",
    ) -> None:
        if input_mode not in ("pair", "prompt"):
            raise ValueError(f"input_mode must be pair or prompt, got {input_mode!r}")
        if input_mode == "prompt" and line_turns:
            raise ValueError("line features are pair-mode inputs; a prompt reads its context's lines itself")
        self.encoder, self.template, self.pairs, self.chunk, self.bf16 = encoder, template, pairs, chunk, bf16
        self.input_mode, self.line_turns = input_mode, line_turns
        self.line_idx = PairFeatures.line_table(pairs, line_turns)

    def identity(self) -> dict:
        """What makes these embeddings, for a training checkpoint's fingerprint (``embedding_identity``)."""
        return embedding_identity(self.encoder, self.template, self.input_mode, self.line_turns)

    @property
    def module(self) -> nn.Module:
        return self.encoder.model

    def prepare(self, ctx: np.ndarray, resp: np.ndarray) -> None:
        return None

    def _chunked(self, n: int, embed) -> torch.Tensor:
        """``embed(start, stop)`` over all ``n`` rows: at once with gradients, in chunks without."""
        with torch.autocast(self.encoder.device.type, dtype=torch.bfloat16, enabled=self.bf16):
            if torch.is_grad_enabled():
                return embed(0, n)
            parts = [embed(s, min(s + self.chunk, n)) for s in range(0, n, self.chunk)]
        return torch.cat(parts) if parts else torch.zeros(0, self.encoder.dim)

    def _embed(self, texts: list[str], template: str, keep: str) -> torch.Tensor:
        return self._chunked(len(texts), lambda a, b: self.encoder.embed_with_grad(texts[a:b], template, keep))

    def _prompts(self, ctx: np.ndarray, resp: np.ndarray) -> tuple[torch.Tensor, None]:
        keys = ctx.astype(np.int64) * len(self.pairs.responses) + resp.astype(np.int64)
        uk, ik = np.unique(keys, return_inverse=True)
        cs = [self.pairs.contexts[k] for k in (uk // len(self.pairs.responses)).tolist()]
        rs = [self.pairs.responses[k] for k in (uk % len(self.pairs.responses)).tolist()]
        table = self._chunked(
            len(uk), lambda a, b: self.encoder.embed_pairs_with_grad(cs[a:b], rs[a:b], self.template.pair_template)
        )
        return table[torch.as_tensor(ik.reshape(ctx.shape), device=table.device)].cpu(), None

    def __call__(self, ctx: np.ndarray, resp: np.ndarray) -> tuple[torch.Tensor, torch.Tensor | None]:
        ctx, resp = np.asarray(ctx), np.asarray(resp)
        if self.input_mode == "prompt":
            return self._prompts(ctx, resp)
        lines = self.line_idx[ctx] if self.line_turns else np.zeros((*ctx.shape, 0), dtype=np.int64)
        uc, ic = np.unique(ctx, return_inverse=True)
        # replies and context lines are both embedded as replies: one call for all distinct ones
        ur, ir = np.unique(np.r_[resp.ravel(), np.maximum(lines, 0).ravel()], return_inverse=True)
        u = self._embed([self.pairs.contexts[i] for i in uc], self.template.context_template, "end")
        table = self._embed([self.pairs.responses[i] for i in ur], self.template.response_template, "start")
        u = u[torch.as_tensor(ic.reshape(ctx.shape))]
        v = table[torch.as_tensor(ir[: resp.size].reshape(resp.shape))]
        if self.line_turns:
            line_emb = table[torch.as_tensor(ir[resp.size :].reshape(lines.shape))]
            u = stack_lines(u, line_emb, torch.as_tensor(lines >= 0, device=line_emb.device))
        return u.cpu(), v.cpu()


def weights_digest(model: nn.Module) -> str:
    """A short digest of a model's weights: tells its embeddings apart from any other weights' in the cache."""
    h = hashlib.sha1()
    for name, tensor in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(tensor.detach().to(torch.float32).contiguous().cpu().numpy().tobytes())
    return h.hexdigest()[:16]


def finish_tuning(encoder: TextEncoder) -> EncoderSpec:
    """After fine-tuning: fold LoRA adapters in, freeze, and give the spec the weights' revision; a scorer saved
    with this encoder carries its weights (``encoder/`` in its directory). ``base_model`` keeps the pretrained model
    it started from (an encoder tuned again keeps the first one's)."""
    if encoder.spec.model != LOCAL_ENCODER:
        encoder.base_model = encoder.spec.model
    if hasattr(encoder.model, "merge_and_unload"):
        encoder.model = encoder.model.merge_and_unload()
    if getattr(encoder.model, "is_activation_checkpointing", False):
        encoder.model.activation_checkpointing_disable()
    encoder.model.eval().requires_grad_(False)
    spec = replace(encoder.spec, model=LOCAL_ENCODER, pooling=encoder.pooling, revision=weights_digest(encoder.model))
    encoder.adopt(spec)
    return spec


def merge_and_save(encoder: TextEncoder, directory: str | Path) -> EncoderSpec:
    """Fold the adapters into the weights, save model + tokenizer to ``directory``; the spec to load it."""
    directory = Path(directory)
    merged = encoder.model.merge_and_unload() if hasattr(encoder.model, "merge_and_unload") else encoder.model
    merged.save_pretrained(directory)
    encoder.tokenizer.save_pretrained(directory)
    encoder.model = merged.eval()
    return replace(encoder.spec, model=str(directory), pooling=encoder.pooling)

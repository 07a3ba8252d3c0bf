"""The PMI head: an MLP on frozen embeddings whose soft-capped output estimates PMI(c; r).

Two input modes (the paper's names): ``prompt`` reads one embedding of the filled pair prompt; ``pair``
reads separate context and response embeddings u, v as [u, v, u*v] (``pair_product=False`` gives the
paper's plain concatenation [u, v]).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

import torch
from torch import nn

__all__ = ["HeadConfig", "PMIHead", "head_input", "softcap"]

INPUT_MODES = ("pair", "prompt")


def softcap(x: torch.Tensor, cap: float) -> torch.Tensor:
    """cap * tanh(x / cap): identity near 0, bounded by +-cap, smooth everywhere."""
    return cap * torch.tanh(x / cap)


@dataclass(frozen=True)
class HeadConfig:
    """Shape of the head; saved with a scorer. ``dim`` (the embedding width) comes from the encoder when a
    scorer is trained (``with_dim``)."""

    dim: int | None = field(default=None, metadata={"help": "embedding width (default: the encoder's)"})
    input_mode: str = field(
        default="pair",
        metadata={"help": "pair: [u, v, u*v] of separate embeddings; prompt: one pair-prompt embedding (the paper's)"},
    )
    hidden: list[int] = field(default_factory=lambda: [256, 128], metadata={"help": "head hidden widths"})
    cap: float = field(default=20.0, metadata={"help": "softcap bound of the score"})
    pair_product: bool = field(default=True, metadata={"help": "add u*v to the pair features"})

    def __post_init__(self) -> None:
        if self.input_mode not in INPUT_MODES:
            raise ValueError(f"input_mode must be one of {INPUT_MODES}, got {self.input_mode!r}")
        if self.cap <= 0:
            raise ValueError("cap must be positive")
        object.__setattr__(self, "hidden", [int(h) for h in self.hidden])

    def with_dim(self, dim: int) -> HeadConfig:
        """This shape for ``dim``-wide embeddings."""
        return replace(self, dim=dim)

    @property
    def in_features(self) -> int:
        if self.dim is None:
            raise ValueError("HeadConfig.dim is unset: take it from the encoder with with_dim(encoder.dim)")
        if self.input_mode == "prompt":
            return self.dim
        return self.dim * (3 if self.pair_product else 2)

    def to_dict(self) -> dict:
        return asdict(self)


def head_input(config: HeadConfig, u: torch.Tensor, v: torch.Tensor | None = None) -> torch.Tensor:
    """The row a head of this config reads: ``u`` (prompt mode) or [u, v, u*v] / [u, v] (pair mode).

    Public so that non-neural baselines (e.g. KDE) can be fitted on exactly the head's inputs.
    """
    if config.input_mode == "prompt":
        return u
    if v is None:
        raise ValueError("pair mode needs context and response embeddings")
    parts = [u, v, u * v] if config.pair_product else [u, v]
    return torch.cat(parts, dim=-1)


class PMIHead(nn.Module):
    """Linear-PReLU stack ending in one unit, soft-capped: the PMI estimate for each input row."""

    def __init__(self, config: HeadConfig) -> None:
        super().__init__()
        self.config = config
        layers: list[nn.Module] = []
        width = config.in_features
        for h in config.hidden:
            layers += [nn.Linear(width, h), nn.PReLU()]
            width = h
        layers.append(nn.Linear(width, 1))
        self.mlp = nn.Sequential(*layers)

    def features(self, u: torch.Tensor, v: torch.Tensor | None = None) -> torch.Tensor:
        return head_input(self.config, u, v)

    def forward(self, u: torch.Tensor, v: torch.Tensor | None = None) -> torch.Tensor:
        """Scores of shape u.shape[:-1]: prompt embeddings ``u``, or context ``u`` with response ``v``."""
        return softcap(self.mlp(self.features(u, v)).squeeze(-1), self.config.cap)

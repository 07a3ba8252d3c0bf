"""The PMI head: an MLP on frozen embeddings whose soft-capped output estimates PMI(c; r).

Two input modes (the paper's names): ``prompt`` reads one embedding of the filled pair prompt; ``pair``
reads separate context and response embeddings u, v as [u, v, u*v] (``pair_product=False`` gives the
paper's plain concatenation [u, v]).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch
from torch import nn

__all__ = ["HeadConfig", "PMIHead", "head_input", "softcap"]

INPUT_MODES = ("pair", "prompt")


def softcap(x: torch.Tensor, cap: float) -> torch.Tensor:
    """cap * tanh(x / cap): identity near 0, bounded by +-cap, smooth everywhere."""
    return cap * torch.tanh(x / cap)


@dataclass
class HeadConfig:
    """Shape of the head; saved with a scorer."""

    dim: int
    input_mode: str = "pair"
    hidden: Sequence[int] = (256, 128)
    cap: float = 20.0
    pair_product: bool = True

    def __post_init__(self) -> None:
        if self.input_mode not in INPUT_MODES:
            raise ValueError(f"input_mode must be one of {INPUT_MODES}, got {self.input_mode!r}")
        if self.cap <= 0:
            raise ValueError("cap must be positive")
        self.hidden = tuple(int(h) for h in self.hidden)

    @property
    def in_features(self) -> int:
        if self.input_mode == "prompt":
            return self.dim
        return self.dim * (3 if self.pair_product else 2)

    def to_dict(self) -> dict:
        return {**asdict(self), "hidden": list(self.hidden)}


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

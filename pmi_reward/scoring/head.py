"""The PMI head: an MLP on frozen embeddings whose soft-capped output estimates PMI(c; r).

Two input modes (the paper's names): ``prompt`` reads one embedding of the filled pair prompt; ``pair``
reads separate context and response embeddings u, v as [u, v, u*v] (``pair_product=False`` gives the
paper's plain concatenation [u, v]).

``line_turns = N > 0`` (pair mode) also shows the head the context's N newest lines, each embedded as a reply:
the context side is then a stack (..., 1 + N, d) of u and the lines (newest first, zero rows where the context is
shorter), and the head reads [v * last line, cos(line_i, v) for each line, max_i cos(line_i, v), cos(u, v)] on
top of [u, v, u*v]. A reply is an answer to the last turn, not a copy of any line: a frozen encoder's pooled
context embedding hides both facts, these features expose them.

``residual = "cosine"`` (pair mode) keeps what the encoder already knows: the score is
softcap(a * cos(u, v) + b + MLP correction), with u the context embedding (the whole context as the scorer cuts
it, not its lines) and a, b learned scalars. The MLP's last layer starts at zero, so an untrained head scores
the scaled cosine, which ranks like the untrained cosine baseline; training (``fit_prior`` first sets a, b to the
objective's best scaled cosine) then learns only a correction of it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace

import torch
from torch import nn

__all__ = ["HeadConfig", "PMIHead", "head_input", "softcap", "context_embedding"]

INPUT_MODES = ("pair", "prompt")
RESIDUALS = ("none", "cosine")
# the residual head's start before ``fit_prior``: a = 10, b = -10 * 0.15 (MiniLM's cosine of a random
# (context, reply) pair is ~0.1, of a true one ~0.3): about -0.5 nat for a random reply, +1.5 for a true one
PRIOR_SCALE, PRIOR_CENTRE = 10.0, 0.15


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
    line_turns: int = field(
        default=0, metadata={"help": "pair mode: compare the reply with the context's N newest lines too (0: off)"}
    )
    residual: str = field(
        default="none",
        metadata={
            "help": "none: the MLP is the score; cosine (pair mode): softcap(a * cos(u, v) + b + MLP), the MLP a "
            "correction starting at 0, a and b learned"
        },
    )

    def __post_init__(self) -> None:
        if self.input_mode not in INPUT_MODES:
            raise ValueError(f"input_mode must be one of {INPUT_MODES}, got {self.input_mode!r}")
        if not math.isfinite(self.cap) or self.cap <= 0:  # an infinite or NaN cap makes every score NaN
            raise ValueError(f"cap must be a positive finite number, got {self.cap!r}")
        if self.line_turns < 0 or (self.line_turns and self.input_mode != "pair"):
            raise ValueError("line_turns must be >= 0, and is only used in pair mode")
        if self.residual not in RESIDUALS or (self.residual != "none" and self.input_mode != "pair"):
            raise ValueError(f"residual must be one of {RESIDUALS} (cosine: pair mode only), got {self.residual!r}")
        if self.dim is not None and self.dim < 1:
            raise ValueError(f"dim must be >= 1 (or left out: the encoder's width), got {self.dim}")
        object.__setattr__(self, "hidden", [int(h) for h in self.hidden])
        if any(h < 1 for h in self.hidden):  # a width of 0 scores every pair alike; a negative one cannot be built
            raise ValueError(f"hidden widths must be >= 1, got {self.hidden}")

    def with_dim(self, dim: int) -> HeadConfig:
        """This shape for ``dim``-wide embeddings."""
        return replace(self, dim=dim)

    @property
    def in_features(self) -> int:
        if self.dim is None:
            raise ValueError("HeadConfig.dim is unset: take it from the encoder with with_dim(encoder.dim)")
        if self.input_mode == "prompt":
            return self.dim
        width = self.dim * (3 if self.pair_product else 2)
        return width + (self.dim + self.line_turns + 2 if self.line_turns else 0)

    def to_dict(self) -> dict:
        return asdict(self)


def _cosine(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a * b).sum(-1) / (a.norm(dim=-1) * b.norm(dim=-1)).clamp(min=1e-8)


def line_features(u: torch.Tensor, lines: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """[v * last line, cos(line_i, v) ..., max_i cos(line_i, v), cos(u, v)] for lines (..., N, d), newest first;
    a missing line (a zero row) has cosine -1, so it never looks like the reply."""
    present = lines.norm(dim=-1) > 0
    cos = _cosine(lines, v.unsqueeze(-2)).masked_fill(~present, -1.0)
    extra = [cos.max(-1, keepdim=True).values, _cosine(u, v).unsqueeze(-1)]
    return torch.cat([lines[..., 0, :] * v, cos, *extra], dim=-1)


def context_embedding(config: HeadConfig, u: torch.Tensor) -> torch.Tensor:
    """The context's own embedding (..., d) out of what a pair-mode head reads as ``u`` (a stack with its lines
    when ``line_turns`` is set)."""
    return u[..., 0, :] if config.line_turns else u


def head_input(config: HeadConfig, u: torch.Tensor, v: torch.Tensor | None = None) -> torch.Tensor:
    """The row a head of this config reads: ``u`` (prompt mode) or [u, v, u*v] / [u, v] (pair mode), plus the
    line features when ``line_turns`` is set (``u`` is then the stack of the context and its lines).

    Public so that non-neural baselines (e.g. KDE) can be fitted on exactly the head's inputs.
    """
    if config.input_mode == "prompt":
        return u
    if v is None:
        raise ValueError("pair mode needs context and response embeddings")
    lines = None
    if config.line_turns:
        if u.dim() < 2 or u.shape[-2] != config.line_turns + 1:
            raise ValueError(
                f"line_turns={config.line_turns} needs contexts of shape (..., {config.line_turns + 1}, d)"
            )
        u, lines = u[..., 0, :], u[..., 1:, :]
    parts = [u, v, u * v] if config.pair_product else [u, v]
    if lines is not None:
        parts.append(line_features(u, lines, v))
    return torch.cat(parts, dim=-1)


class PMIHead(nn.Module):
    """Linear-PReLU stack ending in one unit, soft-capped: the PMI estimate for each input row. With
    ``residual="cosine"`` the stack is a correction added to ``prior_scale * cos(u, v) + prior_shift``."""

    def __init__(self, config: HeadConfig) -> None:
        super().__init__()
        self.config = config
        layers: list[nn.Module] = []
        width = config.in_features
        for h in config.hidden:
            layers += [nn.Linear(width, h), nn.PReLU()]
            width = h
        last = nn.Linear(width, 1)
        self.mlp = nn.Sequential(*layers, last)
        if config.residual == "cosine":
            nn.init.zeros_(last.weight)  # the correction starts at exactly 0: the head starts as the cosine
            nn.init.zeros_(last.bias)
            self.prior_scale = nn.Parameter(torch.tensor(PRIOR_SCALE))
            self.prior_shift = nn.Parameter(torch.tensor(-PRIOR_SCALE * PRIOR_CENTRE))

    def features(self, u: torch.Tensor, v: torch.Tensor | None = None) -> torch.Tensor:
        return head_input(self.config, u, v)

    def prior_cosine(self, u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """cos(context embedding, reply embedding), shape u.shape[:-1] (without the lines' axis)."""
        return _cosine(context_embedding(self.config, u), v)

    def scores_and_correction(
        self, u: torch.Tensor, v: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The scores and, for a residual head, the MLP's correction before the cap (None otherwise): training
        penalises its size (``TrainConfig.correction_l2``) so that it stays a correction."""
        out = self.mlp(self.features(u, v)).squeeze(-1)
        if self.config.residual == "none":
            return softcap(out, self.config.cap), None
        assert v is not None  # residual heads are pair mode (HeadConfig checks)
        prior = self.prior_scale * self.prior_cosine(u, v) + self.prior_shift
        return softcap(prior + out, self.config.cap), out

    def forward(self, u: torch.Tensor, v: torch.Tensor | None = None) -> torch.Tensor:
        """Scores of shape u.shape[:-1]: prompt embeddings ``u``, or context ``u`` with response ``v``."""
        return self.scores_and_correction(u, v)[0]

    def prior_parameters(self) -> list[nn.Parameter]:
        """The residual head's a and b (none otherwise): the training loop exempts them from weight decay, which
        would pull the cosine's scale toward 0."""
        return [self.prior_scale, self.prior_shift] if self.config.residual == "cosine" else []

    def fit_prior(
        self,
        cos_pos: torch.Tensor,
        cos_neg: torch.Tensor,
        objective: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        steps: int = 100,
    ) -> None:
        """Set a, b to the scaled cosine that optimises ``objective`` on cosines of positives (B,) and negatives
        (B, K): the best score the cosine alone gives (for NWJ: the best PMI estimate that is a function of the
        cosine), so that training starts there. Keeps the current a, b if the fit ends anywhere not finite or with
        a <= 0."""
        if self.config.residual != "cosine":
            raise ValueError("fit_prior needs a head with residual='cosine'")
        ab = torch.stack([self.prior_scale.detach(), self.prior_shift.detach()]).requires_grad_(True)
        optim = torch.optim.LBFGS([ab], lr=1.0, max_iter=steps, line_search_fn="strong_wolfe")
        cap = self.config.cap

        def closure() -> torch.Tensor:
            optim.zero_grad()
            value = objective(softcap(ab[0] * cos_pos + ab[1], cap), softcap(ab[0] * cos_neg + ab[1], cap))
            value.backward()
            return value

        optim.step(closure)
        if torch.isfinite(ab).all() and ab[0] > 0:
            with torch.no_grad():
                self.prior_scale.copy_(ab[0])
                self.prior_shift.copy_(ab[1])

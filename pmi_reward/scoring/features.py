"""Head inputs for (context, response) index pairs, embedded once and on demand.

The same three functions embed contexts, responses and pair prompts for training and for scoring, so
a trained head always sees inputs made the same way. ``PairFeatures`` serves a ``PairSet`` to the
training loop: in ``pair`` mode each distinct context and response is encoded once, ever (negatives
cost nothing); in ``prompt`` mode each new (context, response) combination is one more encoder call. With
``line_turns`` the context side also carries its newest lines, embedded as replies (``stack_lines``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from ..data.pairs import PairSet
from .encoder import TextEncoder
from .templates import PromptTemplate

__all__ = [
    "embed_contexts",
    "embed_responses",
    "embed_prompts",
    "newest_lines",
    "stack_lines",
    "embedding_identity",
    "PairFeatures",
    "TensorFeatures",
]


def newest_lines(context: str, n: int) -> list[str]:
    """The context's last ``n`` non-empty lines (its turns), newest first, as ``PairSet`` interns them."""
    lines = [line.strip() for line in context.split("\n") if line.strip()]
    return lines[::-1][:n]


def stack_lines(u: torch.Tensor, lines: torch.Tensor, present: torch.Tensor) -> torch.Tensor:
    """(..., 1 + N, d): the context embeddings ``u`` (..., d) above their line embeddings (..., N, d), with the
    rows of missing lines (``present`` False) zeroed."""
    return torch.cat([u.unsqueeze(-2), lines * present.unsqueeze(-1).to(lines.dtype)], dim=-2)


def embed_contexts(
    encoder: TextEncoder, template: PromptTemplate, texts: Sequence[str], progress: bool | str = False
) -> np.ndarray:
    return encoder.encode(texts, template.context_template, keep="end", progress=progress)


def embed_responses(
    encoder: TextEncoder, template: PromptTemplate, texts: Sequence[str], progress: bool | str = False
) -> np.ndarray:
    return encoder.encode(texts, template.response_template, keep="start", progress=progress)


def embed_prompts(
    encoder: TextEncoder,
    template: PromptTemplate,
    contexts: Sequence[str],
    responses: Sequence[str],
    progress: bool | str = False,
) -> np.ndarray:
    return encoder.encode_pairs(contexts, responses, template.pair_template, progress=progress)


def embedding_identity(encoder: TextEncoder, template: PromptTemplate, input_mode: str, line_turns: int) -> dict:
    """What makes a run's embeddings: the encoder's settings (all but its batch size) and pooling, the template,
    the input mode and the line features; a training checkpoint's fingerprint holds it."""
    spec = {k: v for k, v in encoder.spec.to_dict().items() if k != "encode_batch_size"}
    return {
        "encoder": {**spec, "pooling": encoder.pooling},
        "template": template.to_dict(),
        "input_mode": input_mode,
        "line_turns": line_turns,
    }


class TensorFeatures:
    """Precomputed tables: ``u[ctx]`` with ``v[resp]`` (pair mode), or ``u[ctx]`` alone when ``v`` is None
    and ctx indexes rows directly (toy problems and tests)."""

    def __init__(self, u: torch.Tensor, v: torch.Tensor | None = None) -> None:
        self.u, self.v = u, v

    def prepare(self, ctx: np.ndarray, resp: np.ndarray) -> None:
        return None

    def identity(self) -> dict:
        """What these features are (their tables), for a training checkpoint's fingerprint."""
        return {"u": self.u, "v": self.v}

    def __call__(self, ctx: np.ndarray, resp: np.ndarray) -> tuple[torch.Tensor, torch.Tensor | None]:
        c, r = torch.as_tensor(ctx), torch.as_tensor(resp)
        return (self.u[c], None) if self.v is None else (self.u[c], self.v[r])


class PairFeatures:
    """Embeddings of a PairSet's texts, computed lazily the first time an index pair is asked for."""

    def __init__(
        self,
        encoder: TextEncoder,
        template: PromptTemplate,
        pairs: PairSet,
        input_mode: str,
        progress: bool = True,
        line_turns: int = 0,
    ) -> None:
        self.encoder, self.template, self.pairs = encoder, template, pairs
        self.input_mode, self.progress, self.line_turns = input_mode, progress, line_turns
        d = encoder.dim
        if input_mode == "pair":
            self.u = torch.zeros(len(pairs.contexts), d)
            self.v = torch.zeros(len(pairs.responses), d)
            self.have_u = np.zeros(len(pairs.contexts), dtype=bool)
            self.have_v = np.zeros(len(pairs.responses), dtype=bool)
            self.line_idx = self.line_table(pairs, line_turns)
        else:
            self.rows: dict[int, int] = {}
            self.table = torch.zeros(0, d)

    @staticmethod
    def line_table(pairs: PairSet, n: int) -> np.ndarray:
        """(contexts, n) response-table indices of each context's newest lines, newest first; -1 where none."""
        table = np.full((len(pairs.contexts), n), -1, dtype=np.int64)
        for c in range(len(pairs.contexts)) if n else ():
            own = pairs.lines[pairs.line_ptr[c] : pairs.line_ptr[c + 1]][::-1][:n]
            table[c, : len(own)] = own
        return table

    def identity(self) -> dict:
        """What makes these embeddings, for a training checkpoint's fingerprint (``embedding_identity``)."""
        return embedding_identity(self.encoder, self.template, self.input_mode, self.line_turns)

    def _key(self, ctx: np.ndarray, resp: np.ndarray) -> np.ndarray:
        return np.asarray(ctx, dtype=np.int64) * len(self.pairs.responses) + np.asarray(resp, dtype=np.int64)

    def prepare(self, ctx: np.ndarray, resp: np.ndarray) -> None:
        """Encode whatever these index pairs need that is not embedded yet."""
        if self.input_mode == "pair":
            need = np.unique(ctx[~self.have_u[ctx]])
            if len(need):
                texts = [self.pairs.contexts[i] for i in need]
                self.u[need] = torch.from_numpy(
                    embed_contexts(self.encoder, self.template, texts, self.progress and "contexts")
                )
                self.have_u[need] = True
            if self.line_turns:
                lines = self.line_idx[np.unique(ctx)].ravel()
                resp = np.r_[resp, lines[lines >= 0]]
            need = np.unique(resp[~self.have_v[resp]])
            if len(need):
                texts = [self.pairs.responses[i] for i in need]
                self.v[need] = torch.from_numpy(
                    embed_responses(self.encoder, self.template, texts, self.progress and "responses")
                )
                self.have_v[need] = True
            return
        keys = np.unique(self._key(ctx, resp))
        new = [k for k in keys.tolist() if k not in self.rows]
        if not new:
            return
        n_resp = len(self.pairs.responses)
        cs = [self.pairs.contexts[k // n_resp] for k in new]
        rs = [self.pairs.responses[k % n_resp] for k in new]
        emb = torch.from_numpy(embed_prompts(self.encoder, self.template, cs, rs, self.progress and "pair prompts"))
        base = len(self.table)
        self.table = torch.cat([self.table, emb])
        self.rows.update((k, base + j) for j, k in enumerate(new))

    def __call__(self, ctx: np.ndarray, resp: np.ndarray) -> tuple[torch.Tensor, torch.Tensor | None]:
        if self.input_mode == "pair":
            c = torch.as_tensor(ctx)
            u, v = self.u[c], self.v[torch.as_tensor(resp)]
            if self.line_turns:
                idx = torch.as_tensor(self.line_idx)[c]
                u = stack_lines(u, self.v[idx.clamp(min=0)], idx >= 0)
            return u, v
        rows = [self.rows[k] for k in self._key(ctx, resp).ravel().tolist()]
        return self.table[torch.as_tensor(rows)].view(*np.shape(ctx), -1), None

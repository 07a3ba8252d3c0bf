"""Positive (context, response) pairs with text tables and per-dialogue candidate pools for negatives.

Texts are interned: ``contexts`` and ``responses`` are tables of distinct strings and pairs hold indices
into them, so "a negative never equals the gold response" is an index comparison and each distinct text
is encoded once. ``responses`` also holds every turn that may serve as an in-dialogue negative: the
other turns of the dialogue (from dialogues), or the other responses and the context lines that share a
``dialog_key`` (from pair files).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .dialogues import Dialogue
from .records import DataError, read_records, require_text, spans_rows

__all__ = ["PairSet", "csr", "load_pairs", "join_turns"]

logger = logging.getLogger(__name__)


def join_turns(turns: Sequence[str]) -> str:
    """How a context is written: its turns, oldest first, one per line (a turn's own line breaks become spaces, as a
    chat prompt's messages are read: a line is a turn for the line features, negatives and turn limits alike)."""
    return "\n".join(" ".join(t.split("\n")).strip() for t in turns)


class _Interner:
    def __init__(self) -> None:
        self.index: dict[str, int] = {}

    def __call__(self, text: str) -> int:
        return self.index.setdefault(text, len(self.index))

    def table(self) -> list[str]:
        return list(self.index)


@dataclass
class PairSet:
    """Positive pairs: ``ctx[i]``/``resp[i]`` index the text tables; ``group[i]`` is the dialogue.

    ``pool[pool_ptr[g]:pool_ptr[g + 1]]`` are the response-table indices of dialogue ``g``'s turns, the
    candidates for in-dialogue negatives; ``lines[line_ptr[c]:line_ptr[c + 1]]`` are those of context
    ``c``'s own lines (parroting negatives). ``extras`` carries other per-pair columns (e.g. ratings).
    ``mined[kind]`` is a (ptr, pool) table of mined hard negatives per context (``pmi_reward.data.mining``; the
    scrambled kind's is per gold reply).
    ``context_turns`` is how many turns a context keeps at most (None when unknown, e.g. for pair files): a
    scorer trained on these pairs reads contexts the same way.
    ``keyed`` is whether the pairs' dialogues are known: False for pairs given without keys (a pair file with no key
    column), where each pair is a dialogue of its own although several may be rated replies to one context.
    """

    contexts: list[str]
    responses: list[str]
    ctx: np.ndarray
    resp: np.ndarray
    group: np.ndarray
    pool_ptr: np.ndarray
    pool: np.ndarray
    line_ptr: np.ndarray
    lines: np.ndarray
    extras: dict[str, list] | None = None
    context_turns: int | None = None
    mined: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    keyed: bool = True

    def __len__(self) -> int:
        return len(self.ctx)

    @property
    def context_texts(self) -> list[str]:
        return [self.contexts[i] for i in self.ctx]

    @property
    def response_texts(self) -> list[str]:
        return [self.responses[i] for i in self.resp]

    @classmethod
    def _build(
        cls,
        items: Sequence[tuple[str, str, str, Sequence[str]]],
        extras: dict[str, list] | None = None,
        context_turns: int | None = None,
        keyed: bool = True,
    ) -> PairSet:
        """From (context, response, dialogue key, the dialogue's candidate turns) tuples."""
        contexts, responses, groups = _Interner(), _Interner(), _Interner()
        ctx, resp, group = [], [], []
        members: dict[int, dict[int, None]] = {}
        for context, response, key, turns in items:
            g = groups(key)
            ctx.append(contexts(context))
            resp.append(responses(response))
            group.append(g)
            candidates = members.setdefault(g, {})
            candidates[resp[-1]] = None
            for turn in turns:
                candidates[responses(turn)] = None
        context_table = contexts.table()
        context_lines = [[responses(line.strip()) for line in c.split("\n") if line.strip()] for c in context_table]
        ptr, pool = csr([list(members[g]) for g in range(len(groups.index))])
        line_ptr, lines = csr(context_lines)
        return cls(
            context_table,
            responses.table(),
            np.asarray(ctx, dtype=np.int64),
            np.asarray(resp, dtype=np.int64),
            np.asarray(group, dtype=np.int64),
            ptr,
            pool,
            line_ptr,
            lines,
            extras,
            context_turns,
            keyed=keyed,
        )

    @classmethod
    def from_dialogues(
        cls,
        dialogues: Sequence[Dialogue],
        max_context_turns: int = 3,
        min_context_turns: int = 1,
        max_pairs_per_dialogue: int | None = None,
        seed: int = 0,
    ) -> PairSet:
        """Every turn with at least ``min_context_turns`` before it is a response; its context is the
        ``max_context_turns`` turns before it (blank turns left out). ``max_pairs_per_dialogue`` samples positions
        (seeded)."""
        if max_context_turns < 1 or min_context_turns < 1 or min_context_turns > max_context_turns:
            raise ValueError("need 1 <= min_context_turns <= max_context_turns")
        rng = np.random.default_rng(seed)
        items = []
        for d in dialogues:
            # each turn as a context line reads it (join_turns), so that a turn is one text whether it is a context
            # line, a reply or a candidate of its dialogue (a multi-line turn was two texts: graded credit for a copy);
            # a blank one is no turn, as load_dialogues drops it (a Dialogue built in Python: an empty reply as a
            # positive, a blank context line)
            turns = [turn for turn in (join_turns([t]) for t in d.turns) if turn]
            positions = list(range(min_context_turns, len(turns)))
            if max_pairs_per_dialogue is not None and len(positions) > max_pairs_per_dialogue:
                positions = sorted(rng.choice(positions, max_pairs_per_dialogue, replace=False).tolist())
            for n, t in enumerate(positions):
                context = join_turns(turns[max(0, t - max_context_turns) : t])
                items.append((context, turns[t], d.id, turns if n == 0 else ()))
        if not items:
            raise DataError("no context-response pairs: every dialogue is shorter than min_context_turns + 1")
        return cls._build(items, context_turns=max_context_turns)

    @classmethod
    def from_pairs(
        cls,
        contexts: Sequence[str],
        responses: Sequence[str],
        keys: Sequence[str] | None = None,
        extras: dict[str, list] | None = None,
        max_context_turns: int | None = None,
    ) -> PairSet:
        """Ready-made pairs; context lines and same-key responses become in-dialogue candidates.

        Without ``keys`` every pair is its own dialogue. A context is written as ``join_turns`` writes one (its
        non-blank lines, stripped, are its turns); ``max_context_turns`` keeps its last N, as a scorer trained on
        them reads contexts; every line stays an in-dialogue candidate.
        """
        if len(contexts) != len(responses) or (keys is not None and len(keys) != len(contexts)):
            raise ValueError("contexts, responses and keys must have the same length")
        if max_context_turns is not None and max_context_turns < 1:
            raise ValueError("max_context_turns must be >= 1 or None")
        keyed = keys is not None
        names = keys if keys is not None else [f"#{i}" for i in range(len(contexts))]
        items = []
        for c, r, k in zip(contexts, responses, names, strict=True):
            lines = [line.strip() for line in c.split("\n") if line.strip()]
            kept = join_turns(lines[-max_context_turns:] if max_context_turns else lines)
            # read as a context line reads it (join_turns: stripped, line breaks as spaces): one turn, one text (a
            # multi-line reply was two, and its context-line copy an in-dialogue negative of its own pair)
            items.append((kept, join_turns([r]), k, lines))
        return cls._build(items, extras, context_turns=max_context_turns, keyed=keyed)

    @classmethod
    def concat(cls, sets: Sequence[PairSet]) -> PairSet:
        """One PairSet holding the pairs of ``sets`` (their dialogues kept apart; extras dropped unless shared)."""
        if not sets:
            raise ValueError("concat needs at least one PairSet")
        items = []
        for n, pairs in enumerate(sets):
            seen: set[int] = set()
            for i in range(len(pairs)):
                g = int(pairs.group[i])
                turns = (
                    ()
                    if g in seen
                    else [pairs.responses[r] for r in pairs.pool[pairs.pool_ptr[g] : pairs.pool_ptr[g + 1]]]
                )
                seen.add(g)
                items.append((pairs.contexts[pairs.ctx[i]], pairs.responses[pairs.resp[i]], f"{n}:{g}", turns))
        columns = set.intersection(*(set(p.extras or {}) for p in sets))
        extras = {c: [v for p in sets for v in (p.extras or {})[c]] for c in sorted(columns)} or None
        kept = {p.context_turns for p in sets}
        context_turns = kept.pop() if len(kept) == 1 else None
        return cls._build(items, extras, context_turns, keyed=all(p.keyed for p in sets))


def csr(rows: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Lists of indices as one (ptr, pool) table: ``pool[ptr[i]:ptr[i + 1]]`` is ``rows[i]``."""
    ptr = np.zeros(len(rows) + 1, dtype=np.int64)
    ptr[1:] = np.cumsum([len(r) for r in rows])
    return ptr, np.fromiter((x for r in rows for x in r), dtype=np.int64, count=int(ptr[-1]))


def load_pairs(
    path: str | Path,
    context_column: str = "context",
    response_column: str = "response",
    key_column: str | None = "dialog_key",
    extra_columns: Sequence[str] = (),
    max_context_turns: int | None = None,
    require_key: bool = False,
) -> PairSet:
    """A pair file (CSV/TSV/JSONL/JSON) with context and response columns and an optional dialogue key.

    ``extra_columns`` (e.g. human ratings, analytic PMI parts) are kept as floats where they parse;
    ``max_context_turns`` keeps each context's last N lines (``PairSet.from_pairs``); ``require_key``: a missing
    ``key_column`` is a DataError (a key named by the user), not a file of one dialogue per row.
    """
    records = read_records(path)
    contexts = require_text(records, path, context_column, allow_empty=True)
    responses = require_text(records, path, response_column)
    suffix = Path(path).suffix.lower()
    # a reply is read as one line: later lines that read as rows may be rows swallowed (contexts are multi-line by
    # design, and a quote left open in one is caught when it makes a short row: read_records)
    if suffix in (".csv", ".tsv"):
        delimiter = "\t" if suffix == ".tsv" else ","
        odd = [n for n, r in enumerate(responses, 1) if spans_rows([r], len(records[0]), delimiter)]
        if odd:  # a warning, not an error: a two-column file's multi-line reply with a comma reads the same way
            logger.warning(
                "%s, row %d, field %r (and %d more): a reply whose later lines read as whole rows; if a field opened "
                "with an unclosed quote and ran on over the rows after it, those rows are read as this reply",
                path,
                odd[0],
                response_column,
                len(odd) - 1,
            )
    keys = None
    keyed = key_column is not None and any(key_column in r for r in records)  # any row: a JSON record may omit it
    if require_key and key_column and not keyed:
        raise DataError(f"{path}: missing column {key_column!r} (the dialogue key; columns: {sorted(records[0])})")
    if keyed and key_column:  # a dialogue id: text, or a whole number as JSON files write ids; a row without: named
        ids = [
            {**r, key_column: str(v)} if isinstance(v := r.get(key_column), int) and not isinstance(v, bool) else r
            for r in records
        ]
        keys = require_text(ids, path, key_column)
    extras = {}
    for column in extra_columns:
        if not any(column in r for r in records):  # any row: a JSON record may omit it
            raise DataError(f"{path}: missing column {column!r} (columns: {sorted(records[0])})")
        extras[column] = [_maybe_float(r.get(column)) for r in records]
    return PairSet.from_pairs(contexts, responses, keys, extras or None, max_context_turns)


def _maybe_float(value):
    """A cell as a float where it reads as one; anything else as it is, for the caller to name its row (JSON's
    true/false too: float() read them as 1.0 and 0.0, a rating or a probability nobody wrote)."""
    if isinstance(value, bool):
        return value
    try:
        return float(value)
    except (TypeError, ValueError):
        return value

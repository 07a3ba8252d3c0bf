"""Negative responses for each positive pair: random, in-dialogue, in-context, and mined look-alikes.

- random: the response of a uniformly chosen pair of another dialogue whose text is not the gold reply's: a draw
  from the marginal p(r) given r != the gold text. With random negatives alone the NWJ optimum is therefore
  log p(c, r) / q(c, r) ~ PMI(c; r) - log(1 - p(r | c)): PMI where a reply's exact text is rare among a context's
  replies (free text), above it for a text that takes much of a context's mass (a corpus of a few repeated replies).
- in-dialogue: another turn of the same conversation (on topic, but not the reply to this context); any turn but
  the gold reply, so also the context's own lines (in a short dialogue mostly these), which overlaps
  ``in-context``.
- in-context: one of the context's own lines, which teaches the scorer that parroting the context is
  not an answer (a frozen-embedding head otherwise rates an exact copy as the most related reply).
- lexical: a reply from another dialogue that shares the most words with the context (TF-IDF): it looks on
  topic without answering (``pmi_reward.data.mining``).
- nearest: a reply from another dialogue whose embedding is nearest the context's (the encoder's own
  confusions).
- scrambled: the gold reply's own words in a random order: every content word of an answer and none of its
  language, which a scorer that reads bags of words cannot tell from the answer (word salad, a way a policy drifts).

Hard negatives move the optimum from PMI to log p(c, r) / q(c, r) for the mixture q; they trade exact
calibration for a reward that cannot be gamed by copying. A negative never equals the gold response.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .pairs import PairSet

__all__ = ["KINDS", "NegativeSpec", "sample_negatives", "random_from_batch"]

_TRIES = 32


@dataclass(frozen=True)
class NegativeSpec:
    """How many negatives of each kind per positive: the one place their defaults live.

    The default (3 random, 1 line of the context) is the mix for a scorer with line features
    (``HeadConfig.line_turns``); what each kind does to the score's meaning: docs/scorer.md.

    Commands that need another mix (the paper's study: 3 random only, and 3 at test; issue 9's test protocol: 5
    random; ``make scorer``: 8 random, chosen on validation in recipes/scorer/RESULTS.md) set it in their YAML config.
    An empty mix (all zero) is valid for evaluation without negatives; sampling needs one.
    """

    k_random: int = field(default=3, metadata={"help": "negatives per positive: responses of other dialogues"})
    k_in_dialogue: int = field(default=0, metadata={"help": "negatives per positive: other turns of its dialogue"})
    k_context: int = field(
        default=1,
        metadata={"help": "negatives per positive: lines of its own context (so that parroting is not rewarded)"},
    )
    k_lexical: int = field(
        default=0,
        metadata={
            "help": "negatives per positive: replies of other dialogues sharing the most words with the context "
            "(mined once over every context x reply: time grows as pairs squared)"
        },
    )
    k_nearest: int = field(
        default=0,
        metadata={
            "help": "negatives per positive: replies of other dialogues nearest the context by the encoder "
            "(mined once over every context x reply: time grows as pairs squared)"
        },
    )
    k_scrambled: int = field(
        default=0,
        metadata={"help": "negatives per positive: its own reply's words scrambled (so that word salad is not paid)"},
    )

    @property
    def k(self) -> int:
        return sum(self.counts().values())

    def counts(self) -> dict[str, int]:
        """The count of each kind, in the order of ``sample_negatives``' columns."""
        return {kind: getattr(self, f"k_{kind}") for kind in KINDS}

    def __post_init__(self) -> None:
        if min(self.counts().values()) < 0:
            raise ValueError(f"negative counts must be >= 0, got {self}")


KINDS = ("random", "in_dialogue", "context", "lexical", "nearest", "scrambled")


def _random(pairs: PairSet, rows: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Response indices of uniformly drawn other pairs whose text is not the gold reply's, from another dialogue
    where one exists (a corpus of one dialogue: from its other turns)."""
    n = len(pairs)
    out = np.full(len(rows), -1, dtype=np.int64)
    todo = np.arange(len(rows))
    for _ in range(_TRIES):
        if not len(todo):
            return out
        other = rng.integers(0, n, size=len(todo))
        cand = pairs.resp[other]
        ok = (cand != pairs.resp[rows[todo]]) & (pairs.group[other] != pairs.group[rows[todo]])
        out[todo[ok]] = cand[ok]
        todo = todo[~ok]
    if len(todo):  # rare: a dialogue that holds most pairs, or a text that is most pairs' gold
        out[todo] = _random_exact(pairs, rows[todo], rng)
    return out


def _random_exact(pairs: PairSet, rows: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """``_random`` for rows that random tries missed: a uniform draw among the other dialogues' pairs (by skipping
    the row's own dialogue in a group-sorted order; in a corpus of one dialogue, among its pairs), then exact scans
    for what is left."""
    order = np.argsort(pairs.group, kind="stable")
    size = np.bincount(pairs.group, minlength=int(pairs.group.max()) + 1)
    start = np.concatenate([[0], np.cumsum(size)[:-1]])
    g, gold = pairs.group[rows], pairs.resp[rows]
    others = len(pairs) - size[g]
    out = np.full(len(rows), -1, dtype=np.int64)
    todo = np.flatnonzero(others > 0)
    for _ in range(_TRIES):
        if not len(todo):
            break
        u = (rng.random(len(todo)) * others[todo]).astype(np.int64)
        cand = pairs.resp[order[np.where(u < start[g[todo]], u, u + size[g[todo]])]]
        ok = cand != gold[todo]
        out[todo[ok]] = cand[ok]
        todo = todo[~ok]
    todo = np.flatnonzero(others == 0)  # a corpus of one dialogue: its other turns
    for _ in range(_TRIES):
        if not len(todo):
            break
        cand = pairs.resp[rng.integers(0, len(pairs), size=len(todo))]
        ok = cand != gold[todo]
        out[todo[ok]] = cand[ok]
        todo = todo[~ok]
    for t in np.flatnonzero(out < 0):
        choices = pairs.resp[(pairs.group != g[t]) & (pairs.resp != gold[t])]
        if not len(choices):  # no other dialogue holds another text: the row's own dialogue's other turns
            choices = pairs.resp[pairs.resp != gold[t]]
        if not len(choices):
            raise ValueError("cannot build negatives: every pair has the same response")
        out[t] = choices[rng.integers(len(choices))]
    return out


def random_from_batch(pairs: PairSet, rows: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """(len(rows), k) random negatives drawn among the other replies of the batch ``rows``: each a reply of another
    dialogue, not the gold one, at distinct positions of the batch; slots the batch cannot fill are drawn from the
    whole set (``_random``). The batch is a uniform draw of pairs, so these are draws from p(r) as ``_random``'s
    are; while the encoder trains they cost nothing to embed (the batch's replies are embedded anyway)."""
    rows = np.asarray(rows)
    out = np.full((len(rows), k), -1, dtype=np.int64)
    if k == 0:
        return out
    resp, group = pairs.resp[rows], pairs.group[rows]
    ok = (group[:, None] != group[None, :]) & (resp[:, None] != resp[None, :])
    keys = np.where(ok, rng.random(ok.shape), np.inf)  # a random order of each row's candidates
    # a batch of fewer than k replies has fewer than k positions: the slots past them are missing (drawn below)
    keys = np.pad(keys, ((0, 0), (0, max(0, k - len(rows)))), constant_values=np.inf)
    pick = np.argsort(keys, axis=1, kind="stable")[:, :k]
    filled = np.take_along_axis(keys, pick, axis=1) < np.inf
    out[filled] = resp[pick[filled]]
    missing = np.argwhere(~filled)
    if len(missing):
        out[missing[:, 0], missing[:, 1]] = _random(pairs, rows[missing[:, 0]], rng)
    return out


def draw_from_pool(
    pairs: PairSet,
    rows: np.ndarray,
    rng: np.random.Generator,
    ptr: np.ndarray,
    pool: np.ndarray,
    owner: np.ndarray,
    fallback,
    avoid: np.ndarray | None = None,
) -> np.ndarray:
    """A pool member other than the gold response (and, per row, other than the indices in ``avoid``, -1 padded);
    ``fallback`` where the pool has none (None: -1)."""
    start, size = ptr[owner], ptr[owner + 1] - ptr[owner]
    out = np.full(len(rows), -1, dtype=np.int64)
    todo = np.flatnonzero(size > 0)
    for _ in range(_TRIES):
        if not len(todo):
            break
        cand = pool[start[todo] + (rng.random(len(todo)) * size[todo]).astype(np.int64)]
        ok = cand != pairs.resp[rows[todo]]
        if avoid is not None:
            ok &= (avoid[todo] != cand[:, None]).all(axis=1)
        out[todo[ok]] = cand[ok]
        todo = todo[~ok]
    for i in todo:  # rows whose pool is mostly excluded: an exact draw among the members left, if any
        members = pool[start[i] : start[i] + size[i]]
        ok = members != pairs.resp[rows[i]]
        if avoid is not None:
            ok &= ~np.isin(members, avoid[i])
        if ok.any():
            out[i] = rng.choice(members[ok])
    missing = np.flatnonzero(out < 0)
    if len(missing) and fallback is not None:
        out[missing] = fallback(pairs, rows[missing], rng)
    return out


def context_lines(pairs: PairSet, rows: np.ndarray) -> np.ndarray:
    """(len(rows), N) response-table indices of each pair's context lines, -1 padded."""
    ctx = pairs.ctx[rows]
    start, size = pairs.line_ptr[ctx], pairs.line_ptr[ctx + 1] - pairs.line_ptr[ctx]
    j = np.arange(int(size.max(initial=0)))
    idx = np.minimum(start[:, None] + j, max(len(pairs.lines) - 1, 0))
    return np.where(j < size[:, None], pairs.lines[idx], -1) if len(j) else np.zeros((len(rows), 0), np.int64)


def _in_dialogue(pairs: PairSet, rows: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Another turn of the same dialogue; random where the dialogue has none."""
    return draw_from_pool(pairs, rows, rng, pairs.pool_ptr, pairs.pool, pairs.group[rows], _random)


def _in_context(pairs: PairSet, rows: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One of the context's own lines; in-dialogue where the context has none (e.g. it is empty)."""
    return draw_from_pool(pairs, rows, rng, pairs.line_ptr, pairs.lines, pairs.ctx[rows], _in_dialogue)


def _mined(kind: str):
    def draw(pairs: PairSet, rows: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        if kind not in pairs.mined:
            raise ValueError(f"k_{kind} needs mined {kind} negatives: call pmi_reward.data.mining.mine_{kind} first")
        ptr, pool = pairs.mined[kind]
        owner = pairs.resp[rows] if kind == "scrambled" else pairs.ctx[rows]  # a scramble is of the row's own reply
        return draw_from_pool(pairs, rows, rng, ptr, pool, owner, _random)

    return draw


_DRAW = {
    "random": _random,
    "in_dialogue": _in_dialogue,
    "context": _in_context,
    "lexical": _mined("lexical"),
    "nearest": _mined("nearest"),
    "scrambled": _mined("scrambled"),
}


def sample_negatives(
    pairs: PairSet, spec: NegativeSpec, rng: np.random.Generator, rows: np.ndarray | None = None
) -> np.ndarray:
    """(len(rows), k) response-table indices, one block of columns per kind in ``KINDS`` order."""
    if spec.k < 1:
        raise ValueError(f"cannot sample an empty mix of negatives ({spec}): set at least one count")
    rows = np.arange(len(pairs)) if rows is None else np.asarray(rows)
    cols = [_DRAW[kind](pairs, rows, rng) for kind, k in spec.counts().items() for _ in range(k)]
    return np.stack(cols, axis=1)

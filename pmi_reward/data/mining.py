"""Mined hard negatives: replies of other dialogues that look like an answer to a context without being one.

``mine_lexical`` ranks the corpus' replies by the words they share with a context (TF-IDF cosine): look-alikes
that reuse the context's words, the cheapest way to fool a relevance scorer. ``mine_nearest`` ranks them by the
encoder's own embeddings: the replies the encoder confuses with an answer. Each keeps, per context, the top
``m`` replies of OTHER dialogues (the gold reply and its dialogue's turns can never be drawn), in a (ptr, pool)
table on ``PairSet.mined`` that ``sample_negatives`` draws ``k_lexical`` / ``k_nearest`` columns from.
``mine_scrambled`` makes new texts instead, each gold reply's words in a random order, for ``k_scrambled``: it
adds them to the response table, so it runs before that table is embedded; its table is by gold reply, not context.
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Callable

import numpy as np
from scipy import sparse

from .pairs import PairSet, csr

__all__ = ["mine_lexical", "mine_nearest", "mine_scrambled", "scramble"]

_CHUNK = 512  # contexts per ``mine_nearest`` product: float32 sums depend on a BLAS product's shape, so it stays
_BLOCK_ELEMENTS = 1 << 22  # (contexts x candidate replies) ranked at once: at most ~40 B each (~160 MiB) at worst
_PROGRESS_MIN = 1 << 27  # (contexts x candidate replies) from which a mining shows a progress bar (a few seconds)

logger = logging.getLogger(__name__)


def _candidates(pairs: PairSet) -> np.ndarray:
    """Distinct gold replies (response-table indices)."""
    return np.unique(pairs.resp)


def _block_rows(n_replies: int) -> int:
    """Contexts ranked at once: ``_BLOCK_ELEMENTS`` similarities, so that a block's memory does not grow with the
    corpus (the whole mining's time does, as contexts x replies)."""
    return max(1, _BLOCK_ELEMENTS // max(n_replies, 1))


def _own_rows(pairs: PairSet, replies: np.ndarray) -> Callable[[np.ndarray], sparse.csr_matrix]:
    """For a block of contexts, a sparse (contexts, candidate replies) matrix, nonzero where the reply is a turn of a
    dialogue the context occurs in. A context text (an opener like "Hello?") or a reply text ("lol") can occur in
    several dialogues: each one's turns are its own, not only those of its first dialogue. Built per block: for all
    contexts at once it holds sum(dialogue turns ** 2) entries, quadratic in a long dialogue (a transcript)."""
    n_groups = int(pairs.group.max()) + 1 if len(pairs.group) else 0
    ctx_groups = sparse.csr_matrix(
        (np.ones(len(pairs.ctx), dtype=np.int32), (pairs.ctx, pairs.group)), shape=(len(pairs.contexts), n_groups)
    )
    counts = np.diff(pairs.pool_ptr)
    group_turns = sparse.csr_matrix(
        (np.ones(len(pairs.pool), dtype=np.int32), (np.repeat(np.arange(len(counts)), counts), pairs.pool)),
        shape=(n_groups, len(pairs.responses)),
    )[:, replies].tocsr()
    return lambda ctx: (ctx_groups[ctx] @ group_turns).tocsr()


class _Ranker:
    """Per row of a block's similarities (own-dialogue replies at -inf), the columns of the ``m`` most similar
    replies, best first, -1 past the replies that are not -inf: exactly ``_rank_exact``'s columns, ties included.

    ``torch.topk`` takes a row's ``m + 1`` best without a row-wide copy. Where they hold a tie (equal similarities that
    are not -inf, or NaN), which of the tied the ranking keeps, and in what order, is what the float64 full-row
    ``argpartition`` of ``_rank_exact`` chooses, as the mined negatives always had: such rows are ranked by it. When
    most rows of a block tie (TF-IDF cosines of real chat: equal-vector replies such as "Cool!" / "cool", contexts of
    stop words whose every reply is at 0), the top-k is wasted work: the next ``_SKIP`` blocks go to ``_rank_exact``
    whole, then one tries the top-k again."""

    _SKIP = 8

    def __init__(self) -> None:
        self.tied = 0.0  # the share of rows that tied in the last block ranked by the top-k
        self.skipped = 0

    def __call__(self, sim: np.ndarray, m: int) -> np.ndarray:
        if self.tied > 0.5 and self.skipped < self._SKIP:
            self.skipped += 1
            return _rank_exact(sim, m)
        import torch

        self.skipped = 0
        top = torch.topk(torch.from_numpy(sim), min(m + 1, sim.shape[1]), dim=1)
        values, columns = top.values.numpy(), top.indices.numpy()
        tied: np.ndarray = ((values[:, 1:] == values[:, :-1]) & ~np.isneginf(values[:, 1:])).any(axis=1)
        tied |= np.isnan(values).any(axis=1)
        self.tied = float(tied.mean()) if len(tied) else 0.0
        if self.tied > 0.5:
            return _rank_exact(sim, m)  # the whole block, as no copy of its tied rows is then needed
        out = np.where(np.isneginf(values[:, :m]), -1, columns[:, :m])
        if tied.any():
            out[tied] = _rank_exact(sim[tied], m)
        return out


def _rank_exact(sim: np.ndarray, m: int) -> np.ndarray:
    """``_Ranker``'s columns by a float64 ``argpartition`` of each whole row, then a sort of its ``m`` best: the
    mining's ranking (ties included) as it has always been made."""
    sim = np.asarray(sim, dtype=np.float64)
    top = np.argpartition(-sim, m - 1, axis=1)[:, :m]
    top = np.take_along_axis(top, np.argsort(-np.take_along_axis(sim, top, 1), axis=1), 1)
    other = ~np.isneginf(np.take_along_axis(sim, top, 1))  # all False past the replies of other dialogues
    return np.where(other, top, -1)


def _rank_into(
    pool: np.ndarray,
    ctx: np.ndarray,
    sim: np.ndarray,
    own: Callable[[np.ndarray], sparse.csr_matrix],
    replies: np.ndarray,
    block: int,
    rank: _Ranker,
) -> None:
    """Write into ``pool[ctx]`` the ranked candidate replies (response-table indices, -1 past the last of other
    dialogues) of contexts ``ctx``, from their similarities ``sim`` (contexts, candidate replies), ``block`` contexts
    at a time."""
    sim = np.asarray(sim)
    if sim.dtype not in (np.float32, np.float64):
        sim = sim.astype(np.float64)
    sim = np.ascontiguousarray(sim)
    for at in range(0, len(ctx), block):
        part = sim[at : at + block]
        r, c = own(ctx[at : at + block]).nonzero()
        part[r, c] = -np.inf  # never a turn of the context's own dialogue(s)
        ranked = rank(part, pool.shape[1])
        pool[ctx[at : at + block]] = np.where(ranked >= 0, replies[ranked], -1)


def _top(
    pairs: PairSet,
    similarity: Callable[[np.ndarray], np.ndarray],
    m: int,
    kind: str,
    rows: int | None = None,
    progress: bool = True,
) -> tuple[np.ndarray, np.ndarray]:
    """Per context, the ``m`` most similar candidate replies of other dialogues (fewer where there are fewer), as a
    (ptr, pool) table; a warning names how many contexts have none (their ``k_<kind>`` draws are random replies).
    ``similarity(ctx)`` gives the (contexts, candidate replies) similarities of ``rows`` contexts at a time (a
    ``_BLOCK_ELEMENTS`` block when None); they are ranked a block at a time, so memory stays flat as the corpus grows,
    while the time grows as contexts x replies: a progress bar shows it when that is large (``progress``)."""
    from tqdm.auto import tqdm

    replies = _candidates(pairs)
    own = _own_rows(pairs, replies)
    m = min(m, len(replies))
    block = _block_rows(len(replies))
    rows = rows or block
    n_contexts = len(pairs.contexts)
    pool = np.empty((n_contexts, m), dtype=np.int64)
    quiet = not progress or n_contexts * len(replies) < _PROGRESS_MIN
    rank = _Ranker()
    with tqdm(total=n_contexts, desc=f"mining {kind} negatives", unit="context", disable=quiet, leave=False) as bar:
        for start in range(0, n_contexts, rows):
            ctx = np.arange(start, min(start + rows, n_contexts))
            _rank_into(pool, ctx, similarity(ctx), own, replies, block, rank)  # one block's similarities at a time
            bar.update(len(ctx))
    kept = pool >= 0
    ptr = np.zeros(len(pool) + 1, dtype=np.int64)
    ptr[1:] = np.cumsum(kept.sum(1))
    empty = int((~kept.any(axis=1)).sum())
    if empty:
        logger.warning(
            "mined %s negatives: %d of %d contexts have no reply of another dialogue to mine (e.g. a file whose rows "
            "share one dialog_key); their k_%s negatives are random replies",
            kind,
            empty,
            len(pool),
            kind,
        )
    return ptr, pool[kept]


def mine_lexical(pairs: PairSet, m: int = 32, progress: bool = True) -> None:
    """Fill ``pairs.mined["lexical"]``: per context, the ``m`` replies of other dialogues with the highest TF-IDF
    cosine to it (English stop words left out, so shared content words count). Every context is compared with every
    reply: the time grows as pairs squared (a progress bar shows it when it is long), the memory does not."""
    from sklearn.feature_extraction.text import TfidfVectorizer

    replies = _candidates(pairs)
    vectorizer = TfidfVectorizer(stop_words="english", sublinear_tf=True).fit(
        [pairs.responses[r] for r in replies] + pairs.contexts
    )
    reply_matrix = vectorizer.transform([pairs.responses[r] for r in replies]).T.tocsr()
    context_matrix = vectorizer.transform(pairs.contexts)
    pairs.mined["lexical"] = _top(
        pairs, lambda ctx: (context_matrix[ctx] @ reply_matrix).toarray(), m, "lexical", progress=progress
    )


def _unit_rows(x: np.ndarray, rows: np.ndarray | None = None) -> np.ndarray:
    """``x``'s rows (those of ``rows``, if given) divided by their norms (at least 1e-8), a block at a time into one new
    array: the whole table's squares, gathered rows and quotients were three transient copies of it (3 GB each for a
    million 768-d embeddings). Each row's norm and quotient are those of the whole table's, bit for bit."""
    x = np.asarray(x)
    if not x.flags.c_contiguous:  # numpy's row norms of another layout depend on the block's shape: the whole at once
        x = x if rows is None else x[rows]
        return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-8)
    n = len(x) if rows is None else len(rows)
    step = max(1, _BLOCK_ELEMENTS // max(x.shape[1], 1) // 8)  # a small block: its squares and quotient are transient
    out: np.ndarray | None = None
    for start in range(0, max(n, 1), step):
        part = x[start : start + step] if rows is None else x[rows[start : start + step]]
        unit = part / np.maximum(np.linalg.norm(part, axis=1, keepdims=True), 1e-8)
        if out is None:
            out = np.empty((n, x.shape[1]), dtype=unit.dtype)
        out[start : start + len(unit)] = unit
    assert out is not None  # the loop runs at least once
    return out


def mine_nearest(
    pairs: PairSet, contexts: np.ndarray, responses: np.ndarray, m: int = 32, progress: bool = True
) -> None:
    """Fill ``pairs.mined["nearest"]``: per context, the ``m`` replies of other dialogues whose embedding has the
    highest cosine with the context's. ``contexts`` (n_contexts, d) and ``responses`` (n_responses, d) are
    embeddings of the whole text tables (only the gold replies' rows are read). Every context is compared with every
    reply: the time grows as pairs squared (a progress bar shows it when it is long). The memory is one unit-norm copy
    of each table and one product of ``_CHUNK`` contexts x all replies (4 bytes each in float32): the cosines are
    computed ``_CHUNK`` contexts at a time, as they always were, since a BLAS product's float32 sums depend on its
    shape and the mined negatives must not change."""
    u = _unit_rows(contexts)
    v = _unit_rows(responses, _candidates(pairs))
    pairs.mined["nearest"] = _top(pairs, lambda ctx: u[ctx] @ v.T, m, "nearest", rows=_CHUNK, progress=progress)


def scramble(text: str, seed: int = 0) -> str | None:
    """``text``'s words in a random order other than their own; None for a text of fewer than three words (too
    short for its order to carry much) or one whose words are all alike. The draw is seeded by ``seed`` and the text
    itself, so a reply gets the same scramble whichever pair set, file or policies it is read with."""
    words = text.split()
    if len(words) < 3 or len(set(words)) < 2:
        return None
    rng = np.random.default_rng([seed, zlib.crc32(text.encode())])
    while True:
        out = " ".join(words[i] for i in rng.permutation(len(words)))
        if out != " ".join(words):
            return out


def mine_scrambled(pairs: PairSet, seed: int = 0) -> None:
    """Fill ``pairs.mined["scrambled"]``: per gold reply (a table by response index, not by context: pairs that share
    a context text have other replies), ``scramble``'s scramble of it, appended to ``pairs.responses``. Call it
    before the response table is embedded (``PairFeatures`` sizes its table when built); replies too short to
    scramble have none, and their draws fall back to random replies. A second call does nothing."""
    if "scrambled" in pairs.mined:
        return
    index = {text: i for i, text in enumerate(pairs.responses)}
    own: list[list[int]] = [[] for _ in pairs.responses]
    for r in np.unique(pairs.resp).tolist():
        text = scramble(pairs.responses[r], seed)
        if text is not None:
            own[r] = [index.setdefault(text, len(index))]
    pairs.responses = pairs.responses + list(index)[len(pairs.responses) :]  # a new list: never one shared
    pairs.mined["scrambled"] = csr(own)

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

_CHUNK = 512

logger = logging.getLogger(__name__)


def _candidates(pairs: PairSet) -> np.ndarray:
    """Distinct gold replies (response-table indices)."""
    return np.unique(pairs.resp)


def _own(pairs: PairSet, replies: np.ndarray) -> sparse.csr_matrix:
    """(contexts, candidate replies): nonzero where the reply is a turn of a dialogue the context occurs in. A context
    text (an opener like "Hello?") or a reply text ("lol") can occur in several dialogues: each one's turns are its
    own, not only those of its first dialogue."""
    n_groups = int(pairs.group.max()) + 1 if len(pairs.group) else 0
    ctx_groups = sparse.csr_matrix(
        (np.ones(len(pairs.ctx)), (pairs.ctx, pairs.group)), shape=(len(pairs.contexts), n_groups)
    )
    counts = np.diff(pairs.pool_ptr)
    group_turns = sparse.csr_matrix(
        (np.ones(len(pairs.pool)), (np.repeat(np.arange(len(counts)), counts), pairs.pool)),
        shape=(n_groups, len(pairs.responses)),
    )
    return (ctx_groups @ group_turns[:, replies]).astype(bool).tocsr()


def _top(
    pairs: PairSet, similarity: Callable[[np.ndarray], np.ndarray], m: int, kind: str
) -> tuple[np.ndarray, np.ndarray]:
    """Per context, the ``m`` most similar candidate replies of other dialogues (fewer where there are fewer), as a
    (ptr, pool) table; a warning names how many contexts have none (their ``k_<kind>`` draws are random replies)."""
    replies = _candidates(pairs)
    own = _own(pairs, replies)
    m = min(m, len(replies))
    pool = np.empty((len(pairs.contexts), m), dtype=np.int64)
    for start in range(0, len(pairs.contexts), _CHUNK):
        ctx = np.arange(start, min(start + _CHUNK, len(pairs.contexts)))
        sim = np.asarray(similarity(ctx), dtype=np.float64)
        sim[own[ctx].toarray()] = -np.inf  # never a turn of the context's own dialogue(s)
        top = np.argpartition(-sim, m - 1, axis=1)[:, :m]
        top = np.take_along_axis(top, np.argsort(-np.take_along_axis(sim, top, 1), axis=1), 1)
        other = ~np.isneginf(np.take_along_axis(sim, top, 1))  # all False past the replies of other dialogues
        pool[ctx] = np.where(other, replies[top], -1)
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


def mine_lexical(pairs: PairSet, m: int = 32) -> None:
    """Fill ``pairs.mined["lexical"]``: per context, the ``m`` replies of other dialogues with the highest TF-IDF
    cosine to it (English stop words left out, so shared content words count)."""
    from sklearn.feature_extraction.text import TfidfVectorizer

    replies = _candidates(pairs)
    vectorizer = TfidfVectorizer(stop_words="english", sublinear_tf=True).fit(
        [pairs.responses[r] for r in replies] + pairs.contexts
    )
    reply_matrix = vectorizer.transform([pairs.responses[r] for r in replies]).T.tocsr()
    context_matrix = vectorizer.transform(pairs.contexts)
    pairs.mined["lexical"] = _top(pairs, lambda ctx: (context_matrix[ctx] @ reply_matrix).toarray(), m, "lexical")


def mine_nearest(pairs: PairSet, contexts: np.ndarray, responses: np.ndarray, m: int = 32) -> None:
    """Fill ``pairs.mined["nearest"]``: per context, the ``m`` replies of other dialogues whose embedding has the
    highest cosine with the context's. ``contexts`` (n_contexts, d) and ``responses`` (n_responses, d) are
    embeddings of the whole text tables (only the gold replies' rows are read)."""
    replies = _candidates(pairs)
    u = contexts / np.maximum(np.linalg.norm(contexts, axis=1, keepdims=True), 1e-8)
    v = responses[replies]
    v = v / np.maximum(np.linalg.norm(v, axis=1, keepdims=True), 1e-8)
    pairs.mined["nearest"] = _top(pairs, lambda ctx: u[ctx] @ v.T, m, "nearest")


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

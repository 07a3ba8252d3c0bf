"""Mined hard negatives: replies of other dialogues that look like an answer to a context without being one.

``mine_lexical`` ranks the corpus' replies by the words they share with a context (TF-IDF cosine): look-alikes
that reuse the context's words, the cheapest way to fool a relevance scorer. ``mine_nearest`` ranks them by the
encoder's own embeddings: the replies the encoder confuses with an answer. Each keeps, per context, the top
``m`` replies of OTHER dialogues (the gold reply and its dialogue's turns can never be drawn), in a (ptr, pool)
table on ``PairSet.mined`` that ``sample_negatives`` draws ``k_lexical`` / ``k_nearest`` columns from.
``mine_scrambled`` makes new texts instead, each gold reply's words in a random order, for ``k_scrambled``: it
adds them to the response table, so it runs before that table is embedded; its table is by gold reply, not context.

Scripts written without spaces between words (CJK, kana, Thai: ``data.words.SPACELESS``) have no whitespace words
to share or scramble: a Chinese clause was one TF-IDF term and one "word". There, the TF-IDF terms are letters and
letter bigrams, and a scramble permutes letters; text without those scripts (Korean included: it puts spaces
between its words, and a scramble shuffles them whole) is read exactly as before.
"""

from __future__ import annotations

import functools
import logging
import re
import zlib
from collections.abc import Callable

import numpy as np
from scipy import sparse

from .pairs import PairSet, csr
from .words import SPACELESS

__all__ = ["mine_lexical", "mine_nearest", "mine_scrambled", "scramble"]

_CHUNK = 512  # contexts per ``mine_nearest`` product: float32 sums depend on a BLAS product's shape, so it stays
_BLOCK_ELEMENTS = 1 << 22  # (contexts x candidate replies) ranked at once: at most ~40 B each (~160 MiB) at worst
_PROGRESS_MIN = 1 << 27  # (contexts x candidate replies) from which a mining shows a progress bar (a few seconds)

logger = logging.getLogger(__name__)

# one letter of a script written without spaces between words (as a capturing group: ``re.split`` keeps it), and a
# run of them; the letters are ``data.words.SPACELESS`` (not Hangul: a Korean word is a whitespace word here, as in
# ``data.words.split_words``, though ``rewards.length.reply_words`` counts its syllables)
_HAS_SPACELESS = re.compile(f"[{SPACELESS}]")
_SPACELESS_LETTER = re.compile(f"({_HAS_SPACELESS.pattern})")
_SPACELESS_RUN = re.compile(f"(?:{_HAS_SPACELESS.pattern})+")


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


def _lexical_terms(words: Callable[[str], list[str]], text: str) -> list[str]:
    """The TF-IDF terms of ``text``: ``words(text)`` (scikit-learn's English word analyzer) for text without letters
    of a script written without spaces, so that English gives the same terms, and the same negatives, as always.
    Where it has such letters, each run of them gives its letters and its letter bigrams, and the rest of the text its
    words. The word analyzer read a whole Chinese clause as one term, which no other text shares, so nearly every
    context's look-alikes were replies at similarity 0, the same few for all. Letters alone miss that a shared
    two-letter word ("公园") says more than two shared letters; bigrams alone miss the many one-letter words ("狗",
    "睡") and let a short reply that shares one common bigram ("好的！") top most lists. Letters common to most texts
    ("的", "我") weigh little: their inverse document frequency is low."""
    if not _HAS_SPACELESS.search(text):
        return words(text)
    terms = words(_SPACELESS_RUN.sub(" ", text))
    for run in _SPACELESS_RUN.findall(text):
        terms.extend(run)
        terms.extend(run[i : i + 2] for i in range(len(run) - 1))
    return terms


def _lexical_vectorizer():  # -> sklearn TfidfVectorizer (sklearn is imported only when mining)
    """``mine_lexical``'s TF-IDF vectorizer (unfitted): English stop words left out, sublinear term counts, the terms of
    ``_lexical_terms``."""
    from sklearn.feature_extraction.text import TfidfVectorizer

    words = TfidfVectorizer(stop_words="english").build_analyzer()
    return TfidfVectorizer(analyzer=functools.partial(_lexical_terms, words), sublinear_tf=True)


def mine_lexical(pairs: PairSet, m: int = 32, progress: bool = True) -> None:
    """Fill ``pairs.mined["lexical"]``: per context, the ``m`` replies of other dialogues with the highest TF-IDF
    cosine to it (English stop words left out, so shared content words count; in scripts written without spaces, the
    terms are letters and letter bigrams: ``_lexical_terms``). Every context is compared with every reply: the time
    grows as pairs squared (a progress bar shows it when it is long), the memory does not."""
    replies = _candidates(pairs)
    vectorizer = _lexical_vectorizer().fit([pairs.responses[r] for r in replies] + pairs.contexts)
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


def _letter_units(text: str) -> tuple[list[str], list[str]]:
    """``text``'s units for a scramble where it has letters of a script written without spaces, and what separates
    each unit from the one before it (" " where the text has whitespace there, "" where not). A unit is one such
    letter, or a run of other letters and digits within a whitespace word (a Latin word: ``"用Python写"`` is 3 units),
    with the punctuation and combining marks that follow it (a Thai vowel sign stays on its consonant, "。" on the
    letter before it): the words ``data.words.split_words`` reads (and, but for a Korean word's syllables,
    ``rewards.length.reply_words`` counts)."""
    units: list[str] = []
    gaps: list[str] = []
    lead = ""  # punctuation before the first unit: it opens that unit
    for word in text.split():
        gap = " "
        pieces = _SPACELESS_LETTER.split(word) if _HAS_SPACELESS.search(word) else [word]
        for piece in pieces:
            if not any(ch.isalnum() for ch in piece):
                if units:
                    units[-1] += piece
                else:
                    lead += piece
                continue
            units.append(lead + piece)
            gaps.append(gap if len(units) > 1 else "")
            lead, gap = "", ""
    return units, gaps


def _join_units(units: list[str], gaps: list[str]) -> str:
    """``units`` with the gaps of the text they came from between them, and a space where two units of other scripts
    (Latin words) would otherwise run into one."""
    out = units[0]
    for before, unit, gap in zip(units[:-1], units[1:], gaps[1:], strict=True):
        if not gap and not _HAS_SPACELESS.search(before) and not _HAS_SPACELESS.search(unit):
            gap = " "
        out += gap + unit
    return out


def scramble(text: str, seed: int = 0) -> str | None:
    """``text``'s words in a random order other than their own; None for a text of fewer than three words (too
    short for its order to carry much) or one whose words are all alike. The draw is seeded by ``seed`` and the text
    itself, so a reply gets the same scramble whichever pair set, file or policies it is read with.

    In text with letters of a script written without spaces (CJK, kana, Thai) a word is one such letter
    (``_letter_units``: the unit ``data.words.split_words`` reads): its letters are permuted, and the text's spaces
    stay where they were, so that a scramble is not told apart by its spacing. Split by whitespace, every
    Chinese reply was one word and had no scramble. Single letters, not two-letter chunks: without a word segmenter a
    chunk cuts words as often as a letter does, and a letter is the unit a scorer's tokenizer reads Chinese in.
    Text without those scripts is scrambled by whitespace words, exactly as always: Korean too, which puts spaces
    between its words (by syllable, a scramble moved syllables across words: no Korean words at all)."""
    if _HAS_SPACELESS.search(text):
        units, gaps = _letter_units(text)
    else:
        units = text.split()
        gaps = [""] + [" "] * (len(units) - 1)
    if len(units) < 3 or len(set(units)) < 2:
        return None
    rng = np.random.default_rng([seed, zlib.crc32(text.encode())])
    own = _join_units(units, gaps)
    while True:
        out = _join_units([units[i] for i in rng.permutation(len(units))], gaps)
        if out != own:
            return out


def mine_scrambled(pairs: PairSet, seed: int = 0) -> None:
    """Fill ``pairs.mined["scrambled"]``: per gold reply (a table by response index, not by context: pairs that share
    a context text have other replies), ``scramble``'s scramble of it, appended to ``pairs.responses``. Call it
    before the response table is embedded (``PairFeatures`` sizes its table when built); replies too short to
    scramble have none, and their draws fall back to random replies: a warning says how many. A second call does
    nothing."""
    if "scrambled" in pairs.mined:
        return
    index = {text: i for i, text in enumerate(pairs.responses)}
    own: list[list[int]] = [[] for _ in pairs.responses]
    gold = np.unique(pairs.resp).tolist()
    for r in gold:
        text = scramble(pairs.responses[r], seed)
        if text is not None:
            own[r] = [index.setdefault(text, len(index))]
    pairs.responses = pairs.responses + list(index)[len(pairs.responses) :]  # a new list: never one shared
    pairs.mined["scrambled"] = csr(own)
    left = sum(1 for r in gold if not own[r])
    if left:
        logger.warning(
            "k_scrambled: %d of %d gold replies are too short to scramble (fewer than three words, or all alike); "
            "their k_scrambled negatives are random replies",
            left,
            len(gold),
        )

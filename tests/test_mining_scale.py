"""Mining look-alike negatives at scale: ranked a block of contexts at a time, so that memory stays flat as the corpus
grows (it held several dense 512 x replies float64 arrays and a contexts x own-dialogue-turns matrix, quadratic in a
long dialogue), with a progress bar for a long mining; and the mined negatives exactly those of the full-row ranking it
replaces, ties included (the scorer recipes' results depend on them)."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from scipy import sparse

from pmi_reward.data import mining
from pmi_reward.data.dialogues import Dialogue
from pmi_reward.data.pairs import PairSet

# Content words, their case and punctuation variants (distinct texts with equal TF-IDF vectors: exact ties) and stop
# words (a context of stop words only has a TF-IDF cosine of 0 with every reply: all its candidates tie).
WORDS = ["jazz", "Jazz!", "music", "piano", "dog", "dogs", "cat", "garden", "roses", "tea", "Tea.", "rain", "sun"]
STOP = ["how", "are", "you", "the", "is", "it", "and", "to"]


def _reference(
    pairs: PairSet, kind: str, m: int, embeddings: tuple[np.ndarray, np.ndarray] | None
) -> tuple[np.ndarray, np.ndarray]:
    """The mining before it was blocked (commit c4db735's ``mine_lexical`` / ``mine_nearest``, ``_own`` and ``_top``):
    whole-table normalisation, dense 512-context chunks over all candidate replies in float64, a full-row
    ``argpartition`` and a sort of its ``m`` best. The oracle."""
    from sklearn.feature_extraction.text import TfidfVectorizer

    replies = np.unique(pairs.resp)
    if kind == "lexical":
        texts = [pairs.responses[r] for r in replies]
        vectorizer = TfidfVectorizer(stop_words="english", sublinear_tf=True).fit(texts + pairs.contexts)
        reply_matrix = vectorizer.transform(texts).T.tocsr()
        context_matrix = vectorizer.transform(pairs.contexts)

        def similarity(ctx: np.ndarray) -> np.ndarray:
            return (context_matrix[ctx] @ reply_matrix).toarray()

    else:
        contexts, responses = embeddings
        u = contexts / np.maximum(np.linalg.norm(contexts, axis=1, keepdims=True), 1e-8)
        v = responses[replies]
        v = v / np.maximum(np.linalg.norm(v, axis=1, keepdims=True), 1e-8)

        def similarity(ctx: np.ndarray) -> np.ndarray:
            return u[ctx] @ v.T

    n_groups = int(pairs.group.max()) + 1
    ctx_groups = sparse.csr_matrix(
        (np.ones(len(pairs.ctx)), (pairs.ctx, pairs.group)), shape=(len(pairs.contexts), n_groups)
    )
    counts = np.diff(pairs.pool_ptr)
    group_turns = sparse.csr_matrix(
        (np.ones(len(pairs.pool)), (np.repeat(np.arange(len(counts)), counts), pairs.pool)),
        shape=(n_groups, len(pairs.responses)),
    )
    own = (ctx_groups @ group_turns[:, replies]).astype(bool).tocsr()
    m = min(m, len(replies))
    pool = np.empty((len(pairs.contexts), m), dtype=np.int64)
    for start in range(0, len(pairs.contexts), 512):
        ctx = np.arange(start, min(start + 512, len(pairs.contexts)))
        sim = np.asarray(similarity(ctx), dtype=np.float64)
        sim[own[ctx].toarray()] = -np.inf
        top = np.argpartition(-sim, m - 1, axis=1)[:, :m]
        top = np.take_along_axis(top, np.argsort(-np.take_along_axis(sim, top, 1), axis=1), 1)
        other = ~np.isneginf(np.take_along_axis(sim, top, 1))
        pool[ctx] = np.where(other, replies[top], -1)
    kept = pool >= 0
    ptr = np.zeros(len(pool) + 1, dtype=np.int64)
    ptr[1:] = np.cumsum(kept.sum(1))
    return ptr, pool[kept]


def _text(rng: np.random.Generator) -> str:
    words = WORDS if rng.random() < 0.7 else STOP
    return " ".join(rng.choice(words, int(rng.integers(1, 4))))


def _corpus(shape: str, seed: int) -> PairSet:
    """~600-700 contexts (more than one 512-context chunk): short texts full of ties in short dialogues, or in keyed
    pairs of a few long dialogues where a context text recurs in several of them; or longer texts of a larger
    vocabulary, where few rankings tie (most rows take the top-k path, not the full-row one)."""
    rng = np.random.default_rng(seed)
    if shape == "dialogues":
        dialogues = [Dialogue(f"d{i}", tuple(_text(rng) for _ in range(int(rng.integers(2, 6))))) for i in range(260)]
        return PairSet.from_dialogues(dialogues, max_context_turns=2)
    if shape == "varied":
        words = [f"w{i}" for i in range(300)]
        dialogues = [Dialogue(f"d{i}", tuple(" ".join(rng.choice(words, 6)) for _ in range(4))) for i in range(220)]
        return PairSet.from_dialogues(dialogues, max_context_turns=2)
    n = 900
    return PairSet.from_pairs(
        [_text(rng) + f" {i % 700}" for i in range(n)],
        [_text(rng) for _ in range(n)],
        keys=[f"k{i % 5}" for i in range(n)],
    )


def _embeddings(pairs: PairSet, seed: int, dtype: type, ties: bool) -> tuple[np.ndarray, np.ndarray]:
    """Small-integer vectors (many exact cosine ties) or normal ones (none), with zero vectors and a NaN one."""
    rng = np.random.default_rng(seed)
    if ties:
        u = rng.integers(-1, 2, size=(len(pairs.contexts), 4)).astype(dtype)
        v = rng.integers(-1, 2, size=(len(pairs.responses), 4)).astype(dtype)
    else:
        u = rng.standard_normal((len(pairs.contexts), 16)).astype(dtype)
        v = rng.standard_normal((len(pairs.responses), 16)).astype(dtype)
    u[3], u[4], v[pairs.resp[5]] = 0, np.nan, 0
    return u, v


def _mine(pairs: PairSet, kind: str, m: int, embeddings: tuple[np.ndarray, np.ndarray] | None) -> tuple:
    if kind == "lexical":
        mining.mine_lexical(pairs, m=m)
    else:
        mining.mine_nearest(pairs, *embeddings, m=m)
    return pairs.mined.pop(kind)


@pytest.mark.parametrize("block", [1 << 22, 2000, 1])
@pytest.mark.parametrize("m", [1, 7, 40])
@pytest.mark.parametrize(
    "kind, shape, dtype, ties",
    [
        ("lexical", "dialogues", None, True),
        ("lexical", "keyed", None, True),
        ("lexical", "varied", None, False),
        ("nearest", "dialogues", np.float32, True),
        ("nearest", "keyed", np.float64, True),
        ("nearest", "varied", np.float32, False),
        ("nearest", "keyed", np.float32, False),
    ],
)
def test_blocked_mining_mines_exactly_the_full_row_rankings_negatives(monkeypatch, kind, shape, dtype, ties, m, block):
    """Ties included: most rows here tie (equal TF-IDF vectors, all-zero rows, integer embeddings), and those take the
    old full-row ranking's choice; one block of contexts per similarity call or one context per block alike. The
    cosines too are the old ones to the bit (normalised a block at a time, the product kept in 512-context chunks)."""
    pairs = _corpus(shape, seed=m)
    embeddings = _embeddings(pairs, m, dtype, ties) if kind == "nearest" else None
    want_ptr, want_pool = _reference(pairs, kind, m, embeddings)
    monkeypatch.setattr(mining, "_BLOCK_ELEMENTS", block, raising=False)
    ptr, pool = _mine(pairs, kind, m, embeddings)
    assert (np.diff(want_ptr) > 0).mean() > 0.9  # most contexts mined something
    np.testing.assert_array_equal(ptr, want_ptr)
    np.testing.assert_array_equal(pool, want_pool)


@pytest.mark.parametrize("kind", ["lexical", "nearest"])
@pytest.mark.parametrize("groups", [2, 1000])
def test_mining_memory_is_a_blocks_not_the_corpus(monkeypatch, kind, groups):
    """3,000 pairs, in 2 long dialogues (the own-dialogue mask held 2 x 1,500^2 entries at once) or in 1,000 short
    ones (each 512-context chunk held ~29 B per context and reply: 44 MB). With 2^16-element blocks the mining's own
    allocations stay under 4 MB (lexical), or one 512-context float32 product and 4 MB (nearest: that product's
    shape is kept, so that its float32 sums, and the negatives, stay the same)."""
    rng = np.random.default_rng(0)
    n = 3000
    words = [f"w{i}" for i in range(500)]
    pairs = PairSet.from_pairs(
        [" ".join(rng.choice(words, 6)) for _ in range(n)],
        [" ".join(rng.choice(words, 4)) for _ in range(n)],
        keys=[f"k{i % groups}" for i in range(n)],
    )
    u = rng.standard_normal((len(pairs.contexts), 8), dtype=np.float32)
    v = rng.standard_normal((len(pairs.responses), 8), dtype=np.float32)
    monkeypatch.setattr(mining, "_BLOCK_ELEMENTS", 1 << 16, raising=False)
    peak = {}
    top = mining._top

    def measured(*args, **kwargs):
        tracemalloc.start()
        try:
            start = tracemalloc.get_traced_memory()[0]
            out = top(*args, **kwargs)
            peak["bytes"] = tracemalloc.get_traced_memory()[1] - start
        finally:
            tracemalloc.stop()
        return out

    monkeypatch.setattr(mining, "_top", measured)
    if kind == "lexical":
        mining.mine_lexical(pairs, m=32)
        limit = 4 << 20
    else:
        mining.mine_nearest(pairs, u, v, m=32)
        limit = 512 * len(np.unique(pairs.resp)) * 4 + (4 << 20)
    assert peak["bytes"] < limit, f"{kind} mining of {n} pairs in {groups} dialogues allocated {peak['bytes']:,} bytes"
    ptr, pool = pairs.mined[kind]
    assert (np.diff(ptr) == 32).all() and len(pool) == 32 * len(pairs.contexts)


def test_a_long_mining_shows_a_progress_bar_and_a_short_one_does_not(monkeypatch, capsys):
    pairs = _corpus("dialogues", seed=0)
    mining.mine_lexical(pairs, m=4)  # 700 x 600 similarities: a fraction of a second
    assert "mining lexical negatives" not in capsys.readouterr().err
    monkeypatch.setattr(mining, "_PROGRESS_MIN", 1, raising=False)
    mining.mine_lexical(pairs, m=4)
    assert "mining lexical negatives" in capsys.readouterr().err
    u, v = _embeddings(pairs, 0, np.float32, ties=False)
    mining.mine_nearest(pairs, u, v, m=4)
    assert "mining nearest negatives" in capsys.readouterr().err
    mining.mine_nearest(pairs, u, v, m=4, progress=False)
    assert capsys.readouterr().err == ""

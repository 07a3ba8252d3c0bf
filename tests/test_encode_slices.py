"""A long encode call is tokenized a slice at a time (token ids of a million pairs took ~12 GB at once), under one
progress bar, with the cache written at the right positions."""

from __future__ import annotations

import io

import numpy as np

import pmi_reward.scoring.encoder as encoder_module
from pmi_reward.scoring.cache import EmbeddingCache, cache_key

TEXTS = [f"line {i} " + "word " * (i % 7) for i in range(23)] + ["", "line 3 " + "word " * 3]


def test_a_long_call_is_tokenized_in_slices_with_the_same_embeddings(tiny_encoder_factory, monkeypatch, tmp_path):
    whole = tiny_encoder_factory().encode(TEXTS)
    enc = tiny_encoder_factory(cache=EmbeddingCache(tmp_path))
    calls: list[int] = []
    tokenize = enc.tokenizer.__class__.__call__

    def spy(self, texts, *args, **kwargs):
        calls.append(len(texts) if isinstance(texts, list) else 1)
        return tokenize(self, texts, *args, **kwargs)

    monkeypatch.setattr(enc.tokenizer.__class__, "__call__", spy)
    monkeypatch.setattr(encoder_module, "ENCODE_SLICE", 5)
    sliced = enc.encode(TEXTS)
    assert max(calls) <= 5 and sum(calls) >= len(set(TEXTS))
    np.testing.assert_allclose(sliced, whole, atol=1e-5)
    assert enc.stats.texts == len(set(TEXTS))
    # every text's cached vector is its own: a slice's positions were shifted into the call's
    keys = [cache_key(enc._fingerprint, "text", "{text}", "start", t) for t in TEXTS]
    stored = enc.cache.get(keys)
    for key, vector in zip(keys, sliced, strict=True):
        np.testing.assert_array_equal(stored[key], vector)


def test_the_slices_share_one_progress_bar(tiny_encoder_factory, monkeypatch):
    bars = []
    real = encoder_module.progress_bar

    def spy(*args, **kwargs):
        kwargs["file"] = io.StringIO()
        bar = real(*args, **kwargs)
        bars.append(bar)
        return bar

    monkeypatch.setattr(encoder_module, "progress_bar", spy)
    monkeypatch.setattr(encoder_module, "ENCODE_SLICE", 5)
    enc = tiny_encoder_factory(batch_size=2)
    enc.encode(TEXTS, progress=True)
    assert len(bars) == 1
    unique = len(set(TEXTS))
    slices = [min(5, unique - lo) for lo in range(0, unique, 5)]
    assert bars[0].total == bars[0].n == sum(-(-s // 2) for s in slices)

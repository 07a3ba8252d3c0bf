"""A long text is tokenized through a window of its start or end (``WINDOW_CHARS_PER_TOKEN``): the cuts, token ids,
pair prompts and embeddings are those of the whole text, for MiniLM's WordPiece and SmolLM2's byte-level BPE, on
texts whose words, spaces, punctuation, line breaks, digits and scripts vary; a text of very long tokens (no space
to cut at, or too few tokens in the window) is tokenized whole, as before."""

from __future__ import annotations

import random

import numpy as np
import pytest

from pmi_reward.scoring import encoder as encoder_module
from pmi_reward.scoring.encoder import TextEncoder, _window

WORDS = ["hello", "world", "Café", "naïve", "über", "42", "3.14", "你好", "世界", "🙂", "don't", "it's", "x" * 30]
SEPARATORS = [" ", "  ", ", ", ". ", "\n", " \n ", "\t", "! ", "?", "-", "\u00a0", " (", ") "]


def _text(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(WORDS) + rng.choice(SEPARATORS) for _ in range(n))


def _texts() -> list[str]:
    rng = random.Random(0)
    texts = [_text(rng, rng.choice([50, 400, 2_000, 5_000])) for _ in range(24)]
    texts += ["x" * 20_000, "y " * 10_000, "word " * 5_000 + "z" * 10_000, "z" * 10_000 + " word" * 5_000]
    texts += ["a" * 3_000 + " " + "b" * 3_000 + " " + "c" * 3_000, "", "short one"]
    texts += [("y" * 120 + " ") * 160]  # a window of too few tokens (MiniLM: one [UNK] a word): tokenized whole
    return texts


@pytest.fixture(params=["minilm", "smollm2"])
def encoders(request, tokenizer, smol_tokenizer):
    """An encoder of max_length 16 (a window of 16 characters a token: 256 characters), twice: read as it is, and
    with windows turned off (``_whole``)."""
    from conftest import _tiny

    from pmi_reward.scoring.encoder import EncoderSpec

    tok = tokenizer if request.param == "minilm" else smol_tokenizer
    model = _tiny("bert", len(tok)) if request.param == "minilm" else _tiny("llama", len(tok))
    encoder = TextEncoder(
        EncoderSpec(model="tiny", pooling="mean", max_length=16, encode_batch_size=8), model=model, tokenizer=tok
    )
    return encoder, encoder


def _whole(monkeypatch, fn):
    with monkeypatch.context() as m:
        m.setattr(encoder_module, "WINDOW_CHARS_PER_TOKEN", 10**9)
        return fn()


def test_windowed_cuts_and_ids_are_the_whole_texts(encoders, monkeypatch):
    windowed, whole = encoders
    texts = _texts()
    size = encoder_module.WINDOW_CHARS_PER_TOKEN * 16
    assert sum(_window(t, size, False) is not t for t in texts) >= 20  # most are read through a window
    for keep in ("start", "end"):
        for template in ("{text}", "Reply: {text} ."):
            got = windowed._written_ids(texts, template, keep)
            expected = _whole(monkeypatch, lambda t=template, k=keep: whole._written_ids(texts, t, k))
            assert got == expected, (keep, template)
    contexts, replies = texts, texts[::-1]
    template = "{context} => {response}"
    expected = _whole(monkeypatch, lambda: whole._pair_ids(contexts, replies, template))
    assert windowed._pair_ids(contexts, replies, template) == expected
    for keep_end in (False, True):
        budgets = [1, 5, 12] * (len(texts) // 3) + [7] * (len(texts) % 3)
        expected = _whole(monkeypatch, lambda k=keep_end, b=budgets: whole._cut(texts, b, k))
        assert windowed._cut(texts, budgets, keep_end) == expected


def test_windowed_embeddings_are_the_whole_texts(encoders, monkeypatch):
    windowed, whole = encoders
    texts = _texts()
    expected = _whole(monkeypatch, lambda: whole.encode(texts, keep="end"))
    np.testing.assert_array_equal(windowed.encode(texts, keep="end"), expected)


def test_a_window_is_cut_at_a_space_after_a_letter_or_digit():
    text = "aa, bb cc.  dd ee"
    assert _window(text, 100, False) is text  # short enough: the text itself
    assert _window("word " * 100, 40, False) == ("word " * 8).rstrip()  # at most 40 characters, at a word's end
    assert _window("word " * 100, 40, True) == " word" * 7 + " "  # from a space before a word
    assert _window("x" * 100, 40, False) == "x" * 100  # no space to cut at: the whole text
    assert _window("!! " * 50, 40, False) == "!! " * 50  # spaces only after punctuation: the whole text


def test_a_long_reply_is_no_longer_tokenized_whole(tiny_encoder_factory, monkeypatch):
    """The tokenizer reads about WINDOW_CHARS_PER_TOKEN x max_length characters of a 200k-character reply."""
    enc = tiny_encoder_factory(max_length=16)
    seen: list[int] = []
    call = type(enc.tokenizer).__call__

    def counting(self, texts, *args, **kwargs):
        seen.extend(len(t) for t in ([texts] if isinstance(texts, str) else texts))
        return call(self, texts, *args, **kwargs)

    monkeypatch.setattr(type(enc.tokenizer), "__call__", counting)
    out = enc.encode(["hello there " * 20_000])
    assert np.isfinite(out).all()
    assert max(seen) <= encoder_module.WINDOW_CHARS_PER_TOKEN * 16

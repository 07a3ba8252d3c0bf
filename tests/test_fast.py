"""The fast CPU path (``backend="onnx"``, ``quantize="int8"``) on a tiny config-built BERT: same embeddings as torch
(float32) or close ones (int8), cached graphs, separate embedding-cache entries, runtime choices never saved."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from pmi_reward.scoring import fast
from pmi_reward.scoring.cache import EmbeddingCache
from pmi_reward.scoring.encoder import EncoderRuntime, EncoderSpec, TextEncoder
from pmi_reward.scoring.head import HeadConfig, PMIHead
from pmi_reward.scoring.scorer import PMIScorer
from pmi_reward.scoring.templates import TEMPLATES

TEXTS = ["I love jazz.", "Who is your favourite?", "Coltrane, for sure. " * 5, "ok", "我喜欢爵士乐", "🙂"]


@pytest.fixture(autouse=True)
def onnx_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PMI_REWARD_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _twin(encoder: TextEncoder, cache=None, **runtime) -> TextEncoder:
    """The same model and tokenizer under another runtime."""
    spec = EncoderSpec(**{**encoder.spec.to_dict(), **runtime})
    return TextEncoder(spec, cache=cache, device="cpu", model=encoder.model, tokenizer=encoder.tokenizer)


def _cos(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def test_onnx_float32_equals_torch_and_int8_stays_close(tiny_encoder):
    reference = tiny_encoder.encode(TEXTS)
    np.testing.assert_allclose(_twin(tiny_encoder, backend="onnx").encode(TEXTS), reference, atol=2e-5)
    int8 = _twin(tiny_encoder, backend="onnx", quantize="int8").encode(TEXTS)
    assert int8.shape == reference.shape and np.isfinite(int8).all()
    assert _cos(int8, reference).min() > 0.95 and not np.allclose(int8, reference, atol=1e-6)


def test_graphs_are_built_once_per_model(tiny_encoder, onnx_cache, monkeypatch):
    first = _twin(tiny_encoder, backend="onnx", quantize="int8")
    first.encode(TEXTS[:2])
    built = sorted(p.name for p in onnx_cache.glob("onnx/*/*.onnx"))
    assert built == ["model.int8.onnx"]

    def fail(*args):
        raise AssertionError("exported again")

    monkeypatch.setattr(fast, "_export", fail)
    np.testing.assert_allclose(_twin(tiny_encoder, backend="onnx", quantize="int8").encode(TEXTS), first.encode(TEXTS))
    torch.manual_seed(1)
    other = type(tiny_encoder.model)(tiny_encoder.model.config).eval()  # other weights: another graph
    with pytest.raises(AssertionError, match="exported again"):
        fast.onnx_files(other, -1, "int8")


def test_each_runtime_keeps_its_own_cache_entries(tiny_encoder, tmp_path):
    cache = EmbeddingCache(tmp_path / "emb")
    fp32 = _twin(tiny_encoder, cache=cache).encode(TEXTS)
    int8 = _twin(tiny_encoder, cache=cache, backend="onnx", quantize="int8")
    assert not np.allclose(int8.encode(TEXTS), fp32, atol=1e-6) and int8.stats.cache_hits == 0
    assert len(cache) == 2 * len(TEXTS)
    again = _twin(tiny_encoder, cache=cache, backend="onnx", quantize="int8")
    again.encode(TEXTS)
    assert again.stats.cache_hits == len(TEXTS) and again.stats.texts == 0
    # the float32 torch fingerprint is what it always was, so caches written before the fast path stay valid
    assert "backend" not in tiny_encoder.spec.fingerprint("mean") and "onnx" in again.spec.fingerprint("mean")


def test_runtime_choices_are_validated_and_never_saved(tiny_encoder, tmp_path):
    with pytest.raises(ValueError, match="needs backend='onnx'"):
        EncoderSpec(quantize="int8")
    with pytest.raises(ValueError, match="backend must be"):
        EncoderSpec(backend="tensorrt")
    assert EncoderRuntime(backend="onnx").as_kwargs() == {"backend": "onnx"}
    encoder = _twin(tiny_encoder, backend="onnx", quantize="int8")
    scorer = PMIScorer(encoder, TEMPLATES["en"], PMIHead(HeadConfig(dim=encoder.dim)))
    saved = json.loads((scorer.save_pretrained(tmp_path / "s") / "config.json").read_text())["encoder"]
    assert "backend" not in saved and "quantize" not in saved
    assert encoder.spec.embeds_like(tiny_encoder.spec)  # same model, same settings: shareable


def test_fine_tuning_still_runs_through_torch(tiny_encoder):
    encoder = _twin(tiny_encoder, backend="onnx")
    weight = next(encoder.model.parameters())
    weight.requires_grad_(True)
    try:
        out = encoder.embed_with_grad(TEXTS[:3])
    finally:
        weight.requires_grad_(False)
    assert out.requires_grad and encoder._onnx is None  # gradients come from the torch model, not ONNX Runtime


@pytest.mark.integration
def test_minilm_scorer_on_the_fast_path(tmp_path):
    """A saved MiniLM scorer loaded with ``backend="onnx", quantize="int8"`` scores close to float32 torch."""
    encoder = TextEncoder(EncoderSpec("minilm"), device="cpu")
    torch.manual_seed(0)
    PMIScorer(encoder, TEMPLATES["en"], PMIHead(HeadConfig(dim=encoder.dim))).save_pretrained(tmp_path / "s")
    contexts, replies = ["I love jazz.\nWho is your favourite?"] * 3, ["Coltrane.", "I like pizza.", "ok"]
    reference = PMIScorer.from_pretrained(tmp_path / "s", device="cpu").score(contexts, replies)
    onnx = PMIScorer.from_pretrained(tmp_path / "s", device="cpu", backend="onnx").score(contexts, replies)
    np.testing.assert_allclose(onnx, reference, atol=1e-4)
    int8 = PMIScorer.from_pretrained(tmp_path / "s", device="cpu", backend="onnx", quantize="int8")
    assert int8.encoder.spec.quantize == "int8" and np.abs(int8.score(contexts, replies) - reference).max() < 0.1

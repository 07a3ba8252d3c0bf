"""The fast CPU path (``backend="onnx"``, ``quantize="int8"`` or ``"int8-block"``) on a tiny config-built BERT: same
embeddings as torch (float32) or close ones (int8), block-wise int8 weights stored as ONNX Runtime's
``MatMulNBits`` reads them, cached graphs, separate embedding-cache entries, runtime choices never saved."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from pmi_reward.scoring import fast
from pmi_reward.scoring.cache import EmbeddingCache
from pmi_reward.scoring.encoder import EncoderRuntime, EncoderSpec, TextEncoder
from pmi_reward.scoring.head import HeadConfig, PMIHead
from pmi_reward.scoring.scorer import PMIScorer
from pmi_reward.scoring.templates import TEMPLATES, PromptTemplate

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


def test_block_quantize_round_trips_within_half_a_step():
    rng = np.random.default_rng(0)
    weight = rng.normal(size=(45, 7)).astype(np.float32)  # K not a multiple of the block: zero-padded
    weight[:, 3] = 0.0  # an all-zero column
    weight[:16, 5] = np.abs(weight[:16, 5]) + 1.0  # a block of positives only: 0 must stay representable
    codes, scale, zero = fast.block_quantize(weight, block=16)
    assert codes.shape == (7, 3, 16) and scale.shape == zero.shape == (7, 3)
    assert codes.dtype == zero.dtype == np.uint8 and scale.dtype == np.float32
    restored = ((codes.astype(np.float32) - zero[..., None]) * scale[..., None]).reshape(7, 48).T[:45]
    assert np.all(np.abs(restored - weight) <= scale.repeat(16, 1).T[:45] / 2 + 1e-6)
    assert np.all(restored[:, 3] == 0.0) and np.all(codes[3] == zero[3][:, None])
    assert np.all((codes[5, 0].astype(int) - zero[5, 0]) >= 0)


def test_int8_block_graph_computes_the_block_dequantized_product(tmp_path):
    """One MatMul, rewritten to MatMulNBits and run by ONNX Runtime, gives x @ the dequantized weight up to the
    int8 rounding of x per block (a wrong packing layout would be off by O(1))."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(1)
    weight = rng.normal(size=(64, 24)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
        "one",
        [  # the weight listed as a graph input too, as older exporters did
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 64]),
            helper.make_tensor_value_info("w", TensorProto.FLOAT, [64, 24]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 24])],
        [numpy_helper.from_array(weight, "w")],
    )
    # IR 9, which every supported ONNX Runtime reads (onnx's newest can be newer than the runtime's)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    onnx.save(model, tmp_path / "mm.onnx")
    fast._quantize_blocks(tmp_path / "mm.onnx", tmp_path / "mm.q.onnx")
    quantized = onnx.load(tmp_path / "mm.q.onnx")
    assert [n.op_type for n in quantized.graph.node] == ["MatMulNBits"]
    assert "w" not in {t.name for t in quantized.graph.initializer}  # the float weight is gone
    assert [i.name for i in quantized.graph.input] == ["x"]
    x = rng.normal(size=(5, 64)).astype(np.float32)
    y = ort.InferenceSession(str(tmp_path / "mm.q.onnx"), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    codes, scale, zero = fast.block_quantize(weight)
    restored = ((codes.astype(np.float32) - zero[..., None]) * scale[..., None]).reshape(24, 64).T
    np.testing.assert_allclose(y, x @ restored, atol=0.05 * np.abs(x @ restored).max())
    assert np.abs(y - x @ weight).max() > 0  # it really is quantized


def test_int8_block_is_closer_to_float32_than_int8(tiny_encoder, onnx_cache):
    reference = tiny_encoder.encode(TEXTS)
    block = _twin(tiny_encoder, backend="onnx", quantize="int8-block").encode(TEXTS)
    tensor = _twin(tiny_encoder, backend="onnx", quantize="int8").encode(TEXTS)
    assert not np.allclose(block, reference, atol=1e-6)
    assert np.abs(block - reference).max() < np.abs(tensor - reference).max()
    assert _cos(block, reference).min() > 0.99
    built = sorted(p.name for p in onnx_cache.glob("onnx/*/*.onnx"))
    assert built == [f"model.int8-block{fast.BLOCK}.onnx", "model.int8.onnx"]


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
    with pytest.raises(ValueError, match="needs backend='onnx'"):
        EncoderSpec(quantize="int8-block")
    with pytest.raises(ValueError, match="quantize must be"):
        EncoderSpec(backend="onnx", quantize="int4")
    with pytest.raises(ValueError, match="quantize must be"):
        fast.onnx_files(tiny_encoder.model, -1, "int4")
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
    """A saved MiniLM scorer loaded with ``backend="onnx", quantize="int8"`` or ``dtype="bfloat16"`` scores close to
    float32 torch."""
    encoder = TextEncoder(EncoderSpec("minilm"), device="cpu")
    torch.manual_seed(0)
    PMIScorer(encoder, TEMPLATES["en"], PMIHead(HeadConfig(dim=encoder.dim))).save_pretrained(tmp_path / "s")
    contexts, replies = ["I love jazz.\nWho is your favourite?"] * 3, ["Coltrane.", "I like pizza.", "ok"]
    reference = PMIScorer.from_pretrained(tmp_path / "s", device="cpu").score(contexts, replies)
    onnx = PMIScorer.from_pretrained(tmp_path / "s", device="cpu", backend="onnx").score(contexts, replies)
    np.testing.assert_allclose(onnx, reference, atol=1e-4)
    int8 = PMIScorer.from_pretrained(tmp_path / "s", device="cpu", backend="onnx", quantize="int8")
    assert int8.encoder.spec.quantize == "int8" and np.abs(int8.score(contexts, replies) - reference).max() < 0.1
    bf16 = PMIScorer.from_pretrained(tmp_path / "s", device="cpu", dtype="bfloat16").score(contexts, replies)
    assert not np.array_equal(bf16, reference) and np.abs(bf16 - reference).max() < 0.1


def test_the_benchmarks_bare_forward_runs_the_texts_and_tokens_the_scorer_runs(tiny_encoder_factory):
    """benchmarks/fast_path.py compares speeds "on the same texts": with line features the scorer also embeds each
    context's newest lines, so the bare forward must too, or its pairs/s flatter it."""
    from benchmarks.throughput import bare_batches

    encoder = tiny_encoder_factory("bert", "mean")
    scorer = PMIScorer(encoder, TEMPLATES["en"], PMIHead(HeadConfig(dim=encoder.dim, hidden=[8], line_turns=2)))
    contexts = ["hi there\nhow are you?\nfine, thanks", "I love pizza.\nwhat did you cook?", "one line only"]
    replies = ["great to hear", "pasta tonight", "ok"]
    scorer.score(contexts, replies)
    batches = bare_batches(encoder, contexts, replies, "pair", scorer.template, line_turns=2)
    assert sum(len(b["input_ids"]) for b in batches) == encoder.stats.texts == 3 + 3 + 5
    assert sum(int(b["attention_mask"].sum()) for b in batches) == encoder.stats.tokens


@pytest.mark.parametrize(
    "mode, template",
    [
        ("prompt", PromptTemplate("zh")),
        ("prompt", PromptTemplate("plain")),
        ("prompt", PromptTemplate("Dialogue: {context} || Reply: {response}")),
        ("pair", PromptTemplate(context_template="Context: {context}", response_template="Reply: {response}")),
    ],
)
def test_the_benchmarks_bare_forward_writes_texts_with_the_scorers_template(mode, template, tiny_encoder_factory):
    """The bare forward wrote every prompt with TEMPLATES["en"] (and pair-mode texts unwrapped), whatever the
    scorer's template: for a zh, plain or custom-template scorer it ran other texts, other token counts, than
    ``PMIScorer.score``."""
    from benchmarks.throughput import bare_batches

    encoder = tiny_encoder_factory("bert", "mean", max_length=128)  # nothing cut (cut texts differ by design)
    scorer = PMIScorer(encoder, template, PMIHead(HeadConfig(dim=encoder.dim, input_mode=mode)))
    contexts = ["hi there\nhow are you?", "I love pizza.\nwhat did you cook?", "one line only"]
    replies = ["great to hear", "pasta tonight", "ok"]
    scorer.score(contexts, replies)
    batches = bare_batches(encoder, contexts, replies, mode, scorer.template)
    assert sum(len(b["input_ids"]) for b in batches) == encoder.stats.texts
    assert sum(int(b["attention_mask"].sum()) for b in batches) == encoder.stats.tokens


def _bfloat16_scorer(tiny_scorer_dir, directory):
    """The tiny scorer saved with its encoder in bfloat16 (as ``--dtype bfloat16`` saves it)."""
    loaded = PMIScorer.from_pretrained(tiny_scorer_dir, device="cpu")
    spec = EncoderSpec(**{**loaded.encoder.spec.to_dict(), "dtype": "bfloat16"})
    return PMIScorer(TextEncoder(spec, device="cpu"), loaded.template, loaded.head).save_pretrained(directory)


def test_the_fast_path_benchmarks_float32_rows_run_float32_whatever_the_scorer_was_saved_in(
    tiny_scorer_dir, topic_dialogues, tmp_path, monkeypatch, capsys
):
    """benchmarks/fast_path.py loaded its "float32" reference (the "scorer, float32 torch" and "bare float32 forward"
    rows, the accuracy reference) in the scorer's saved dtype: a scorer saved in bfloat16 was timed and compared as
    "float32"."""
    import csv
    import sys

    from pmi_reward.data.pairs import PairSet

    monkeypatch.syspath_prepend(str(Path(__file__).parents[1] / "benchmarks"))  # as the script: "from throughput"
    import fast_path

    saved = _bfloat16_scorer(tiny_scorer_dir, tmp_path / "bf16")
    pairs = PairSet.from_dialogues(topic_dialogues[:20])
    with open(tmp_path / "pairs.csv", "w", newline="") as f:
        csv.writer(f).writerows([("context", "response"), *zip(pairs.context_texts, pairs.response_texts, strict=True)])
    loads = []
    load = PMIScorer.from_pretrained.__func__

    def spy(cls, *args, **kwargs):
        scorer = load(cls, *args, **kwargs)
        loads.append((kwargs.get("dtype"), scorer.encoder.spec.dtype, next(scorer.encoder.model.parameters()).dtype))
        return scorer

    monkeypatch.setattr(PMIScorer, "from_pretrained", classmethod(spy))
    argv = ["fast_path.py", "--scorer", str(saved), "--input", str(tmp_path / "pairs.csv"), "--quantize", ""]
    argv += ["--dtypes", "bfloat16", "--pairs", "8", "--repeats", "1", "--cache_dir", str(tmp_path / "emb")]
    monkeypatch.setattr(sys, "argv", argv)
    threads = torch.get_num_threads()
    try:
        assert fast_path.main() == 0
    finally:
        torch.set_num_threads(threads)  # main sets --threads for the process
    result = json.loads(capsys.readouterr().out)
    assert set(result["speed"]["pairs_per_s"]) == {
        "bare float32 forward",
        "scorer, float32 torch",
        "scorer, torch bfloat16",
    }
    assert "torch bfloat16" in result["accuracy"]
    # timed: the reference, then torch bfloat16; accuracy: torch bfloat16, then the reference
    assert loads == [
        ("float32", "float32", torch.float32),
        ("bfloat16", "bfloat16", torch.bfloat16),
        ("bfloat16", "bfloat16", torch.bfloat16),
        ("float32", "float32", torch.float32),
    ]


def test_the_int8_batch_benchmark_runs_on_the_cpu_of_a_gpu_machine(tiny_scorer_dir, gpu_machine, capsys):
    """benchmarks/int8_batch.py loaded each path on the default device: on a machine with CUDA the GPU, where the
    onnx backend is refused, so it died at its second path (CUDA reported here; nothing may reach a GPU)."""
    from benchmarks import int8_batch

    int8_batch.main(["--scorer", str(tiny_scorer_dir)])
    rows = capsys.readouterr().out.splitlines()[2:]
    assert [r.split(" | ")[:2] for r in rows] == [
        ["| torch", "none"],
        ["| onnx", "none"],
        ["| onnx", "int8"],
        ["| onnx", "int8-block"],
    ]


def test_a_graph_build_killed_outright_leaves_no_folder_behind(tiny_encoder, onnx_cache):
    """A build killed outright (SIGKILL, the OOM killer) left its ``.build-*`` folder, the exported model (90 MB to
    0.5 GB), for good: the next build removes it under the lock, and only folders of that name."""
    import tempfile

    directory = onnx_cache / "onnx" / fast._weights_hash(tiny_encoder.model, -1)
    directory.mkdir(parents=True)
    killed = Path(tempfile.mkdtemp(dir=directory, prefix=".build-"))  # as onnx_files makes it
    (killed / "model.onnx").write_bytes(b"half an export")
    kept = [directory / ".build-notours", directory / "notes.build-abcdefgh"]
    for path in kept:
        path.mkdir()
    assert fast.onnx_files(tiny_encoder.model, -1, "int8") == directory / "model.int8.onnx"
    assert not killed.exists() and all(p.is_dir() for p in kept)
    assert sorted(p.name for p in directory.iterdir()) == sorted([".lock", "model.int8.onnx", *(p.name for p in kept)])


@pytest.mark.parametrize("native", [True, False])
def test_dtype_auto_is_bfloat16_where_the_device_runs_it_natively(native, tiny_scorer_dir, monkeypatch, tmp_path):
    """``dtype="auto"`` (the per-machine fast path): bfloat16 on a device that computes it natively (a CPU with
    AVX512-BF16 or AMX, a GPU), float32 elsewhere; embeddings stay close to float32's, and the cache keys are those
    of the concrete dtype, never "auto"."""
    from pmi_reward.scoring import encoder as encoder_module

    monkeypatch.setattr(encoder_module, "native_bf16", lambda device: native)
    contexts, replies = ["I love jazz.\nWho is your favourite?"] * 2, ["Coltrane.", "ok"]
    reference = PMIScorer.from_pretrained(tiny_scorer_dir, device="cpu")
    auto = PMIScorer.from_pretrained(tiny_scorer_dir, device="cpu", cache_dir=tmp_path / "emb", dtype="auto")
    dtype = torch.bfloat16 if native else torch.float32
    assert auto.encoder.spec.dtype == str(dtype).removeprefix("torch.")
    assert next(auto.encoder.model.parameters()).dtype == dtype
    assert '"auto"' not in auto.encoder._fingerprint
    a, b = auto.encoder.encode(TEXTS), reference.encoder.encode(TEXTS)
    assert _cos(a, b).min() > 0.999 and (not np.array_equal(a, b) if native else np.array_equal(a, b))
    assert np.isfinite(auto.score(contexts, replies)).all()
    onnx = EncoderSpec(dtype="auto", backend="onnx").on(torch.device("cpu"))
    assert onnx.dtype == "float32"  # the ONNX path runs float32 (or int8) graphs


def test_dtype_is_checked():
    with pytest.raises(ValueError, match="dtype"):
        EncoderSpec(dtype="bf16")


def test_the_onnx_session_follows_the_weights(tiny_encoder_factory):
    """A session exported before fine-tuning (a warm-up round embeds with it) kept serving the pretrained weights
    after them, and wrote those embeddings into the cache under the fine-tuned revision's key."""
    from dataclasses import replace

    encoder = tiny_encoder_factory()
    encoder.spec = replace(encoder.spec, backend="onnx")
    texts = ["I love jazz.", "Coltrane!"]
    before = encoder.encode(texts)
    with torch.no_grad():
        for p in encoder.model.parameters():  # fine-tuning changes the weights in place
            p.add_(0.05 * torch.randn_like(p))
    encoder.adopt(replace(encoder.spec, revision="tuned"))
    after = encoder.encode(texts)
    encoder.spec = replace(encoder.spec, backend="torch")
    assert np.abs(after - encoder.encode(texts)).max() < 1e-4 < np.abs(after - before).max()


def test_a_bfloat16_scorer_runs_on_the_onnx_path_in_float32(tiny_encoder_factory, tokenizer):
    """A scorer saved in bfloat16 (dtype auto on a GPU) and served with --backend onnx crashed in the export."""
    from dataclasses import replace

    from pmi_reward.scoring.encoder import EncoderSpec, TextEncoder

    assert EncoderSpec(model="m", dtype="bfloat16", backend="onnx").on(torch.device("cpu")).dtype == "float32"
    reference = tiny_encoder_factory()
    spec = replace(reference.spec, backend="onnx", dtype="bfloat16")
    model = reference.model.to(torch.bfloat16)  # as a bfloat16 scorer's encoder arrives
    onnx = TextEncoder(spec, device="cpu", model=model, tokenizer=tokenizer)
    assert onnx.spec.dtype == "float32" and np.isfinite(onnx.encode(["I love jazz.", "Coltrane!"])).all()


def test_a_max_length_beyond_the_models_positions_is_refused_at_once(tiny_model_factory, tokenizer):
    """max_length 1024 on a 512-position model trained fine on short texts, then crashed on the first long one."""
    from pmi_reward.scoring.encoder import EncoderSpec, TextEncoder

    with pytest.raises(ValueError, match="max_length 200 exceeds the 128 positions"):
        TextEncoder(
            EncoderSpec(model="tiny", pooling="mean", max_length=200),
            device="cpu",
            model=tiny_model_factory(),
            tokenizer=tokenizer,
        )

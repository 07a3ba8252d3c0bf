import numpy as np
import pytest
import torch

from pmi_reward.scoring.cache import EmbeddingCache
from pmi_reward.scoring.encoder import EncoderSpec, pool_hidden
from pmi_reward.scoring.templates import TEMPLATES, fill


def test_last_pooling_is_padding_side_aware():
    h = torch.arange(2 * 4 * 1, dtype=torch.float32).view(2, 4, 1)
    right = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]])
    left = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
    assert pool_hidden(h, right, "last").squeeze(1).tolist() == [1.0, 7.0]
    assert pool_hidden(h, left, "last").squeeze(1).tolist() == [3.0, 7.0]
    assert pool_hidden(h, right, "mean").squeeze(1).tolist() == [0.5, 5.5]


def test_float16_mean_pooling_does_not_overflow_on_a_long_text():
    """A decoder's hidden states in float16 (~800 a token, a first token at ~25,600) summed over 200 tokens passed
    float16's 65,504: the pooled embedding was inf though the forward was finite. bfloat16 keeps its own sums."""
    h = torch.full((1, 200, 2), 800.0)
    h[:, 0] = 25_600.0
    mask = torch.ones(1, 200, dtype=torch.int64)
    expected = (25_600.0 + 199 * 800.0) / 200
    pooled = pool_hidden(h.half(), mask, "mean")
    assert torch.isfinite(pooled).all()
    assert pooled[0].tolist() == pytest.approx([expected, expected], rel=1e-3)
    assert pool_hidden(h.bfloat16(), mask, "mean").dtype == torch.bfloat16


def test_onnx_without_a_named_device_runs_on_the_cpu_of_a_gpu_machine(tiny_encoder, gpu_machine):
    """``--backend onnx`` on a machine with CUDA was refused unless ``--device cpu`` was given (score and rerank had
    no such option): with no device named, ONNX Runtime's device, the CPU, is the one taken."""
    from dataclasses import replace

    from pmi_reward.scoring.encoder import TextEncoder, default_device

    assert default_device(None, "onnx") == torch.device("cpu")
    assert default_device(None) == torch.device("cuda", 0)
    assert default_device("meta", "onnx") == torch.device("meta")  # a device named is kept (and then refused)
    spec = replace(tiny_encoder.spec, backend="onnx")
    encoder = TextEncoder(spec, model=tiny_encoder.model, tokenizer=tiny_encoder.tokenizer)
    assert encoder.device == torch.device("cpu")


def test_a_cuda_device_without_an_index_is_named_by_this_threads_current_one(gpu_machine, monkeypatch):
    """CUDA's current device is per thread: a scorer loaded on ``"cuda"`` after ``set_device(1)`` and fed from the
    server's batcher thread (current device 0) got its inputs on ``cuda:0`` and its weights on ``cuda:1``. The index is
    fixed where the device is chosen, so every thread moves tensors to the weights' device."""
    from pmi_reward.scoring.encoder import default_device

    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    assert default_device(None) == torch.device("cuda", 1)
    assert default_device("cuda") == torch.device("cuda", 1)
    assert default_device(torch.device("cuda")) == torch.device("cuda", 1)
    assert default_device("cuda:0") == torch.device("cuda", 0)  # an index named is kept
    assert default_device("cpu") == torch.device("cpu")


@pytest.mark.parametrize("kind,pooling", [("bert", "mean"), ("llama", "last")])
def test_embeddings_do_not_depend_on_batch_company(tiny_encoder_factory, kind, pooling):
    enc = tiny_encoder_factory(kind, pooling, batch_size=4)
    texts = ["short", "a somewhat longer sentence about cats and dogs", "mid length text", "x" * 40, "", "🙂 你好"]
    together = enc.encode(texts)
    alone = np.stack([enc.encode([t])[0] for t in texts])
    assert together.shape == (6, 32) and np.isfinite(together).all()
    np.testing.assert_allclose(together, alone, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(together, axis=1), 1.0, atol=1e-5)


def test_context_truncation_keeps_the_end(tiny_encoder):
    enc = tiny_encoder
    old, recent = " ".join(["ancient"] * 200), "the most recent turn"
    cut = enc._cut([old + "\n" + recent], [10], keep_end=True)[0]
    assert cut.endswith(recent) and len(cut) < 120
    head = enc._cut(["first words then " + old], [3], keep_end=False)[0]
    assert head.startswith("first words")
    # a long context and a short one ending the same way embed identically once both are cut to the budget
    long_ctx = "filler " * 300 + "the end"
    longer_ctx = "other filler " * 400 + "filler " * 300 + "the end"
    np.testing.assert_allclose(enc.encode([long_ctx], keep="end"), enc.encode([longer_ctx], keep="end"), atol=1e-6)


def test_pair_prompt_keeps_response_and_template_tail(tiny_encoder):
    enc = tiny_encoder  # max_length 64
    template = TEMPLATES["en"].pair_template
    response = "a short reply"
    captured = {}
    original = enc._tokenized

    def spy(texts):
        captured["texts"] = texts
        return original(texts)

    enc._tokenized = spy
    enc.encode_pairs(["old stuff " * 100 + "latest line"], [response], template)
    prompt = captured["texts"][0]
    assert prompt.endswith(fill("Response: {response}\nResult:", response=response))
    assert "latest line" in prompt and prompt.startswith("You are an assistant")
    assert len(enc.tokenizer(prompt)["input_ids"]) <= 64


def test_cache_round_trip_and_hits(tiny_encoder_factory, tmp_path):
    cache = EmbeddingCache(tmp_path)
    enc = tiny_encoder_factory(cache=cache)
    texts = ["one", "two", "one", "three"]
    first = enc.encode(texts)
    assert enc.stats.texts == 3 and len(cache) == 3
    enc2 = tiny_encoder_factory(cache=EmbeddingCache(tmp_path))
    second = enc2.encode(texts)
    assert enc2.stats.texts == 0 and enc2.stats.cache_hits == 4
    np.testing.assert_array_equal(first, second)
    # another template or truncation side is another key
    enc2.encode(["one"], template="Context: {context}")
    assert enc2.stats.texts == 1
    long = "word " * 300 + "end"  # over max_length: its start and its end are different texts to the model
    start, end = enc2.encode([long], keep="start"), enc2.encode([long], keep="end")
    assert enc2.stats.texts == 3 and not np.allclose(start, end)
    enc3 = tiny_encoder_factory(cache=EmbeddingCache(tmp_path))
    np.testing.assert_array_equal(enc3.encode([long], keep="end"), end)
    np.testing.assert_array_equal(enc3.encode([long], keep="start"), start)
    assert enc3.stats.texts == 0 and enc3.stats.cache_hits == 2


def test_bad_template_rejected(tiny_encoder):
    with pytest.raises(ValueError, match="placeholder"):
        tiny_encoder.encode(["x"], template="no slot")


@pytest.mark.parametrize(("option", "value"), [("encode_batch_size", -1), ("encode_batch_size", 0), ("max_length", 0)])
def test_encoder_spec_refuses_sizes_below_one(option, value):
    """A batch of -1 embedded nothing and returned uninitialised memory as embeddings (scores of -20 or NaN, cached
    under keys that ignore the batch size, so later runs read them too)."""
    with pytest.raises(ValueError, match=f"{option} must be >= 1"):
        EncoderSpec(**{option: value})


def test_a_batch_size_set_at_load_time_is_checked_too(tiny_encoder_factory, tmp_path):
    """``pmi-reward score --encode_batch_size -1`` wrote garbage scores; 0 was ignored without a word."""
    cache = EmbeddingCache(tmp_path)
    enc = tiny_encoder_factory(cache=cache)
    for size in (-1, 0):
        with pytest.raises(ValueError, match="encode_batch_size must be >= 1"):
            enc.set_batch_size(size)
    enc.set_batch_size(None)  # keeps the spec's
    assert enc.spec.encode_batch_size == 8 and len(cache) == 0


def test_a_max_length_with_no_room_for_text_is_refused(tiny_encoder_factory):
    """Every text was cut to nothing, so that every context (and every reply) embedded alike."""
    enc = tiny_encoder_factory(max_length=5)
    with pytest.raises(ValueError, match="max_length 5 leaves no tokens for text"):
        enc.encode(["a long enough text", "another one"])
    with pytest.raises(ValueError, match="max_length 5 leaves no tokens for text"):
        enc.encode_pairs(["a context"], ["a reply"], TEMPLATES["en"].pair_template)


def test_embed_with_grad_matches_encode_and_reaches_the_weights(tiny_encoder_factory):
    enc = tiny_encoder_factory("bert", "mean", max_length=16)
    texts = ["one two three four five six seven eight nine ten eleven twelve thirteen fourteen", "hi", ""]
    fixed = enc.encode(texts, keep="end")
    enc.model.requires_grad_(True)
    live = enc.embed_with_grad(texts, keep="end")
    np.testing.assert_allclose(live.detach().numpy(), fixed, atol=1e-5)  # same cut, same pooling, same norm
    live.sum().backward()
    assert enc.model.embeddings.word_embeddings.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("side", ["right", "left"])
def test_batches_are_padded_as_the_tokenizer_pads_them(tiny_encoder, side, monkeypatch):
    """The encoder pads its own batches (``tokenizer.pad`` converts every token in Python): the same ids and
    attention mask as ``tokenizer.pad``, on either padding side, with an empty text among them."""
    tok = tiny_encoder.tokenizer
    monkeypatch.setattr(tok, "padding_side", side)
    ids = tok(["a much longer text than the others, by far", "short", "", "mid length text"])["input_ids"]
    ids[2] = []
    expected = tok.pad({"input_ids": ids}, return_tensors="pt")
    got = tiny_encoder._pad(ids)
    assert set(got) == set(expected)
    for key in expected:
        assert got[key].dtype == expected[key].dtype and torch.equal(got[key], expected[key]), key


@pytest.mark.parametrize("tokenizer_name", ["tokenizer", "smol_tokenizer"])
@pytest.mark.parametrize("keep", ["start", "end"])
def test_texts_alone_are_tokenized_once_to_the_same_ids(tiny_encoder, request, tokenizer_name, keep):
    """Contexts, replies and lines are tokenized once and again only where cut: the same ids as cutting the text
    first and tokenizing what is written (the two-pass way), for texts that fit, texts cut and odd texts."""
    enc = tiny_encoder  # max_length 64
    enc.tokenizer = request.getfixturevalue(tokenizer_name)
    enc._special = len(enc.tokenizer("", add_special_tokens=True)["input_ids"])
    texts = ["short", "", "🙂 你好", "a [SEP] inside <|im_end|> too", "word " * 59, "word " * 60, "old " * 300 + "end"]
    ids = enc._written_ids(texts, "{text}", keep)
    assert ids == enc._tokenized(enc._written(texts, "{text}", keep))
    assert max(len(row) for row in ids) <= 64 and len(ids[-1]) < 64  # the long ones were cut to the budget


def test_the_embedding_cache_takes_threads_in_turn_and_names_a_corrupt_file(tmp_path):
    """Threads sharing one cache interleaved transactions on its one connection (lost rows, 'cannot commit'); a
    file that is not a cache raised sqlite's bare 'file is not a database'."""
    import sqlite3
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np

    from pmi_reward.scoring.cache import EmbeddingCache

    cache = EmbeddingCache(tmp_path / "c")

    def write(t: int) -> None:
        for i in range(50):
            cache.put([f"{t}-{i}-{j}".encode() for j in range(20)], np.ones((20, 4), dtype=np.float32))

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(write, range(8)))
    assert len(cache) == 8 * 50 * 20
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "embeddings.sqlite").write_bytes(b"not a database at all" * 100)
    with pytest.raises(sqlite3.DatabaseError, match="embeddings.sqlite: not a readable embedding cache.*delete it"):
        EmbeddingCache(tmp_path / "bad")


def test_a_local_model_folder_is_cached_by_its_files_not_its_name(tmp_path, monkeypatch):
    """Cache keys held a local model as typed ("./enc"): two projects' folders, or a checkpoint retrained in place,
    shared keys and so each other's embeddings. Shipped names keep their keys (existing caches stay valid)."""
    import os

    from pmi_reward.scoring.encoder import EncoderSpec

    for name in ("p1", "p2"):
        (tmp_path / name / "enc").mkdir(parents=True)
        (tmp_path / name / "enc" / "model.safetensors").write_bytes(name.encode())
    keys = []
    for name in ("p1", "p2"):
        monkeypatch.chdir(tmp_path / name)
        keys.append(EncoderSpec(model="./enc").fingerprint("mean"))
    assert keys[0] != keys[1]
    weights = tmp_path / "p2" / "enc" / "model.safetensors"
    weights.write_bytes(b"retrained weights")
    os.utime(weights, ns=(1, 1))
    assert EncoderSpec(model="./enc").fingerprint("mean") != keys[1]
    assert '"model": "minilm"' in EncoderSpec(model="minilm").fingerprint("mean")


def test_a_folder_named_like_a_shipped_model_does_not_take_its_cache_key(tmp_path, monkeypatch, tokenizer):
    """Beside a ``./minilm`` folder, ``"minilm"`` (which loads the shipped MiniLM, as ``resolve_model`` and
    ``model_identity`` read it) was stamped as that folder, so the two shared cache keys and read each other's
    embeddings. A shipped name keeps the key it has elsewhere; the path is the folder's."""
    from pmi_reward.scoring.encoder import EncoderSpec

    elsewhere = EncoderSpec(model="minilm").fingerprint("mean")
    (tmp_path / "minilm").mkdir()
    (tmp_path / "minilm" / "model.safetensors").write_bytes(b"my own MiniLM")
    monkeypatch.chdir(tmp_path)
    shipped, folder = EncoderSpec(model="minilm").fingerprint("mean"), EncoderSpec(model="./minilm").fingerprint("mean")
    assert shipped == elsewhere and shipped != folder and str(tmp_path.resolve() / "minilm") in folder
    (tmp_path / "all-MiniLM-L6-v2").mkdir()  # an alias of a shipped model, too
    assert str(tmp_path.resolve()) not in EncoderSpec(model="all-MiniLM-L6-v2").fingerprint("mean")


def test_a_cache_that_cannot_be_written_still_gives_the_embeddings(tiny_encoder_factory, tmp_path, caplog):
    """A cache the process can read but not write (a read-only mount, another user's file, a full disk) raised
    'attempt to write a readonly database' from every put: every new reply's score failed and got empty_score, so
    an RL reward became constant with only warnings. Now its writes are skipped (one warning), its rows still read."""
    import logging
    import sqlite3

    texts = ["seen before", "new one", "another new one"]
    writer = EmbeddingCache(tmp_path)
    expected = tiny_encoder_factory(cache=writer).encode(texts)
    writer._db.execute("DELETE FROM emb WHERE rowid > 1")  # the cache now holds only the first text
    writer._db.commit()
    writer.close()
    cache = EmbeddingCache(tmp_path)
    cache._db.close()  # as a process that may read the file but not write it opens it (root ignores chmod 0444)
    cache._db = sqlite3.connect(f"file:{cache.path}?mode=ro", uri=True, check_same_thread=False)
    enc = tiny_encoder_factory(cache=cache)
    with caplog.at_level(logging.WARNING, logger="pmi_reward.scoring.cache"):
        np.testing.assert_allclose(enc.encode(texts), expected, atol=1e-6)
        np.testing.assert_allclose(enc.encode(texts[1:]), expected[1:], atol=1e-6)
    assert enc.stats.cache_hits == 1 and not cache.writable and len(cache) == 1
    warned = [r.getMessage() for r in caplog.records if "cannot write it" in r.getMessage()]
    assert len(warned) == 1 and "embeddings.sqlite" in warned[0] and "readonly" in warned[0]


def test_a_cache_write_that_finds_it_locked_is_skipped_not_raised(tmp_path):
    """Another process holding the write lock past the busy timeout: that write is dropped, later ones still go."""
    import sqlite3

    cache = EmbeddingCache(tmp_path)
    cache._db.close()
    cache._db = sqlite3.connect(cache.path, timeout=0.05, check_same_thread=False)
    other = sqlite3.connect(cache.path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    cache.put([b"a"], np.ones((1, 4), dtype=np.float32))
    other.execute("ROLLBACK")
    assert cache.writable and len(cache) == 0
    cache.put([b"b"], np.ones((1, 4), dtype=np.float32))
    assert len(cache) == 1
    other.close()


def test_a_cache_write_that_may_clear_is_skipped_once_warned_and_writes_go_on(tmp_path, caplog):
    """A full disk, an I/O error or WAL's locking protocol (SQLITE_PROTOCOL: "locking protocol", which a match on
    "locked" missed) turned the cache's writes off for the rest of the run; they skip that write, warned once."""
    import logging
    import sqlite3

    cache = EmbeddingCache(tmp_path)
    real = cache._db

    class Failing:
        def __init__(self, code, message):
            self.code, self.message = code, message

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def executemany(self, *args):
            err = sqlite3.OperationalError(self.message)
            err.sqlite_errorcode = self.code
            raise err

    with caplog.at_level(logging.WARNING, logger="pmi_reward.scoring.cache"):
        for code, message in ((15, "locking protocol"), (13, "database or disk is full"), (10, "disk I/O error")):
            cache._db = Failing(code, message)
            cache.put([b"a"], np.ones((1, 4), dtype=np.float32))
            cache.put([b"a"], np.ones((1, 4), dtype=np.float32))
            assert cache.writable
        cache._db = real
        cache.put([b"b"], np.ones((1, 4), dtype=np.float32))
        assert len(cache) == 1
        cache._db = Failing(8, "attempt to write a readonly database")
        cache.put([b"c"], np.ones((1, 4), dtype=np.float32))
        assert not cache.writable
    skipped = [r.getMessage() for r in caplog.records if "write skipped" in r.getMessage()]
    assert len(skipped) == 3  # one per kind, not one per write
    cache._db = real
    cache.close()

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from pmi_reward.rewards.reward import PMIReward
from pmi_reward.scoring.head import HeadConfig, PMIHead
from pmi_reward.scoring.scorer import PMIScorer, ScorerLoadError
from pmi_reward.scoring.templates import TEMPLATES


@pytest.fixture(params=["pair", "prompt", "pair-lines"])
def scorer(request, tiny_encoder):
    torch.manual_seed(0)
    mode, _, lines = request.param.partition("-")
    head = PMIHead(HeadConfig(dim=tiny_encoder.dim, input_mode=mode, cap=3.0, line_turns=2 if lines else 0))
    return PMIScorer(tiny_encoder, TEMPLATES["en"], head, {"note": "test"})


CTX = ["hi there\nhow are you?", "I like jazz", "", "我喜欢音乐"]
RESP = ["fine thanks", "me too, Coltrane!", "hello", "🎵 我也是"]


def test_scores_are_float32_bounded_and_finite(scorer):
    with torch.no_grad():
        for p in scorer.head.parameters():
            p.mul_(50)  # push raw outputs far beyond the cap
    s = scorer.score(CTX, RESP)
    assert s.dtype == np.float32 and s.shape == (4,)
    assert np.isfinite(s).all() and np.all(np.abs(s) <= 3.0)


def test_save_load_round_trip_gives_identical_scores(scorer, tmp_path):
    before = scorer.score(CTX, RESP)
    scorer.save_pretrained(tmp_path / "s")
    assert sorted(p.name for p in (tmp_path / "s").iterdir()) == [
        "README.md",
        "config.json",
        "head.safetensors",
        "metadata.json",
    ]
    loaded = PMIScorer.from_pretrained(tmp_path / "s", encoder=scorer.encoder)
    np.testing.assert_array_equal(before, loaded.score(CTX, RESP))
    assert loaded.metadata == {"note": "test"} and loaded.input_mode == scorer.input_mode


def test_config_holds_what_inference_needs_and_provenance_lives_apart(scorer, tmp_path):
    scorer.context_turns = 2
    scorer.save_pretrained(tmp_path / "s")
    config = json.loads((tmp_path / "s" / "config.json").read_text())
    assert config["version"] == 2 and config["context_turns"] == 2 and "metadata" not in config
    assert set(config) == {"format", "version", "encoder", "template", "head", "context_turns", "head_sha256"}
    assert json.loads((tmp_path / "s" / "metadata.json").read_text()) == {"note": "test"}
    (tmp_path / "s" / "metadata.json").unlink()  # provenance is never needed to score
    loaded = PMIScorer.from_pretrained(tmp_path / "s", encoder=scorer.encoder)
    assert loaded.context_turns == 2 and loaded.metadata == {}
    np.testing.assert_array_equal(scorer.score(CTX, RESP), loaded.score(CTX, RESP))


def test_version_1_scorers_still_load(scorer, tmp_path):
    """Version 1 kept the provenance in config.json, the context-turn count in it, and called the encoder's
    batch ``batch_size`` and the template's fields ``name/pair/context/response``."""
    scorer.save_pretrained(tmp_path / "s")
    config = json.loads((tmp_path / "s" / "config.json").read_text())
    encoder = {**config["encoder"], "batch_size": config["encoder"].pop("encode_batch_size")}
    template = {
        "name": "en",
        "pair": config["template"]["pair_template"],
        "context": "{context}",
        "response": "{response}",
    }
    v1 = {
        "format": config["format"],
        "version": 1,
        "encoder": encoder,
        "template": template,
        "head": config["head"],
        "metadata": {"note": "v1", "data": {"dialogues": "chitchat", "max_context_turns": 3}},
    }
    (tmp_path / "s" / "config.json").write_text(json.dumps(v1))
    (tmp_path / "s" / "metadata.json").unlink()
    loaded = PMIScorer.from_pretrained(tmp_path / "s", encoder=scorer.encoder)
    assert loaded.context_turns == 3 and loaded.metadata["note"] == "v1"
    assert loaded.template == scorer.template and loaded.encoder.spec.embeds_like(scorer.encoder.spec)
    np.testing.assert_array_equal(scorer.score(CTX, RESP), loaded.score(CTX, RESP))
    del v1["metadata"]["data"]  # a v1 scorer trained through the Python API: every turn
    (tmp_path / "s" / "config.json").write_text(json.dumps(v1))
    assert PMIScorer.from_pretrained(tmp_path / "s", encoder=scorer.encoder).context_turns is None


def test_score_validates_inputs(scorer):
    with pytest.raises(ValueError, match="2 contexts but 1 responses"):
        scorer.score(["a", "b"], ["c"])
    with pytest.raises(TypeError, match=r"responses\[1\] must be a string"):
        scorer.score(["a", "b"], ["c", None])
    with pytest.raises(TypeError, match="sequence of strings"):
        scorer.score("abc", "def")
    with pytest.raises(ValueError, match=r"responses\[1\] is blank"):  # PMI is undefined for it, not a number
        scorer.score(["a", "b"], ["c", " \n"])
    assert scorer.score([], []).shape == (0,)


def test_corrupted_or_partial_scorer_dirs_fail_clearly(scorer, tmp_path, monkeypatch):
    good = scorer.save_pretrained(tmp_path / "good")
    with pytest.raises(ScorerLoadError, match="not a directory"):
        PMIScorer.from_pretrained(tmp_path / "missing")
    with monkeypatch.context() as m:  # the commands' default directory says how to make it
        m.chdir(tmp_path)
        with pytest.raises(ScorerLoadError, match="make scorer"):
            PMIReward.from_pretrained()
    partial = tmp_path / "partial"
    partial.mkdir()
    (partial / "config.json").write_text((good / "config.json").read_text())
    with pytest.raises(ScorerLoadError, match="missing head.safetensors"):
        PMIScorer.from_pretrained(partial, encoder=scorer.encoder)
    (partial / "head.safetensors").write_bytes((good / "head.safetensors").read_bytes()[:100])
    # (tmp_path's own name holds "corrupted": each match names the file; a broken download is fixed by another)
    with pytest.raises(ScorerLoadError, match="head.safetensors is not the head .* re-download or save again"):
        PMIScorer.from_pretrained(partial, encoder=scorer.encoder)
    unrecorded = {k: v for k, v in json.loads((good / "config.json").read_text()).items() if k != "head_sha256"}
    (partial / "config.json").write_text(json.dumps(unrecorded))  # a scorer saved before the digest was recorded
    with pytest.raises(ScorerLoadError, match="head.safetensors: corrupted .* re-download or save again"):
        PMIScorer.from_pretrained(partial, encoder=scorer.encoder)
    (partial / "config.json").write_text("{not json")
    with pytest.raises(ScorerLoadError, match="config.json: corrupted"):
        PMIScorer.from_pretrained(partial)
    (partial / "config.json").write_text(json.dumps({"format": "something-else"}))
    with pytest.raises(ScorerLoadError, match="not a pmi-reward scorer"):
        PMIScorer.from_pretrained(partial)
    config = json.loads((good / "config.json").read_text())
    config["head"]["hidden"] = [7]
    (partial / "config.json").write_text(json.dumps(config))
    (partial / "head.safetensors").write_bytes((good / "head.safetensors").read_bytes())
    with pytest.raises(ScorerLoadError, match="do not match"):
        PMIScorer.from_pretrained(partial, encoder=scorer.encoder)


def test_non_finite_head_weights_are_refused_at_load(scorer, tmp_path):
    """A head with NaN weights would score NaN everywhere (and write NaN into JSON): refused, naming the weights."""
    with torch.no_grad():
        next(scorer.head.parameters()).fill_(float("nan"))
    scorer.metadata = {"val_auc": float("nan")}
    scorer.save_pretrained(tmp_path / "s")
    assert json.loads((tmp_path / "s" / "metadata.json").read_text()) == {"val_auc": None}  # valid JSON, no NaN
    with pytest.raises(ScorerLoadError, match="NaN or infinite"):
        PMIScorer.from_pretrained(tmp_path / "s", encoder=scorer.encoder)


def test_saved_files_follow_the_umask(scorer, tmp_path):
    old = os.umask(0o022)
    try:
        scorer.save_pretrained(tmp_path / "open")
        os.umask(0o077)
        scorer.save_pretrained(tmp_path / "private")
    finally:
        os.umask(old)
    for folder, mode in (("open", 0o644), ("private", 0o600)):
        modes = {p.name: p.stat().st_mode & 0o777 for p in (tmp_path / folder).iterdir()}
        assert set(modes.values()) == {mode}, modes


def test_a_save_cut_short_is_refused_and_a_load_time_dtype_is_not_saved(tiny_scorer_dir, tmp_path):
    """save_pretrained wrote config.json first: a save killed before the head left the new config beside the old
    head, which loaded as a mix without a word. The config now comes last with the head's digest. A dtype chosen at
    load time (the machine's) was written back as the scorer's own."""
    import json
    import shutil

    loaded = PMIScorer.from_pretrained(tiny_scorer_dir, dtype="bfloat16")
    saved = loaded.save_pretrained(tmp_path / "s")
    config = json.loads((saved / "config.json").read_text())
    assert config["encoder"]["dtype"] == "float32" and len(config["head_sha256"]) == 64
    PMIScorer.from_pretrained(saved)  # whole: loads
    other = tmp_path / "other"
    shutil.copytree(saved, other)
    with torch.no_grad():
        next(loaded.head.parameters()).add_(1.0)
    loaded.save_pretrained(other)
    shutil.copy(saved / "config.json", other / "config.json")  # the old config beside the new head
    with pytest.raises(ScorerLoadError, match="is not the head .* was saved with"):
        PMIScorer.from_pretrained(other)


def test_a_scorer_copies_and_a_pickled_reward_keeps_its_load_time_dtype(tiny_scorer_dir):
    """The tokenizer lock made scorers impossible to deepcopy or pickle; a reward pickled across processes (TRL,
    verl) was rebuilt in the saved dtype, not the one it was loaded with."""
    import copy
    import pickle

    from pmi_reward.rewards.reward import PMIReward

    scorer = PMIScorer.from_pretrained(tiny_scorer_dir, dtype="bfloat16")
    twin = copy.deepcopy(scorer)
    np.testing.assert_array_equal(twin.score(CTX, RESP), scorer.score(CTX, RESP))
    clone = pickle.loads(pickle.dumps(PMIReward(scorer)))
    assert clone.scorer.encoder.spec.dtype == "bfloat16"


def test_a_pickled_reward_keeps_its_runtime_cache_device_and_saved_dtype(tiny_scorer_dir, tmp_path, monkeypatch):
    """A pickled PMIReward was rebuilt from config.json alone: an onnx/int8 scorer came back torch float32, on the
    default device (a GPU where there is one, not the CPU chosen), without its embedding cache and with no saved
    dtype. The clone scores identically, where the original ran."""
    import pickle

    monkeypatch.setenv("PMI_REWARD_CACHE", str(tmp_path / "onnx"))  # where the ONNX export is kept
    scorer = PMIScorer.from_pretrained(
        tiny_scorer_dir, device="cpu", cache_dir=tmp_path / "emb", backend="onnx", quantize="int8"
    )
    reward = PMIReward(scorer)
    expected = reward(CTX[:2], RESP[:2])
    data = pickle.dumps(reward)
    with monkeypatch.context() as gpu:  # unpickled on a machine with a GPU
        gpu.setattr(torch.cuda, "is_available", lambda: True)
        clone = pickle.loads(data)
    encoder = clone.scorer.encoder
    assert encoder.spec == scorer.encoder.spec and (encoder.spec.backend, encoder.spec.quantize) == ("onnx", "int8")
    assert encoder.device == torch.device("cpu")
    assert encoder.cache is not None and encoder.cache.path == scorer.encoder.cache.path
    assert clone.scorer.saved_dtype == scorer.saved_dtype == "float32"
    assert clone(CTX[:2], RESP[:2]) == expected
    assert encoder.stats.cache_hits > 0  # read from the original's cache, under the same (onnx, int8) keys


def test_a_pickled_reward_takes_a_gpu_index_or_cache_only_where_this_process_has_them(
    tiny_scorer_dir, tmp_path, monkeypatch
):
    """cuda:3 on a worker with one GPU, and a cache folder that cannot be made there (another machine's path), were
    errors at unpickling: the default device, and no cache (with a warning), instead."""
    import pickle

    reward = PMIReward(PMIScorer.from_pretrained(tiny_scorer_dir, device="cpu", cache_dir=tmp_path / "emb"))
    state = reward.__getstate__()
    assert Path(state["cache_dir"]).is_absolute()
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    state.update(device="cuda:3", cache_dir=str(blocker / "cache"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    clone = PMIReward.__new__(PMIReward)
    with pytest.warns(UserWarning, match="unusable here"):
        clone.__setstate__(pickle.loads(pickle.dumps(state)))
    assert clone.scorer.encoder.device == torch.device("cpu") and clone.scorer.encoder.cache is None
    assert clone(CTX[:2], RESP[:2]) == reward(CTX[:2], RESP[:2])


def test_a_reward_loaded_with_dtype_auto_resolves_it_again_where_unpickled(tiny_scorer_dir, monkeypatch):
    """dtype "auto" became bfloat16 on a host with native bf16 and was pickled so: a worker without it ran the
    encoder in emulated (slow) bfloat16 where a fresh load picks float32. An explicit dtype stays pinned."""
    import pickle

    from pmi_reward.scoring import encoder as encoder_module

    monkeypatch.setattr(encoder_module, "native_bf16", lambda device: True)  # the host: AVX512-BF16 or a GPU
    reward = PMIReward(PMIScorer.from_pretrained(tiny_scorer_dir, device="cpu", dtype="auto"))
    assert reward.scorer.encoder.spec.dtype == "bfloat16"
    blob = pickle.dumps(reward)
    monkeypatch.setattr(encoder_module, "native_bf16", lambda device: False)  # the worker: an AVX2-only CPU
    clone = pickle.loads(blob)
    assert clone.scorer.encoder.spec.dtype == "float32"
    assert next(clone.scorer.encoder.model.parameters()).dtype == torch.float32


def test_a_scorer_built_with_dtype_auto_saves_auto_and_each_machine_resolves_it(tiny_scorer_dir, tmp_path, monkeypatch):
    """A scorer trained with ``--dtype auto`` on a machine with native bf16 saved the resolved "bfloat16": an AVX2 CPU
    loading it without a dtype ran emulated (several times slower) bfloat16, where auto means float32. It saves
    "auto" now, resolved again by each machine that loads it; scorers saved with a concrete dtype load unchanged."""
    from pmi_reward.scoring import encoder as encoder_module
    from pmi_reward.scoring.encoder import EncoderSpec, TextEncoder

    def recorded(directory: Path) -> str:
        return json.loads((directory / "config.json").read_text())["encoder"]["dtype"]

    trained = PMIScorer.from_pretrained(tiny_scorer_dir, device="cpu")
    spec = EncoderSpec(**{**trained.encoder.spec.to_dict(), "dtype": "auto"})
    monkeypatch.setattr(encoder_module, "native_bf16", lambda device: True)  # the training machine: GPU or AMX CPU
    encoder = TextEncoder(spec, device="cpu")
    assert encoder.spec.dtype == "bfloat16"
    saved = PMIScorer(encoder, trained.template, trained.head).save_pretrained(tmp_path / "auto")
    assert recorded(saved) == "auto"
    bf16 = PMIScorer.from_pretrained(saved, device="cpu")
    assert bf16.encoder.spec.dtype == "bfloat16" and bf16.saved_dtype == "auto"
    assert recorded(bf16.save_pretrained(tmp_path / "again")) == "auto"  # saved again as loaded: still "auto"
    float32 = PMIScorer.from_pretrained(tiny_scorer_dir, device="cpu")  # saved in float32: stays float32
    assert float32.encoder.spec.dtype == "float32"
    monkeypatch.setattr(encoder_module, "native_bf16", lambda device: False)  # the serving machine: an AVX2-only CPU
    served = PMIScorer.from_pretrained(saved, device="cpu")
    assert served.encoder.spec.dtype == "float32"
    assert next(served.encoder.model.parameters()).dtype == torch.float32
    pinned = tmp_path / "pinned"  # saved in bfloat16 (before this fix, or asked so): stays bfloat16 everywhere
    PMIScorer(
        TextEncoder(EncoderSpec(**{**spec.to_dict(), "dtype": "bfloat16"}), device="cpu"),
        trained.template,
        trained.head,
    ).save_pretrained(pinned)
    assert recorded(pinned) == "bfloat16"
    assert PMIScorer.from_pretrained(pinned, device="cpu").encoder.spec.dtype == "bfloat16"


def test_a_scorer_with_an_embedding_cache_copies_and_its_copy_reads_the_same_file(tiny_scorer_dir, tmp_path):
    """The cache's lock and sqlite connection made a scorer with a cache impossible to deepcopy or pickle."""
    import copy
    import pickle

    scorer = PMIScorer.from_pretrained(tiny_scorer_dir, device="cpu", cache_dir=tmp_path / "emb")
    before = scorer.score(CTX[:2], RESP[:2])
    for twin in (copy.deepcopy(scorer), pickle.loads(pickle.dumps(scorer))):
        assert twin.encoder.cache.path == scorer.encoder.cache.path
        np.testing.assert_array_equal(twin.score(CTX[:2], RESP[:2]), before)
        assert twin.encoder.stats.cache_hits > 0


@pytest.mark.parametrize("mode", ["pair", "prompt", "pair-lines"])
def test_a_decoder_scores_texts_as_training_writes_them(mode, smol_tokenizer):
    """Training writes a reply's line breaks as spaces and a context as its stripped, non-blank lines (PairSet,
    join_turns); scoring kept "\\n" in replies (and blank lines, stray spaces in contexts), which a decoder's
    tokenizer (SmolLM2's) reads as other tokens: another embedding than the one trained on."""
    from conftest import _tiny

    from pmi_reward.data.pairs import PairSet
    from pmi_reward.scoring.encoder import EncoderSpec, TextEncoder

    spec = EncoderSpec(model="tiny-llama", pooling="mean", max_length=64, encode_batch_size=8)
    encoder = TextEncoder(spec, model=_tiny("llama", len(smol_tokenizer)), tokenizer=smol_tokenizer, device="cpu")
    assert not np.array_equal(encoder.encode(["a\nb"]), encoder.encode(["a b"]))  # the tokenizer tells them apart
    kind, _, lines = mode.partition("-")
    torch.manual_seed(0)
    head = PMIHead(HeadConfig(dim=encoder.dim, input_mode=kind, line_turns=2 if lines else 0))
    scorer = PMIScorer(encoder, TEMPLATES["en"], head)
    np.testing.assert_array_equal(scorer.score(["hi"], ["a\nb"]), scorer.score(["hi"], ["a b"]))
    contexts, replies = [" hi there \n\n how are you?\n", "I like jazz"], ["Sure:\n1. pack\n2. go", "me\ntoo "]
    pairs = PairSet.from_pairs(contexts, replies, max_context_turns=3)  # as training writes them
    assert pairs.response_texts[0] == "Sure: 1. pack 2. go" and pairs.context_texts[0] == "hi there\nhow are you?"
    np.testing.assert_array_equal(
        scorer.score(contexts, replies), scorer.score(pairs.context_texts, pairs.response_texts)
    )


def _fine_tuned(tiny_encoder_factory, tmp_path: Path) -> tuple[PMIScorer, Path]:
    """A scorer whose encoder has weights of its own (as after fine-tuning), saved with them in ``encoder/``."""
    from pmi_reward.training.trainable import finish_tuning

    encoder = tiny_encoder_factory("bert", "mean")
    with torch.no_grad():
        next(encoder.model.parameters()).add_(0.05)
    finish_tuning(encoder)
    torch.manual_seed(0)
    scorer = PMIScorer(encoder, TEMPLATES["en"], PMIHead(HeadConfig(dim=encoder.dim, cap=3.0)))
    return scorer, scorer.save_pretrained(tmp_path / "good")


def test_a_fine_tuned_encoder_with_a_file_missing_or_changed_is_refused_naming_it(tiny_encoder_factory, tmp_path):
    """A fine-tuned scorer whose encoder/tokenizer.json was lost loaded with a 5-token tokenizer and scored every text
    alike; another model's weights in encoder/ loaded without a word. config.json records each file's digest."""
    import shutil

    scorer, good = _fine_tuned(tiny_encoder_factory, tmp_path)
    recorded = json.loads((good / "config.json").read_text())["encoder_sha256"]
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(recorded)
    assert all(len(d) == 64 for d in recorded.values())
    np.testing.assert_array_equal(
        PMIScorer.from_pretrained(good, device="cpu").score(CTX, RESP), scorer.score(CTX, RESP)
    )

    def broken(name: str, change) -> Path:
        copy = tmp_path / name
        shutil.copytree(good, copy)
        change(copy / "encoder")
        return copy

    lost = broken("lost", lambda e: (e / "tokenizer.json").unlink())
    with pytest.raises(ScorerLoadError, match=r"encoder/tokenizer.json: missing .* re-download or save again"):
        PMIScorer.from_pretrained(lost, device="cpu")
    swapped = broken("swapped", lambda e: tiny_encoder_factory("bert", "mean").model.save_pretrained(e))
    with pytest.raises(ScorerLoadError, match=r"encoder/model.safetensors is not the file .* re-download or save"):
        PMIScorer.from_pretrained(swapped, device="cpu")


def _unrecorded(directory: Path) -> Path:
    """``directory``'s config.json as a scorer saved before the encoder's digests were recorded writes it."""
    config = json.loads((directory / "config.json").read_text())
    config.pop("encoder_sha256", None)
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def test_a_fine_tuned_scorer_saved_before_the_digests_loads_unless_its_tokenizer_is_gone(
    tiny_encoder_factory, tmp_path
):
    """Scorers saved without encoder digests still load, but one with no tokenizer vocabulary left is refused (it
    loaded a tokenizer of 5 special tokens, which reads every text alike)."""
    import shutil

    scorer, good = _fine_tuned(tiny_encoder_factory, tmp_path)
    _unrecorded(good)
    np.testing.assert_array_equal(
        PMIScorer.from_pretrained(good, device="cpu").score(CTX, RESP), scorer.score(CTX, RESP)
    )
    lost = tmp_path / "lost"
    shutil.copytree(good, lost)
    (lost / "encoder" / "tokenizer.json").unlink()
    with pytest.raises(ScorerLoadError, match=r"encoder: the fine-tuned encoder has no tokenizer"):
        PMIScorer.from_pretrained(lost, device="cpu")


def test_a_truncated_fine_tuned_encoder_is_a_load_error_the_cli_reports(tiny_encoder_factory, tmp_path):
    """A truncated encoder/model.safetensors (in a scorer without digests, which would name the file first) raised
    safetensors' own error, which escaped the CLI's user errors and the server's ScorerLoadError handler."""
    from pmi_reward.cli.main import main

    good = _unrecorded(_fine_tuned(tiny_encoder_factory, tmp_path)[1])
    weights = good / "encoder" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    with pytest.raises(ScorerLoadError, match=r"encoder: corrupted or incomplete fine-tuned encoder"):
        PMIScorer.from_pretrained(good, device="cpu")
    (tmp_path / "in.jsonl").write_text(json.dumps({"context": "hi", "response": "hello"}) + "\n")
    argv = ["score", "--input", str(tmp_path / "in.jsonl"), "--output", str(tmp_path / "out.jsonl"), "--scorer"]
    assert main([*argv, str(good), "--progress", "false"]) == 2  # a user error, not a traceback


def test_a_fine_tuned_encoder_saved_from_an_auto_load_records_its_dtype_and_keeps_its_weights(
    tiny_encoder, tmp_path, monkeypatch
):
    """A fine-tuned encoder's weights are written in the dtype they are held in: saving "auto" for it let a machine
    with native bf16 load them as bfloat16 and save them back rounded, past the guard on float32-saved ones."""
    from pmi_reward.scoring import encoder as encoder_module
    from pmi_reward.training.trainable import finish_tuning

    finish_tuning(tiny_encoder)  # as a fine-tune leaves it: ./encoder
    with torch.no_grad():
        for p in tiny_encoder.model.parameters():
            p.add_(1e-4 * torch.randn_like(p))  # weights that bfloat16 would round
    ft = PMIScorer(tiny_encoder, TEMPLATES["en"], PMIHead(HeadConfig(dim=tiny_encoder.dim))).save_pretrained(
        tmp_path / "ft"
    )
    monkeypatch.setattr(encoder_module, "native_bf16", lambda device: False)
    loaded = PMIScorer.from_pretrained(ft, device="cpu", dtype="auto")
    again = PMIScorer(loaded.encoder, loaded.template, PMIHead(HeadConfig(dim=tiny_encoder.dim)))
    head2 = again.save_pretrained(tmp_path / "head2")
    assert json.loads((head2 / "config.json").read_text())["encoder"]["dtype"] == "float32"
    monkeypatch.setattr(encoder_module, "native_bf16", lambda device: True)
    with pytest.raises(ValueError, match="loaded in bfloat16"):
        PMIScorer.from_pretrained(head2, device="cpu", dtype="auto").save_pretrained(tmp_path / "resaved")


def test_a_revision_with_the_commands_default_folder_is_refused(tiny_scorer_dir, tmp_path, monkeypatch):
    """The default folder skipped the Hub resolution, so a revision given with it was silently dropped."""
    import shutil

    monkeypatch.chdir(tmp_path)
    shutil.copytree(tiny_scorer_dir, tmp_path / "outputs" / "scorer")
    with pytest.raises(ScorerLoadError, match="applies to Hub repo ids only"):
        PMIScorer.from_pretrained("outputs/scorer", revision="v2", device="cpu")
    assert PMIScorer.from_pretrained("outputs/scorer", device="cpu").directory is not None

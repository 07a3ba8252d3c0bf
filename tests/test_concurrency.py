"""Findings of the concurrency review: a scorer that cannot run fails when it is loaded, not at every call; a reward
call's failed scores show in its metrics; verl's concurrent per-response calls share scorer calls; verl's in-process
scorer takes an embedding cache."""

from __future__ import annotations

import logging
import pickle
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

import pmi_reward.rewards.verl as verl_adapter
from pmi_reward.rewards.reward import PMIReward
from pmi_reward.scoring.encoder import EncoderSpec, TextEncoder
from pmi_reward.scoring.scorer import PMIScorer

CONTEXT = "I just got back from a hiking trip.\nOh nice, where did you go?\nYosemite, the views were amazing."
REPLIES = [f"Did you see Half Dome, day {i}?" for i in range(8)]  # one prompt's GRPO group


def test_an_onnx_scorer_without_onnx_runtime_fails_when_loaded(tiny_encoder, tiny_scorer_dir, monkeypatch):
    """``backend="onnx"`` without ``pmi-reward[fast]`` loaded without a word and then failed every call, which the
    reward turned into ``empty_score`` for every sample: a constant RL reward. Now the load raises the install hint
    (an encoder made, a scorer or a reward loaded, or a copy unpickled in a process without the packages)."""
    spec = EncoderSpec(**{**tiny_encoder.spec.to_dict(), "backend": "onnx"})
    present = TextEncoder(spec, device="cpu", model=tiny_encoder.model, tokenizer=tiny_encoder.tokenizer)
    copied = pickle.dumps(present)
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # as on a machine without it: `import onnxruntime` fails
    hint = r"pip install 'pmi-reward\[fast\]'.*missing here: onnxruntime"
    with pytest.raises(ModuleNotFoundError, match=hint):  # an ImportError the commands print as a user error
        TextEncoder(spec, device="cpu", model=tiny_encoder.model, tokenizer=tiny_encoder.tokenizer)
    with pytest.raises(ImportError, match=hint):
        PMIScorer.from_pretrained(tiny_scorer_dir, device="cpu", backend="onnx")
    with pytest.raises(ImportError, match=hint):
        PMIReward.from_pretrained(tiny_scorer_dir, device="cpu", backend="onnx")
    with pytest.raises(ImportError, match=hint):
        pickle.loads(copied)
    # the torch backend does not need it
    assert PMIScorer.from_pretrained(tiny_scorer_dir, device="cpu").score([CONTEXT], [REPLIES[0]]).shape == (1,)


def test_failed_scores_are_a_logged_metric(spread_scorer, monkeypatch):
    """A scorer failing on every pair gave every sample ``empty_score`` while the metrics said nothing (``empty_frac``
    0.0, ``raw_pmi_mean`` left out). ``score_failed_frac`` is the share of the scorable samples whose score failed."""
    real = spread_scorer.score
    broken = {"all": False}

    def flaky(contexts, responses, progress=False):
        if broken["all"] or len(responses) > 1 or responses[0] == "boom":
            raise RuntimeError("encoder failure")
        return real(contexts, responses)

    monkeypatch.setattr(spread_scorer, "score", flaky)
    reward = PMIReward(spread_scorer)

    def metrics(replies: list[str]) -> tuple[list, dict]:
        logged: dict[str, float] = {}
        out = reward([CONTEXT] * len(replies), replies, log_metric=logged.__setitem__)
        return out, logged

    out, logged = metrics(["fine", "boom", "also fine", ""])  # the empty reply is not scorable: empty_frac's
    assert out[1] == out[3] == -5.0 and out[0] != -5.0 and out[2] != -5.0
    assert logged["pmi_reward/score_failed_frac"] == pytest.approx(1 / 3)
    assert logged["pmi_reward/empty_frac"] == 0.25
    out, logged = metrics(["fine", "also fine"])
    assert logged["pmi_reward/score_failed_frac"] == 0.0
    broken["all"] = True  # a scorer broken for good: a constant reward, and the metric says so
    out, logged = metrics(["fine", "also fine", "good"])
    assert out == [-5.0] * 3 and logged["pmi_reward/score_failed_frac"] == 1.0
    assert logged["pmi_reward/empty_frac"] == 0.0 and "pmi_reward/raw_pmi_mean" not in logged
    _, logged = metrics(["", " "])  # nothing scorable: nothing failed
    assert logged["pmi_reward/score_failed_frac"] == 0.0


def test_verl_concurrent_calls_share_scorer_calls(spread_scorer, monkeypatch):
    """verl's reward loop calls ``compute_score`` once per response from a thread pool, and the in-process reward
    scored them one pair per scorer call, in turn: the G responses of a prompt each embedded its context again.
    Calls that wait while the scorer works are now scored together in one scorer call, which embeds the context
    once, with the scores of calls made one at a time."""
    expected = [PMIReward(spread_scorer)([CONTEXT], [r])[0] for r in REPLIES]  # one call per response
    calls: list[int] = []
    entered, release = threading.Event(), threading.Event()
    real = spread_scorer.score

    def gated(contexts, responses, progress=False):
        calls.append(len(responses))
        if len(calls) == 1:  # the first call holds the scorer until every other call is waiting
            entered.set()
            assert release.wait(30)
        return real(contexts, responses)

    monkeypatch.setattr(verl_adapter.PMIScorer, "from_pretrained", lambda *a, **k: spread_scorer)
    kwargs = {"scorer": "s-merged", "device": "cpu"}
    verl_adapter._load_reward.cache_clear()
    try:
        reward = verl_adapter._reward(*verl_adapter._settings(kwargs))
        monkeypatch.setattr(spread_scorer, "score", gated)
        texts = spread_scorer.encoder.stats.texts
        with ThreadPoolExecutor(8) as pool:
            first = pool.submit(verl_adapter.compute_score, "d", REPLIES[0], None, {"context": CONTEXT}, **kwargs)
            assert entered.wait(30)
            rest = [
                pool.submit(verl_adapter.compute_score, "d", r, None, {"context": CONTEXT}, **kwargs)
                for r in REPLIES[1:]
            ]
            deadline = time.monotonic() + 5
            batcher = getattr(reward, "batcher", None)
            while (batcher is None or batcher.queued < 7) and time.monotonic() < deadline:
                time.sleep(0.01)
            release.set()
            got = [f.result(30) for f in [first, *rest]]
        embedded = spread_scorer.encoder.stats.texts - texts
    finally:
        release.set()
        verl_adapter._load_reward.cache_clear()
    assert calls == [1, 7]  # the seven that waited: one scorer call
    assert embedded == (1 + 1) + (1 + 7)  # the context once per scorer call, each reply once
    assert [g["pmi_no_context"] for g in got] == [0.0] * 8
    np.testing.assert_allclose([g["score"] for g in got], expected, atol=1e-5, rtol=0)
    assert len({round(g["score"], 4) for g in got}) > 1  # scores that tell the replies apart


def test_verl_in_process_scorer_takes_an_embedding_cache(tiny_scorer_dir, tmp_path, monkeypatch, caplog):
    """``cache_dir`` in ``reward_kwargs`` was warned away as an unknown keyword, so the in-process scorer re-embedded
    a prompt's context for each of its responses; it is now ``PMIScorer.from_pretrained``'s embedding cache."""
    monkeypatch.setattr(verl_adapter, "_unknown_warned", set())
    kwargs = {"scorer": str(tiny_scorer_dir), "device": "cpu", "cache_dir": str(tmp_path / "emb")}
    verl_adapter._load_reward.cache_clear()
    try:
        with caplog.at_level(logging.WARNING, logger="pmi_reward.rewards.verl"):
            first = [verl_adapter.compute_score("d", r, None, {"context": CONTEXT}, **kwargs) for r in REPLIES[:2]]
        reward = verl_adapter._reward(*verl_adapter._settings(kwargs))
        cache = reward.scorer.encoder.cache
        assert cache is not None and Path(cache.path).parent.resolve() == (tmp_path / "emb").resolve()
        hits = reward.scorer.encoder.stats.cache_hits
        again = [verl_adapter.compute_score("d", r, None, {"context": CONTEXT}, **kwargs) for r in REPLIES[:2]]
        assert reward.scorer.encoder.stats.cache_hits - hits == 4  # the context and the reply of each call
    finally:
        verl_adapter._load_reward.cache_clear()
    assert "unknown keyword" not in caplog.text
    scores = [a["score"] for a in again]
    assert scores == pytest.approx([f["score"] for f in first], abs=1e-6)
    plain = PMIReward.from_pretrained(tiny_scorer_dir, device="cpu")
    assert scores == pytest.approx([plain([CONTEXT], [r])[0] for r in REPLIES[:2]], abs=1e-5)


def test_verl_in_process_reward_scores_in_a_forked_child(spread_scorer, monkeypatch):
    """A process forked after a first ``compute_score`` (a fork Pool, ``datasets.map(num_proc=...)``) inherits the
    loaded reward but not its batcher's worker thread: the child's call queued a job nothing would score and waited
    forever. The child starts a batcher of its own and scores as the parent does."""
    import multiprocessing

    monkeypatch.setattr(verl_adapter.PMIScorer, "from_pretrained", lambda *a, **k: spread_scorer)
    kwargs = {"scorer": "s-forked", "device": "cpu"}
    verl_adapter._load_reward.cache_clear()
    try:
        parent = verl_adapter.compute_score("d", REPLIES[1], None, {"context": CONTEXT}, **kwargs)["score"]
        context = multiprocessing.get_context("fork")
        answers = context.Queue()

        def child() -> None:
            answers.put(verl_adapter.compute_score("d", REPLIES[1], None, {"context": CONTEXT}, **kwargs)["score"])

        process = context.Process(target=child)
        process.start()
        process.join(60)
        hung = process.is_alive()
        if hung:
            process.kill()
            process.join()
    finally:
        verl_adapter._load_reward.cache_clear()
    assert not hung, "the forked child's call never returned"
    assert process.exitcode == 0
    assert answers.get(timeout=10) == pytest.approx(parent, abs=1e-6)


def test_onnx_on_a_gpu_says_to_use_torch_before_asking_for_onnx_runtime(tiny_encoder, monkeypatch):
    """On a GPU without ONNX Runtime, the load asked to install it, and once installed refused the GPU: the answer
    that holds (use the torch backend there) comes first."""
    from dataclasses import replace

    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    spec = replace(tiny_encoder.spec, backend="onnx")
    with pytest.raises(ValueError, match="runs on the CPU"):
        TextEncoder(spec, device="meta", model=tiny_encoder.model, tokenizer=tiny_encoder.tokenizer)

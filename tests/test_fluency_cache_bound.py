"""The fluency penalty's log-likelihood cache stays bounded over a long RL run: every step's replies are new, so an
unbounded in-memory cache only grew (~250 B a reply, never read again). Values must not change."""

from __future__ import annotations

import numpy as np
import pytest

from pmi_reward.evaluation.baselines.jsonl_cache import JsonlCache
from pmi_reward.evaluation.baselines.lm_pmi import LMPMIConfig, LMPMIScorer
from pmi_reward.rewards.fluency import FluencyPenalty

WORDS = ("the", "a", "cat", "dog", "pizza", "tennis", "rome", "jazz", "guitar", "bread", "match", "team")


def _texts(rng: np.random.Generator, n: int, tag: str) -> list[str]:
    return [" ".join(rng.choice(WORDS, size=4)) + f" {tag}{i}" for i in range(n)]


def test_a_bounded_jsonl_cache_drops_its_oldest_entries_and_its_file_keeps_them_all(tmp_path):
    memory = JsonlCache(max_entries=3)
    memory.add({"a": 1, "b": 2})
    memory.add({"c": 3, "d": 4, "e": 5})
    assert list(memory.items()) == [("c", 3), ("d", 4), ("e", 5)]

    path = tmp_path / "cache.jsonl"
    on_disk = JsonlCache(path, max_entries=2)
    on_disk.add({"a": 1, "b": 2, "c": 3})
    assert dict(on_disk) == {"b": 2, "c": 3}
    assert JsonlCache(path) == {"a": 1, "b": 2, "c": 3}  # the file is not trimmed
    assert JsonlCache(path, max_entries=1) == {"c": 3}  # a bounded reader keeps the newest
    with pytest.raises(ValueError, match="max_entries must be at least 1"):
        JsonlCache(max_entries=0)


def test_a_bounded_scorer_gives_the_same_log_likelihoods_and_keeps_at_most_its_bound(tiny_policy, smol_tokenizer):
    """Including a call with more new replies than the bound, and repeats of replies whose entries were dropped."""
    model = tiny_policy(0).eval().requires_grad_(False)
    plain = LMPMIScorer(LMPMIConfig(model="tiny"), model=model, tokenizer=smol_tokenizer)
    bounded = LMPMIScorer(LMPMIConfig(model="tiny"), model=model, tokenizer=smol_tokenizer, cache_entries=5)
    rng = np.random.default_rng(0)
    context = "hello there"
    calls = [_texts(rng, 3, "a"), _texts(rng, 9, "b")]  # the second alone overflows the bound
    calls.append(calls[0][:2] + calls[1][:2] + _texts(rng, 2, "c"))  # dropped and kept ones, and new ones
    calls.append(calls[1][-3:] + calls[1][-3:])  # kept ones, each twice in the call
    for replies in calls:
        assert bounded.log_likelihoods(context, replies) == plain.log_likelihoods(context, replies)
        assert bounded.log_likelihoods(None, replies) == plain.log_likelihoods(None, replies)
        assert len(bounded._cache) <= 5
    assert len(plain._cache) == 2 * 14  # every distinct reply, with and without the context


def test_build_rewards_gives_the_fluency_penalty_a_bounded_cache_with_unchanged_penalties(
    monkeypatch, tiny_policy, smol_tokenizer
):
    from pmi_reward.policy import trainers

    assert 1000 <= trainers.FLUENCY_CACHE_ENTRIES <= 10_000  # a few thousand: a step's repeats, a few MB at most
    monkeypatch.setattr(trainers.PMIReward, "from_pretrained", lambda *a, **k: lambda **kw: [])
    monkeypatch.setattr(trainers, "FLUENCY_CACHE_ENTRIES", 16)
    args = trainers.ScriptArguments(scorer="unused", fluency_penalty=-10.0, fluency_max_nll=2.66)
    penalty = trainers.build_rewards(args, model=tiny_policy(0), tokenizer=smol_tokenizer)[-1]
    assert isinstance(penalty, FluencyPenalty)
    assert penalty.lm._cache.path is None and penalty.lm._cache.max_entries == 16
    unbounded = LMPMIScorer(penalty.lm.config, model=penalty.lm.model, tokenizer=smol_tokenizer)
    reference = FluencyPenalty(unbounded, args.fluency_max_nll, args.fluency_penalty)
    rng = np.random.default_rng(1)
    for step in range(8):  # RL steps: two prompts, three new completions each
        prompts = [[{"role": "user", "content": t}] for t in _texts(rng, 2, f"p{step}-") for _ in range(3)]
        completions = [[{"role": "assistant", "content": t}] for t in _texts(rng, 6, f"s{step}-")]
        got = penalty(prompts=prompts, completions=completions)
        assert got == reference(prompts=prompts, completions=completions)
        assert penalty.penalised == reference.penalised
        contexts = [p[0]["content"] for p in prompts]
        replies = [c[0]["content"] for c in completions]
        np.testing.assert_array_equal(penalty.nll(contexts, replies), reference.nll(contexts, replies))
        assert len(penalty.lm._cache) <= 16
    assert len(unbounded._cache) == 8 * 6  # what it kept before: every reply of the run

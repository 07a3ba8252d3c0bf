"""The fluency penalty: a TRL reward function that penalises replies the starting chat model finds unlikely."""

import math

import numpy as np
import pytest

from pmi_reward.data.conversation import turns_to_messages
from pmi_reward.evaluation.baselines.lm_pmi import LMPMIConfig, LMPMIScorer
from pmi_reward.rewards.combined import CombinedReward
from pmi_reward.rewards.fluency import FluencyPenalty

PROMPT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What did you do this weekend?"}]


def _completions(*texts):
    return [[{"role": "assistant", "content": t}] for t in texts]


def test_the_penalty_falls_on_replies_above_the_threshold_and_keeps_the_trl_contract(tiny_policy, smol_tokenizer):
    lm = LMPMIScorer(LMPMIConfig(model="tiny"), model=tiny_policy(), tokenizer=smol_tokenizer)
    replies = ["I went hiking.", "zq xv pyrofloakes lifeskiaerwalk qq", ""]
    nll = FluencyPenalty(lm).nll(["What did you do this weekend?"] * 3, replies)
    assert np.isfinite(nll).all() and (nll > 0).all() and len(set(nll.round(6))) == 3
    edge = float(np.sort(nll)[1])  # between the lowest and the highest: the highest alone is above it
    penalty = FluencyPenalty(lm, max_nll=edge, penalty=-10.0)
    out = penalty(prompts=[PROMPT] * 4, completions=_completions(*replies, None), completion_ids=[[1]] * 4)
    assert isinstance(out, list) and len(out) == 4 and penalty.__name__ == "fluency_penalty"
    assert out[:3] == [-10.0 if v > edge else 0.0 for v in nll] and out.count(-10.0) == 1
    assert out[3] is None  # no reply text: unscorable, not a crash
    assert penalty.penalised == pytest.approx(1 / 3)
    assert (
        CombinedReward([lambda prompts, completions, **k: [1.0] * len(completions), penalty])(
            [[{"role": "system", "content": "x"}]] + [PROMPT], _completions("a", replies[0])
        )[0]
        == 1.0
    )  # a prompt with no turn to reply to: the penalty abstains (None counts as 0 in the sum)
    with pytest.raises(ValueError, match="max_nll"):
        FluencyPenalty(lm, max_nll=math.nan)
    with pytest.raises(ValueError, match="prompts"):
        penalty(prompts=[PROMPT], completions=_completions("a", "b"))


def test_each_reply_is_read_after_its_own_prompt_in_a_call_of_several(tiny_policy, smol_tokenizer):
    """A GRPO/RLOO/RFT call holds several prompts: each reply's NLL is the one it gets alone after its own prompt,
    not after another sample's (every value-checking test above used one context for all replies, and reading every
    reply after the first sample's context passed them), and the penalty follows it."""
    lm = LMPMIScorer(LMPMIConfig(model="tiny"), model=tiny_policy(), tokenizer=smol_tokenizer)
    contexts = ["What did you do this weekend?", "I love jazz.\nWho do you like?"] * 2  # interleaved: A, B, A, B
    replies = ["I went hiking.", "Coltrane, and you?", "Nothing much.", "zq xv pyrofloakes"]
    penalty = FluencyPenalty(lm)
    alone = np.array([penalty.nll([c], [r])[0] for c, r in zip(contexts, replies, strict=True)])
    after_first = penalty.nll([contexts[0]] * 4, replies)
    assert np.abs(alone - after_first)[[1, 3]].min() > 1e-3  # the context changes the reading: the test can fail
    np.testing.assert_allclose(penalty.nll(contexts, replies), alone, rtol=0, atol=1e-5)
    # a threshold between reply 1's NLL after its own prompt and after the first one: the penalty follows its own
    edge = float((alone[1] + after_first[1]) / 2)
    prompts = [turns_to_messages(c) for c in contexts]  # chat prompts whose turns read back as these contexts
    out = FluencyPenalty(lm, max_nll=edge)(prompts=prompts, completions=_completions(*replies))
    assert out == [-10.0 if v > edge else 0.0 for v in alone]
    assert out[1] != (-10.0 if after_first[1] > edge else 0.0)


def test_a_call_that_scores_nothing_reports_no_penalised_share():
    """``penalised`` kept the previous call's share when a call had nothing to score (rft's round log reported it
    as that round's): it is None then, as the log's ``score`` is for a round that scored nothing."""

    class EveryReplyUnlikely:  # 10 nats a token for every reply: each one scored is penalised
        def log_likelihoods(self, context, replies):
            return [(-10.0, 1) for _ in replies]

    penalty = FluencyPenalty(EveryReplyUnlikely(), max_nll=3.0)
    assert penalty(prompts=["I love jazz."], completions=["Coltrane!"]) == [-10.0] and penalty.penalised == 1.0
    assert penalty(prompts=["I love jazz.", ""], completions=[None, "Hi"]) == [None, None]
    assert penalty.penalised is None
    assert penalty(prompts=["I love jazz.", "Hi"], completions=[None, "Hello"]) == [None, -10.0]
    assert penalty.penalised == 1.0  # the share of the replies scored, the unscorable one left out


def test_the_penalty_abstains_on_unreadable_text_and_takes_numpy_arrays(tiny_policy, smol_tokenizer):
    """Inside a TRL call a lone surrogate (in the reply or the prompt) made the tokenizer raise, and numpy arrays
    of prompts and completions (a dataset's columns) raised on ``prompts or []``: None for the unreadable sample,
    and arrays read as lists."""
    lm = LMPMIScorer(LMPMIConfig(model="tiny"), model=tiny_policy(), tokenizer=smol_tokenizer)
    penalty = FluencyPenalty(lm, max_nll=5.0)
    odd = [{"role": "user", "content": "I love jazz \udcff"}]
    out = penalty(
        prompts=[PROMPT, PROMPT, odd],
        completions=_completions("jazz \udcff", "I went hiking.", "Me too."),
        completion_ids=[[1]] * 3,
        trainer_state=None,
    )
    assert out[0] is None and out[1] in (0.0, -10.0) and out[2] is None
    arrays = penalty(prompts=np.array(["I love jazz.", "Hi"]), completions=np.array(["Me too!", "Hello"]))
    assert arrays == penalty(prompts=["I love jazz.", "Hi"], completions=["Me too!", "Hello"])
    assert len(arrays) == 2 and all(v in (0.0, -10.0) for v in arrays)


def test_build_rewards_adds_the_penalty_on_a_frozen_copy_of_the_starting_model(
    monkeypatch, tiny_policy, smol_tokenizer
):
    """The copy does not follow the policy as it trains, and the weights count it."""
    import torch

    from pmi_reward.policy import trainers
    from pmi_reward.policy.trainers import ScriptArguments, build_rewards, check_reward_weights

    monkeypatch.setattr(trainers.PMIReward, "from_pretrained", lambda *a, **k: lambda **kw: [])
    policy = tiny_policy()
    args = ScriptArguments(scorer="unused", truncation_penalty=-2.0, fluency_penalty=-10.0, fluency_max_nll=3.0)
    rewards = build_rewards(args, model=policy, tokenizer=smol_tokenizer)
    penalty = rewards[-1]
    assert isinstance(penalty, FluencyPenalty) and len(rewards) == 3
    assert (penalty.max_nll, penalty.penalty) == (3.0, -10.0)
    before = penalty.nll(["hello there"], ["hi!"])
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(1.0)
    assert penalty.nll(["hello there"], ["hi!"]) == pytest.approx(before)
    check_reward_weights(args, [1.0, 1.0, 1.0])
    check_reward_weights(args, [1.0], penalty_default=True)
    with pytest.raises(ValueError, match="the truncation penalty, the fluency penalty"):
        check_reward_weights(args, [1.0, 1.0])
    with pytest.raises(ValueError, match="starting model"):
        build_rewards(ScriptArguments(scorer="unused", fluency_penalty=-10.0))
    with pytest.raises(ValueError, match="fluency_max_nll"):
        ScriptArguments(scorer="unused", fluency_penalty=-10.0, fluency_max_nll=0.0)


def test_the_penalty_reads_in_bfloat16_when_asked_close_to_float32(monkeypatch, tiny_policy, smol_tokenizer):
    """``--fluency_dtype bfloat16``: a cheaper reading on CPUs with bf16 arithmetic; the policy itself is untouched."""
    import torch

    from pmi_reward.policy import trainers
    from pmi_reward.policy.trainers import ScriptArguments, build_rewards

    monkeypatch.setattr(trainers.PMIReward, "from_pretrained", lambda *a, **k: lambda **kw: [])
    policy = tiny_policy()
    contexts, replies = ["hello there", "what did you do?"], ["hi! how are you?", "zq xv qq pyrofloakes"]
    nll = {}
    for dtype in ("float32", "bfloat16"):
        args = ScriptArguments(scorer="unused", fluency_penalty=-10.0, fluency_dtype=dtype)
        penalty = build_rewards(args, model=policy, tokenizer=smol_tokenizer)[-1]
        assert next(penalty.lm.model.parameters()).dtype == getattr(torch, dtype)
        nll[dtype] = penalty.nll(contexts, replies)
    assert next(policy.parameters()).dtype == torch.float32
    assert np.isfinite(nll["bfloat16"]).all() and not np.array_equal(nll["bfloat16"], nll["float32"])
    assert nll["bfloat16"] == pytest.approx(nll["float32"], abs=0.1)
    with pytest.raises(ValueError, match="fluency_dtype"):
        ScriptArguments(scorer="unused", fluency_penalty=-10.0, fluency_dtype="float16")


def test_the_real_base_model_penalises_invented_words_and_not_a_fluent_reply():
    """At the default threshold (the base's own 95th percentile), SmolLM2-135M-Instruct as the starting model."""
    penalty = FluencyPenalty(LMPMIScorer())
    fluent = "I went hiking with my dog and we had a great time."
    invented = "Especially pyrofloakes haha. They're a lifeskiaerwalk!! balances haha."
    assert penalty(prompts=[PROMPT, PROMPT], completions=_completions(fluent, invented)) == [0.0, -10.0]

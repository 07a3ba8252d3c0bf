"""Our PPO: the math (GAE, whitening, KL shaping, clipped loss), one update on a fixed batch, zero KL at
step 0, and a two-step run on a tiny config-built policy (LoRA and full fine-tuning)."""

import json
import math

import pytest
import torch
from accelerate import Accelerator
from trl import ModelConfig

from pmi_reward.policy.ppo import (
    PolicyWithValue,
    PPOConfig,
    ppo_step,
    ppo_update,
    response_mask,
    response_stats,
    rollout,
    train_ppo,
)
from pmi_reward.policy.ppo_core import gae, ppo_loss, shaped_rewards, whiten
from pmi_reward.policy.trainers import ScriptArguments


def test_gae_matches_a_direct_computation():
    torch.manual_seed(0)
    rewards, values = torch.randn(3, 5), torch.randn(3, 5)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 0, 0, 0, 0]], dtype=torch.float)
    gamma, lam = 0.9, 0.8
    adv, ret = gae(rewards, values, mask, gamma, lam)
    for b in range(3):
        n = int(mask[b].sum())
        for t in range(n):
            expected = sum(
                (gamma * lam) ** (k - t)
                * (rewards[b, k] + gamma * (values[b, k + 1] if k + 1 < n else 0) - values[b, k])
                for k in range(t, n)
            )
            assert adv[b, t].item() == pytest.approx(expected.item(), abs=1e-5)
        assert torch.all(adv[b, n:] == 0) and torch.all(ret[b, n:] == 0)
    torch.testing.assert_close(ret, (adv + values) * mask)


def test_whiten_and_kl_shaping():
    x, mask = torch.randn(4, 6) * 5 + 3, torch.ones(4, 6)
    mask[0, 3:] = 0
    w = whiten(x, mask)
    vals = w[mask.bool()]
    assert vals.mean().abs() < 1e-5 and vals.std().item() == pytest.approx(1.0, abs=1e-4) and torch.all(w[0, 3:] == 0)
    logp, ref = torch.full((2, 4), -1.0), torch.full((2, 4), -1.5)
    m = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]], dtype=torch.float)
    rewards, kl = shaped_rewards(torch.tensor([2.0, -1.0]), logp, ref, m, kl_coef=0.1)
    torch.testing.assert_close(kl, 0.5 * m)
    torch.testing.assert_close(rewards, torch.tensor([[-0.05, 1.95, 0, 0], [-0.05, -0.05, -0.05, -1.05]]))
    assert response_mask(torch.tensor([[5, 2, 2, 2], [5, 6, 7, 8]]), {2}).tolist() == [[1, 1, 0, 0], [1, 1, 1, 1]]


def test_clipped_loss_stops_pushing_past_the_clip():
    old, adv, mask = torch.zeros(1, 2), torch.ones(1, 2), torch.ones(1, 2)
    inside = torch.tensor([[0.1, 0.1]], requires_grad=True)
    outside = torch.tensor([[0.5, 0.5]], requires_grad=True)
    zeros = torch.zeros(1, 2)
    for logp, grad_nonzero in ((inside, True), (outside, False)):
        loss, stats = ppo_loss(logp, old, adv, zeros, zeros, zeros, mask, clip_range=0.2)
        loss.backward()
        assert (logp.grad.abs().sum() > 0) == grad_nonzero
    assert stats["clip_frac"] == 1.0
    # clip_frac counts the tokens whose gradient the clip removes, as TRL's pg_clipfrac: a ratio outside the range
    # on the side the advantage pushes away from still learns (here tokens 0 and 3)
    logp, adv = torch.log(torch.tensor([[0.5, 1.5, 0.5, 1.5]])), torch.tensor([[1.0, 1.0, -1.0, -1.0]])
    z, m = torch.zeros(1, 4), torch.ones(1, 4)
    assert ppo_loss(logp, z, adv, z, z, z, m)[1]["clip_frac"] == 0.5


def test_the_value_loss_clips_a_prediction_toward_the_rollouts_and_is_added_to_the_policy_loss():
    """The critic's loss, with known numbers: a prediction that moved past ``clip_range_value`` from the rollout's
    is also read at the clip, and the larger error of the two counts (TRL's clipped value loss); the total loss is
    the policy loss plus ``vf_coef`` times it, so that its gradient pulls each value toward its return. Unclipped,
    clipped the wrong way (the smaller error) or subtracted (the critic trained to grow its error), PPO still ran
    to finite numbers and every test here passed."""
    zero, mask = torch.zeros(1, 2), torch.ones(1, 2)
    values, old, returns = torch.tensor([[1.0, 0.0]]), torch.zeros(1, 2), torch.tensor([[1.0, 0.5]])
    # token 0: |1 - 1|^2 = 0 unclipped, |0.2 - 1|^2 = 0.64 clipped: the max is 0.64; token 1: 0.25 either way
    loss, stats = ppo_loss(zero, zero, zero, values, old, returns, mask, clip_range_value=0.2, vf_coef=1.0)
    assert stats["value_loss"] == pytest.approx(0.5 * (0.64 + 0.25) / 2)  # 0.2225; unclipped or min: 0.0625
    assert stats["policy_loss"] == 0.0 and loss.item() == pytest.approx(0.2225)
    # inside the clip the value loss is 0.5 (v - R)^2 averaged: its gradient is (v - R) / n, toward the return
    inside = torch.tensor([[0.1, 0.1]], requires_grad=True)
    loss, stats = ppo_loss(zero, zero, zero, inside, old, torch.full((1, 2), 0.5), mask, vf_coef=1.0)
    loss.backward()
    torch.testing.assert_close(inside.grad, torch.full((1, 2), (0.1 - 0.5) / 2))
    # beside a policy loss, with the default vf_coef 0.1: the sum, not the difference
    logp, adv = torch.log(torch.tensor([[1.1, 0.9]])), torch.tensor([[1.0, 1.0]])
    loss, stats = ppo_loss(logp, zero, adv, values, old, returns, mask, vf_coef=0.1)
    assert stats["policy_loss"] == pytest.approx(-1.0) and stats["value_loss"] == pytest.approx(0.2225)
    assert loss.item() == pytest.approx(-1.0 + 0.1 * 0.2225)


def test_whitening_keeps_its_digits_far_from_zero():
    """Advantages of mean 1000 and spread 0.5: one-pass sums in float32 gave a spread of 1.25 after whitening."""
    x = torch.randn(64, 16, generator=torch.Generator().manual_seed(0)) * 0.5 + 1000
    vals = whiten(x, torch.ones_like(x)).flatten()
    assert vals.std().item() == pytest.approx(1.0, abs=1e-3)


def test_a_mini_batch_with_nothing_to_learn_takes_no_step(tiny_policy, smol_tokenizer):
    """Every reply unscorable: no token to learn from, so the weights stay as they were (AdamW's weight decay moved
    them on a zero loss), and the loss statistics are NaN, not a number."""
    torch.manual_seed(0)
    policy = PolicyWithValue(tiny_policy()).eval()
    batch, cfg, acc = _fixed_batch(policy, smol_tokenizer)
    batch["loss_mask"] = torch.zeros_like(batch["mask"])
    batch["advantages"], batch["returns"] = torch.ones_like(batch["mask"]), torch.zeros_like(batch["mask"])
    before = {k: v.clone() for k, v in policy.state_dict().items()}
    stats = ppo_update(policy, torch.optim.AdamW(policy.parameters(), lr=1e-2), acc, batch, cfg)
    assert all(torch.equal(before[k], v) for k, v in policy.state_dict().items())
    assert math.isnan(stats["policy_loss"]) and set(stats) == {"policy_loss", "value_loss", "clip_frac", "approx_kl"}

    class OthersHaveTokens:  # another process holds tokens of this mini-batch: this one steps along, reports nothing
        def __getattr__(self, name):
            return getattr(acc, name)

        def reduce(self, tensor, op):
            return tensor + 5

    stats = ppo_update(policy, torch.optim.SGD(policy.parameters(), lr=0.1), OthersHaveTokens(), batch, cfg)
    assert math.isnan(stats["policy_loss"]) and math.isnan(stats["clip_frac"])  # its zeros would halve the pooled mean


def _fixed_batch(policy, tokenizer):
    prompts = [[{"role": "user", "content": "I love jazz."}], [{"role": "user", "content": "I love jazz."}]]
    cfg = PPOConfig(max_new_tokens=6, temperature=1.0)
    acc = Accelerator(cpu=True)
    batch = rollout(
        policy,
        None if hasattr(policy.lm, "disable_adapter") else policy,
        tokenizer,
        prompts,
        lambda p, c, **k: [1.0, -1.0],
        cfg,
        acc,
    )
    return batch, cfg, acc


def test_one_update_raises_the_probability_of_high_advantage_tokens(tiny_policy, smol_tokenizer):
    torch.manual_seed(0)
    policy = PolicyWithValue(tiny_policy()).eval()
    batch, cfg, acc = _fixed_batch(policy, smol_tokenizer)
    mask = batch["mask"]
    batch["advantages"] = torch.stack([mask[0], -mask[1]])  # reply 0 good, reply 1 bad, on every token
    batch["returns"] = torch.zeros_like(mask)
    before = batch["logprobs"].clone()
    cfg.ppo_epochs, cfg.mini_batch_size, cfg.learning_rate = 1, 2, 1e-2
    optim = torch.optim.AdamW(policy.parameters(), lr=cfg.learning_rate)
    stats = ppo_update(policy, optim, acc, batch, cfg)
    after, _ = response_stats(policy, batch, cfg.temperature)
    gain = ((after - before) * mask).sum(1) / mask.sum(1)
    assert gain[0] > 0 > gain[1], gain
    assert stats["clip_frac"] == 0.0  # a single pass starts on-policy: ratios are exactly 1


def test_an_unscorable_reply_carries_no_learning_signal(tiny_policy, smol_tokenizer):
    """None from the reward (unscorable) is not a reward of 0: as in TRL's GRPO/RLOO the reply is left out."""
    import copy

    torch.manual_seed(0)
    policy = PolicyWithValue(tiny_policy()).eval()
    prompts = [[{"role": "user", "content": "I love jazz."}], [{"role": "user", "content": "Who is your favourite?"}]]
    cfg, acc = PPOConfig(max_new_tokens=6, temperature=1.0, ppo_epochs=1, mini_batch_size=2), Accelerator(cpu=True)
    batch = rollout(policy, policy, smol_tokenizer, prompts, lambda p, c, **k: [None, 1.0], cfg, acc)
    assert batch["scored"].tolist() == [False, True]
    assert batch["loss_mask"][0].sum() == 0 and torch.equal(batch["loss_mask"][1], batch["mask"][1])
    batch["returns"] = torch.zeros_like(batch["mask"])
    updated = []
    for junk in (0.0, 100.0):  # whatever the unscored reply's advantage, the update is the same
        copy_ = copy.deepcopy(policy)
        batch["advantages"] = torch.stack([batch["mask"][0] * junk, batch["mask"][1]])
        torch.manual_seed(1)
        ppo_update(copy_, torch.optim.SGD(copy_.parameters(), lr=0.1), acc, batch, cfg)
        updated.append(copy_.state_dict())
    assert all(torch.equal(updated[0][k], updated[1][k]) for k in updated[0])
    stats = ppo_step(
        copy.deepcopy(policy),
        policy,
        torch.optim.SGD(policy.parameters(), lr=0.0),
        smol_tokenizer,
        prompts,
        lambda p, c, **k: [None, 1.5],
        cfg,
        acc,
    )
    assert stats["score"] == 1.5 and stats["unscorable"] == 0.5  # the mean is over scorable replies


def test_one_update_pulls_the_values_toward_their_returns(tiny_policy, smol_tokenizer):
    """The value head learns its returns: one update with every return one above the rollout's value lowers the
    squared error of the values (a value loss subtracted from the policy loss raised it)."""
    torch.manual_seed(0)
    policy = PolicyWithValue(tiny_policy()).eval()
    batch, cfg, acc = _fixed_batch(policy, smol_tokenizer)
    mask = batch["mask"]
    batch["advantages"], batch["returns"] = torch.zeros_like(mask), (batch["values"] + 1) * mask
    cfg.ppo_epochs, cfg.mini_batch_size = 1, 2

    def error(values: torch.Tensor) -> float:
        return (((values - batch["returns"]) ** 2) * mask).sum().item()

    before = error(batch["values"])
    ppo_update(policy, torch.optim.SGD(policy.parameters(), lr=0.1), acc, batch, cfg)
    with torch.no_grad():
        _, values = response_stats(policy, batch, cfg.temperature)
    assert error(values) < before - 1e-3, (error(values), before)


def test_a_step_puts_the_kl_penalty_of_its_config_in_the_rewards(tiny_policy, smol_tokenizer, monkeypatch):
    """--kl_coef reaches the rewards that GAE reads: each token's reward is -kl_coef (log pi - log ref) on a
    reference that differs from the policy, plus the score on the last real token. A step that passed 0.0 for
    it (no penalty: the policy free to drift from its reference) passed every PPO test."""
    from pmi_reward.policy import ppo

    seen = {}
    real_rollout, real_gae = ppo.rollout, ppo.gae

    def spy_rollout(*args, **kwargs):
        seen["batch"] = real_rollout(*args, **kwargs)
        return seen["batch"]

    def spy_gae(rewards, *args):
        seen["rewards"] = rewards.clone()
        return real_gae(rewards, *args)

    monkeypatch.setattr(ppo, "rollout", spy_rollout)
    monkeypatch.setattr(ppo, "gae", spy_gae)
    torch.manual_seed(0)
    policy, reference = PolicyWithValue(tiny_policy()).eval(), PolicyWithValue(tiny_policy(1)).eval()
    prompts = [[{"role": "user", "content": "I love jazz."}], [{"role": "user", "content": "Who is your favourite?"}]]
    cfg = PPOConfig(max_new_tokens=6, temperature=1.0, kl_coef=0.5, ppo_epochs=1, mini_batch_size=2)
    scores = [1.0, -2.0]
    ppo_step(
        policy,
        reference,
        torch.optim.SGD(policy.parameters(), lr=0.0),
        smol_tokenizer,
        prompts,
        lambda p, c, **k: scores,
        cfg,
        Accelerator(cpu=True),
    )
    batch, rewards = seen["batch"], seen["rewards"]
    mask = batch["mask"]
    kl = (batch["logprobs"] - batch["ref_logprobs"]) * mask
    assert kl.abs().max() > 0.1  # another policy: the penalty is not nothing
    expected = -0.5 * kl
    for row, score in enumerate(scores):
        expected[row, int(mask[row].sum()) - 1] += score
    torch.testing.assert_close(rewards, expected)


def test_kl_is_zero_at_step_zero_with_lora(tiny_policy, smol_tokenizer):
    from peft import LoraConfig, get_peft_model

    lm = get_peft_model(tiny_policy(), LoraConfig(r=4, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
    batch, _, _ = _fixed_batch(PolicyWithValue(lm).eval(), smol_tokenizer)
    _, kl = shaped_rewards(batch["scores"], batch["logprobs"], batch["ref_logprobs"], batch["mask"], 0.1)
    assert kl.abs().max().item() < 1e-5 and batch["mask"].sum() > 0


@pytest.mark.parametrize("use_peft", [True, False])
def test_two_ppo_steps(tmp_path, topic_dialogues, tiny_policy, smol_tokenizer, tiny_reward, use_peft, monkeypatch):
    decays = []
    real_adamw = torch.optim.AdamW
    monkeypatch.setattr(torch.optim, "AdamW", lambda *a, **k: decays.append(k["weight_decay"]) or real_adamw(*a, **k))
    path = tmp_path / "dialogues.jsonl"
    path.write_text("\n".join(json.dumps({"id": d.id, "turns": list(d.turns)}) for d in topic_dialogues[:8]))
    script = ScriptArguments(
        dialogues=str(path), first_dialogue=0, max_dialogues=None, scorer="unused", lora_top_layers=1
    )
    cfg = PPOConfig(
        output_dir=str(tmp_path / "ppo"),
        steps=2,
        rollout_batch_size=4,
        mini_batch_size=2,
        max_new_tokens=5,
        weight_decay=0.0,
    )
    model_args = ModelConfig(use_peft=use_peft, lora_r=4, lora_target_modules=["q_proj", "v_proj"])
    summary = train_ppo(cfg, script, model_args, model=tiny_policy(), tokenizer=smol_tokenizer, reward=tiny_reward)
    assert summary["steps"] == 2 and abs(summary["last_kl"]) < 10 and summary["device"] == "cpu"
    assert decays == [0.0]  # the config's weight decay (torch's AdamW defaults to 0.01, TRL's trainers to 0.0)
    log = [json.loads(line) for line in (tmp_path / "ppo" / "ppo_log.jsonl").read_text().splitlines()]
    assert len(log) == 2 and abs(log[0]["kl"]) < 1e-4  # the first rollout is from the reference policy itself
    saved = tmp_path / "ppo"
    assert (saved / "value_head.safetensors").is_file()
    assert (saved / ("adapter_model.safetensors" if use_peft else "model.safetensors")).is_file()
    if use_peft:
        adapter = json.loads((saved / "adapter_config.json").read_text())
        assert adapter["layers_to_transform"] == [1]


@pytest.mark.parametrize(
    ("name", "value"),
    [("steps", 0), ("rollout_batch_size", 0), ("mini_batch_size", 0), ("ppo_epochs", 0), ("max_new_tokens", 0)],
)
def test_settings_that_would_crash_after_loading_are_refused_when_read(name, value, monkeypatch, capsys):
    """No step to summarise, no rollout, no mini-batch to update on: one line and exit code 2 before any model
    loads (they crashed with an IndexError or a torch error after the policy, the scorer and a rollout)."""
    from pmi_reward.cli.main import main
    from pmi_reward.policy import ppo

    monkeypatch.setattr(ppo, "policy_from", lambda *a, **k: pytest.fail("the policy loaded before the check"))
    with pytest.raises(ValueError, match=rf"{name} must be >= 1, got {value}"):
        PPOConfig(**{name: value})
    assert main(["ppo", f"--{name}", str(value)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{name} must be >= 1" in err
    with pytest.raises(ValueError, match="temperature must be > 0"):
        PPOConfig(temperature=0.0)


def test_rollout_reads_text_prompts_left_padded_with_the_plain_sampler(tiny_policy, smol_tokenizer):
    """Text prompts (a --prompt_file of strings) crashed the rollout; a right-padding tokenizer (load_tokenizer's
    default) put pad tokens between a short prompt and its reply; a generation_config with a repetition penalty made
    the sampler another distribution than the one PPO's ratios and KL compute."""
    from pmi_reward.policy.sampling import plain_sampling

    lm = tiny_policy()
    assert plain_sampling(lm) == {}  # nothing to switch off: generate() is called as before
    lm.generation_config.repetition_penalty = 1.05
    assert plain_sampling(lm) == {"repetition_penalty": 1.0}
    settings, _ = lm._prepare_generation_config(None, do_sample=True, temperature=0.7, top_k=0, **plain_sampling(lm))
    assert settings.repetition_penalty == 1.0
    seen = []
    smol_tokenizer.padding_side = "right"
    try:
        batch = rollout(
            PolicyWithValue(lm).eval(),
            PolicyWithValue(tiny_policy(1)).eval(),
            smol_tokenizer,
            ["I love jazz and Coltrane's records.", "Hi."],
            lambda p, c, **k: seen.append(c) or [1.0, 1.0],
            PPOConfig(max_new_tokens=4, temperature=1.0),
            Accelerator(cpu=True),
        )
        assert smol_tokenizer.padding_side == "right"  # restored
    finally:
        smol_tokenizer.padding_side = "left"
    p = batch["prompt_len"]
    assert batch["attention"][1, :p].tolist()[-1] == 1 and batch["attention"][1, 0] == 0  # pads before "Hi."
    assert all(isinstance(c, str) for c in seen[0])  # text prompts get text completions, as TRL passes them


def test_rollout_logprobs_are_the_samplers_at_its_temperature(tiny_policy, smol_tokenizer):
    """The old log-probs that PPO's ratios and KL start from are those of the distribution the replies were drawn
    from: generate()'s processed (tempered) scores at the sampled tokens, on every real reply token of two left-padded
    prompts of different lengths. A recompute that ignored the temperature or read the logits one position late
    passed every other test here."""
    lm = tiny_policy()
    generate, seen = lm.generate, {}

    def generate_with_scores(**kwargs):
        out = generate(**kwargs, output_scores=True, return_dict_in_generate=True)
        seen["scores"] = torch.stack(out.scores, 1)
        return out.sequences

    lm.generate = generate_with_scores
    policy = PolicyWithValue(lm).eval()
    prompts = [
        [{"role": "user", "content": "I love jazz and Coltrane's records, do you?"}],
        [{"role": "user", "content": "Hi."}],
    ]
    cfg = PPOConfig(max_new_tokens=8, temperature=0.7)
    torch.manual_seed(0)
    batch = rollout(policy, policy, smol_tokenizer, prompts, lambda p, c, **k: [1.0, 1.0], cfg, Accelerator(cpu=True))
    assert batch["attention"][1, 0] == 0 and batch["attention"][0, 0] == 1  # the short prompt is left-padded
    mask = batch["mask"].bool()
    assert mask.sum(1).min() >= 2, mask
    sampler = torch.log_softmax(seen["scores"].float(), -1).gather(-1, batch["response"].unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(batch["logprobs"][mask], sampler[mask], atol=1e-4, rtol=0)

"""Policy training in reduced precision and on the trainer's device: a full fine-tune (no ``--use_peft``) of a policy
held in float16 or bfloat16 is refused before anything trains (AdamW steps the weights in their own dtype: in float16
every PPO weight was NaN after one step, in bfloat16 most updates rounded away), while float32, and a LoRA adapter
over bfloat16 weights (peft keeps it in float32), train; and the RL commands' reward scorer runs on the device their
policy trains on, so that ``use_cpu`` on a machine with a GPU keeps it off the GPU."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_fit_args, tiny_rl_settings
from trl import GRPOConfig, GRPOTrainer, ModelConfig, SFTConfig

from pmi_reward.policy import ppo, rft, trainers
from pmi_reward.policy.ppo import PPOConfig, train_ppo
from pmi_reward.policy.rft import RFTConfig, train_rft
from pmi_reward.policy.trainers import ScriptArguments, build_rewards, policy_from, train_with_trl

HALF = ["float16", "bfloat16"]
LORA = {"use_peft": True, "lora_r": 4, "lora_target_modules": ["q_proj", "v_proj"]}
BUILD_REWARDS = trainers.build_rewards  # the real one, which the spies below call


class Stop(Exception):
    """Raised by a spy once it has seen what the test asks about, so that no training runs."""


def _no_reward_before_the_check(monkeypatch) -> None:
    """Make loading the reward (every command's first long step after the policy) fail the test."""

    def loaded(*args, **kwargs):
        raise AssertionError("the reward loaded before the policy's dtype was checked")

    for module in (trainers, ppo, rft):
        monkeypatch.setattr(module, "build_rewards", loaded)


@pytest.mark.parametrize("dtype", HALF)
def test_policy_from_refuses_a_half_precision_full_fine_tune_before_it_loads(dtype, policy_dir, monkeypatch):
    """All five commands load their policy with ``policy_from``: refused there, saying why and what to pass."""
    monkeypatch.setattr(trainers, "load_policy", lambda *a, **k: pytest.fail("the policy loaded before the check"))
    with pytest.raises(ValueError) as refused:
        policy_from(ModelConfig(model_name_or_path=str(policy_dir), dtype=dtype), device="cpu")
    message = str(refused.value)
    assert message.startswith(f"--dtype {dtype} without --use_peft")
    assert "NaN after the first step" in message and "most updates round away" in message
    assert "--dtype float32" in message and "--bf16 true" in message and "--use_peft" in message


@pytest.mark.parametrize("command", ["grpo", "rloo", "ppo", "rft", "dpo"])
def test_every_policy_command_refuses_a_half_precision_full_fine_tune(
    command, tmp_path, prompt_file, monkeypatch, capsys
):
    """Exit 2 with the reason in one line, before the policy loads or anything is written to --output_dir."""
    from pmi_reward.cli.main import main

    monkeypatch.setattr(trainers, "load_policy", lambda *a, **k: pytest.fail("the policy loaded before the check"))
    out = tmp_path / "out"
    argv = [command, "--prompt_file", str(prompt_file), "--scorer", "unused", "--output_dir", str(out)]
    assert main([*argv, "--dtype", "float16"]) == 2
    assert "--dtype float16 without --use_peft: full fine-tuning" in capsys.readouterr().err
    assert not out.exists()  # no run_args.json of a run that never started


@pytest.mark.filterwarnings("ignore:--dtype bfloat16. this cpu has no fast bfloat16")  # check_bf16's, about speed
@pytest.mark.parametrize(("dtype", "peft"), [("float32", {}), ("auto", {}), ("bfloat16", LORA), ("float16", LORA)])
def test_policy_from_loads_float32_or_a_half_precision_policy_under_lora(dtype, peft, policy_dir):
    """float32 (``auto`` loads it) fully fine-tunes; a LoRA adapter trains in float32 over half-precision weights."""
    from peft import get_peft_model

    model_args = ModelConfig(model_name_or_path=str(policy_dir), dtype=dtype, **peft)
    model, _ = policy_from(model_args, device="cpu")
    assert model.dtype == (torch.float32 if dtype == "auto" else getattr(torch, dtype))
    if peft:
        adapted = get_peft_model(model, trainers.lora_config(model_args, model))
        trained = {p.dtype for p in adapted.parameters() if p.requires_grad}
        assert trained == {torch.float32}
        trainers.check_policy_dtype(ModelConfig(), adapted)  # its trainable weights: float32 adapters alone


@pytest.mark.parametrize("dtype", HALF)
def test_ppo_refuses_a_callers_half_precision_model_without_lora(
    dtype, tmp_path, tiny_policy, smol_tokenizer, prompt_file, monkeypatch
):
    """``train_ppo`` with a caller's model: refused before the reward loads, as ``policy_from`` refuses."""
    _no_reward_before_the_check(monkeypatch)
    script = ScriptArguments(prompt_file=str(prompt_file), scorer="unused")
    cfg = PPOConfig(output_dir=str(tmp_path / "ppo"), steps=1, rollout_batch_size=2, mini_batch_size=2)
    model = tiny_policy().to(getattr(torch, dtype))
    with pytest.raises(ValueError, match=f"the policy's trainable weights in {dtype} without --use_peft"):
        train_ppo(cfg, script, ModelConfig(), model=model, tokenizer=smol_tokenizer)
    assert not (tmp_path / "ppo").exists()  # nothing trained, nothing saved


@pytest.mark.parametrize("dtype", HALF)
def test_grpo_and_rft_refuse_a_callers_half_precision_model_without_lora(
    dtype, tmp_path, tiny_policy, smol_tokenizer, prompt_file, monkeypatch
):
    """The TRL trainers' runner (grpo, rloo) and the rounds of rft/dpo refuse it too, before the reward loads."""
    _no_reward_before_the_check(monkeypatch)
    script = ScriptArguments(prompt_file=str(prompt_file), scorer="unused")
    model = tiny_policy().to(getattr(torch, dtype))
    match = f"the policy's trainable weights in {dtype} without --use_peft"
    grpo = GRPOConfig(output_dir=str(tmp_path / "grpo"), **tiny_rl_settings(max_steps=1))
    with pytest.raises(ValueError, match=match):
        train_with_trl(GRPOTrainer, script, grpo, ModelConfig(), model=model, tokenizer=smol_tokenizer)
    cfg = RFTConfig(rounds=1, prompts_per_round=2, samples_per_prompt=2, drop_truncated=False)
    with pytest.raises(ValueError, match=match):
        train_rft(cfg, script, tiny_fit_args(str(tmp_path / "rft"), SFTConfig), ModelConfig(), model, smol_tokenizer)


def test_ppo_trains_lora_over_bfloat16_weights(tmp_path, tiny_policy, smol_tokenizer, tiny_reward, prompt_file):
    """Allowed: the adapter is float32 over the bfloat16 base, and its weights stay finite."""
    script = ScriptArguments(prompt_file=str(prompt_file), scorer="unused")
    cfg = PPOConfig(
        output_dir=str(tmp_path / "ppo"), steps=1, rollout_batch_size=2, mini_batch_size=2, max_new_tokens=4
    )
    model = tiny_policy().to(torch.bfloat16)
    summary = train_ppo(cfg, script, ModelConfig(**LORA), model=model, tokenizer=smol_tokenizer, reward=tiny_reward)
    assert summary["steps"] == 1
    adapters = [p for name, p in model.named_parameters() if "lora_" in name]
    assert adapters and all(p.dtype == torch.float32 and torch.isfinite(p).all() for p in adapters)


def test_ppo_fully_fine_tunes_a_float32_policy(tmp_path, tiny_policy, smol_tokenizer, tiny_reward, prompt_file):
    """Allowed: float32 without LoRA, every weight finite and trained."""
    script = ScriptArguments(prompt_file=str(prompt_file), scorer="unused")
    cfg = PPOConfig(
        output_dir=str(tmp_path / "ppo"), steps=1, rollout_batch_size=2, mini_batch_size=2, max_new_tokens=4
    )
    model = tiny_policy()
    summary = train_ppo(cfg, script, ModelConfig(), model=model, tokenizer=smol_tokenizer, reward=tiny_reward)
    assert summary["steps"] == 1 and all(torch.isfinite(p).all() for p in model.parameters())


def _spy_on_rewards(monkeypatch, module, seen: list) -> None:
    """``module``'s ``build_rewards`` runs, records the device of the reward's scorer, and stops the command."""

    def spy(*args, **kwargs):
        rewards = BUILD_REWARDS(*args, **kwargs)
        seen.append(rewards[0].scorer.encoder.device)
        raise Stop

    monkeypatch.setattr(module, "build_rewards", spy)


def test_build_rewards_puts_the_scorer_on_the_device_given(gpu_machine, tiny_scorer_dir):
    reward = build_rewards(ScriptArguments(scorer=str(tiny_scorer_dir)), device="cpu")[0]
    assert reward.scorer.encoder.device == torch.device("cpu")
    assert next(reward.scorer.encoder.model.parameters()).device == torch.device("cpu")


def test_ppo_with_use_cpu_keeps_the_reward_off_the_gpu(
    gpu_machine, tmp_path, tiny_policy, smol_tokenizer, tiny_scorer_dir, prompt_file, monkeypatch
):
    """PPO's default ``use_cpu`` on a machine with a GPU: its reward scorer was loaded onto cuda all the same."""
    seen: list = []
    _spy_on_rewards(monkeypatch, ppo, seen)
    script = ScriptArguments(prompt_file=str(prompt_file), scorer=str(tiny_scorer_dir))
    cfg = PPOConfig(output_dir=str(tmp_path / "ppo"), use_cpu=True)
    with pytest.raises(Stop):
        train_ppo(cfg, script, ModelConfig(), model=tiny_policy(), tokenizer=smol_tokenizer)
    assert seen == [torch.device("cpu")]


def test_grpo_and_rft_with_use_cpu_keep_the_reward_off_the_gpu(
    gpu_machine, tmp_path, tiny_policy, smol_tokenizer, tiny_scorer_dir, prompt_file, monkeypatch
):
    """The TRL runner (grpo, rloo) and rft/dpo: the scorer on the trainer's device, the CPU under ``use_cpu``."""
    seen: list = []
    _spy_on_rewards(monkeypatch, trainers, seen)
    _spy_on_rewards(monkeypatch, rft, seen)
    script = ScriptArguments(prompt_file=str(prompt_file), scorer=str(tiny_scorer_dir))
    grpo = GRPOConfig(output_dir=str(tmp_path / "grpo"), **tiny_rl_settings(max_steps=1))
    with pytest.raises(Stop):
        train_with_trl(GRPOTrainer, script, grpo, ModelConfig(), model=tiny_policy(), tokenizer=smol_tokenizer)
    cfg = RFTConfig(rounds=1, prompts_per_round=2, samples_per_prompt=2, drop_truncated=False)
    sft = tiny_fit_args(str(tmp_path / "rft"), SFTConfig)
    with pytest.raises(Stop):
        train_rft(cfg, script, sft, ModelConfig(), tiny_policy(), smol_tokenizer)
    assert seen == [torch.device("cpu"), torch.device("cpu")]

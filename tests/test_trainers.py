"""PMIReward as-is in TRL's GRPO, RLOO and Online DPO trainers: two steps each on a tiny config-built policy."""

import json
import math

import pytest
import torch
from trl import GRPOConfig, GRPOTrainer, ModelConfig, RLOOConfig, RLOOTrainer

from pmi_reward.policy.trainers import ScriptArguments, train_with_trl

COMMON = dict(
    use_cpu=True,
    bf16=False,
    max_steps=2,
    per_device_train_batch_size=4,
    num_generations=4,
    max_completion_length=6,
    logging_steps=1,
    report_to=[],
    save_strategy="no",
    learning_rate=1e-3,
    activation_checkpointing=False,
)


@pytest.fixture
def dialogue_file(tmp_path, topic_dialogues):
    path = tmp_path / "dialogues.jsonl"
    path.write_text("\n".join(json.dumps({"id": d.id, "turns": list(d.turns)}) for d in topic_dialogues[:12]))
    return str(path)


def _run(trainer_cls, config_cls, tmp_path, dialogue_file, model, smol_tokenizer, reward, **extra):
    script = ScriptArguments(dialogues=str(dialogue_file), first_dialogue=0, max_dialogues=None, scorer="unused")
    args = config_cls(output_dir=str(tmp_path / "out"), **{**COMMON, **extra})
    rewards = reward if isinstance(reward, list) else [reward]
    summary = train_with_trl(
        trainer_cls, script, args, ModelConfig(), model=model, tokenizer=smol_tokenizer, rewards=rewards
    )
    assert summary["steps"] == 2 and summary["prompts_used"] == 12
    assert summary["reward_seconds"] > 0 and 0 < summary["reward_share"] < 1
    saved = json.loads((tmp_path / "out" / "run_summary.json").read_text())
    assert saved["trainer"] == trainer_cls.__name__
    assert (tmp_path / "out" / "model.safetensors").is_file()
    return saved


def test_grpo_two_steps(tmp_path, dialogue_file, tiny_policy, smol_tokenizer, tiny_reward):
    summary = _run(GRPOTrainer, GRPOConfig, tmp_path, dialogue_file, tiny_policy(), smol_tokenizer, tiny_reward)
    assert math.isfinite(summary["first_reward"]) and summary["mean_step_time"] > 0


def test_grpo_masks_or_penalises_truncated_completions(
    tmp_path, dialogue_file, tiny_policy, smol_tokenizer, tiny_reward
):
    from pmi_reward.policy.sampling import stop_ids
    from pmi_reward.rewards.truncation import TruncationPenalty

    model = tiny_policy()
    penalty = TruncationPenalty(stop_ids(model, smol_tokenizer), -2.0)
    summary = _run(
        GRPOTrainer,
        GRPOConfig,
        tmp_path,
        dialogue_file,
        model,
        smol_tokenizer,
        [tiny_reward, penalty],
        mask_truncated_completions=True,
    )
    # a random tiny policy rarely stops within 6 tokens: TRL's clipped ratio is logged and summarised
    assert 0.0 <= summary["clipped_ratio_last10"] <= 1.0
    assert summary["settings"]["mask_truncated_completions"] is True


def test_rloo_two_steps(tmp_path, dialogue_file, tiny_policy, smol_tokenizer, tiny_reward):
    from transformers import AutoModelForCausalLM

    tiny_policy().save_pretrained(tmp_path / "tiny")  # RLOO's KL term loads its reference from the policy's path
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "tiny")
    summary = _run(RLOOTrainer, RLOOConfig, tmp_path, dialogue_file, model, smol_tokenizer, tiny_reward)
    assert math.isfinite(summary["first_reward"])


def test_online_dpo_two_steps(tmp_path, tiny_policy, smol_tokenizer, tiny_reward):
    from datasets import Dataset
    from trl.experimental.online_dpo import OnlineDPOConfig, OnlineDPOTrainer

    calls = []

    def spy(prompts, completions, **kwargs):
        out = tiny_reward(prompts, completions, **kwargs)
        calls.append(out)
        return out

    spy.__name__ = tiny_reward.__name__
    prompts = [{"prompt": [{"role": "user", "content": f"I love topic {i}. Do you?"}]} for i in range(8)]
    args = OnlineDPOConfig(
        output_dir=str(tmp_path / "dpo"),
        use_cpu=True,
        bf16=False,
        max_steps=2,
        per_device_train_batch_size=2,
        max_new_tokens=6,
        logging_steps=1,
        report_to=[],
        save_strategy="no",
        learning_rate=1e-3,
        activation_checkpointing=True,  # TRL's default, by transformers 5's name
    )
    model = tiny_policy()
    before = [p.detach().clone() for p in model.parameters()]
    trainer = OnlineDPOTrainer(
        model=model,
        reward_funcs=spy,
        args=args,
        train_dataset=Dataset.from_list(prompts),
        processing_class=smol_tokenizer,
    )
    trainer.train()
    assert trainer.state.global_step == 2 and len(calls) == 2
    assert all(len(c) == 4 and all(math.isfinite(x) for x in c) for c in calls)  # 2 prompts x 2 completions
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


@pytest.mark.parametrize("native", [False, True])
def test_policy_from_warns_when_bf16_is_only_emulated(native, tiny_policy, smol_tokenizer, tmp_path, monkeypatch):
    """Without AVX512-BF16/AMX, bf16 weights or autocast warn, naming the flags; the dtype is still honoured."""
    import warnings

    from pmi_reward.policy import loading
    from pmi_reward.policy.trainers import policy_from

    monkeypatch.setattr(loading, "native_bf16", lambda device: native)
    tiny_policy(0).save_pretrained(tmp_path)
    smol_tokenizer.save_pretrained(tmp_path)
    cases = [("bfloat16", False, "--dtype bfloat16"), ("float32", True, "--bf16 true"), ("float32", False, None)]
    for dtype, autocast, flag in cases:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model, _ = policy_from(ModelConfig(model_name_or_path=str(tmp_path), dtype=dtype), bf16=autocast)
        emulated = [str(w.message) for w in caught if "no native bfloat16" in str(w.message)]
        assert model.dtype == getattr(torch, dtype)
        if native or flag is None:
            assert emulated == []
        else:
            assert len(emulated) == 1 and emulated[0].startswith(flag) and "--dtype float32 --bf16 false" in emulated[0]

"""PMIReward as-is in TRL's GRPO, RLOO and Online DPO trainers: two steps each on a tiny config-built policy."""

import json
import math

import pytest
import torch
from conftest import tiny_rl_settings, tiny_trl_settings
from trl import GRPOConfig, GRPOTrainer, ModelConfig, RLOOConfig, RLOOTrainer

from pmi_reward.policy.trainers import ScriptArguments, train_with_trl

COMMON = tiny_rl_settings(max_steps=2, max_completion_length=6, save_strategy="no")


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
    assert saved["trainer"] == trainer_cls.__name__ and saved["device"] == "cpu"  # use_cpu, GPU or not
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
    stops = set(stop_ids(model, smol_tokenizer))
    penalty = TruncationPenalty(stops, -2.0)
    calls = []

    def spy(**kwargs):  # the penalty as TRL calls it, its answers kept beside the completions' ids
        out = penalty(**kwargs)
        calls.append((out, [list(map(int, ids)) for ids in kwargs["completion_ids"]]))
        return out

    spy.__name__ = penalty.__name__
    summary = _run(
        GRPOTrainer,
        GRPOConfig,
        tmp_path,
        dialogue_file,
        model,
        smol_tokenizer,
        [tiny_reward, spy],
        mask_truncated_completions=True,
    )
    # a random tiny policy rarely stops within 6 tokens: TRL's clipped ratio is logged and summarised
    assert 0.0 < summary["clipped_ratio_last10"] <= 1.0
    assert summary["settings"]["mask_truncated_completions"] is True
    # every step's completions reached the penalty: -2.0 for each one cut at the limit (no stop token last), 0.0 else
    assert len(calls) == 2 and all(len(out) == 4 for out, _ in calls)
    rewards = [r for out, _ in calls for r in out]
    cut = [bool(ids) and ids[-1] not in stops for _, rows in calls for ids in rows]
    assert any(cut) and rewards == [-2.0 if c else 0.0 for c in cut]


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
    online = dict(max_steps=2, per_device_train_batch_size=2, max_new_tokens=6, logging_steps=1, save_strategy="no")
    # activation checkpointing on: TRL's default, by transformers 5's name
    settings = tiny_trl_settings(**online, learning_rate=1e-3, activation_checkpointing=True)
    args = OnlineDPOConfig(output_dir=str(tmp_path / "dpo"), **settings)
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


@pytest.mark.parametrize(
    "given", [{"model_revision": "deadbeef"}, {"load_in_4bit": True}, {"load_in_8bit": True}], ids=str
)
def test_policy_from_refuses_the_model_options_it_cannot_honour(given, monkeypatch):
    """TRL's parser accepts --model_revision and --load_in_4bit/8bit; the policy loader used none of them, silently."""
    from pmi_reward.policy import trainers

    monkeypatch.setattr(trainers, "load_policy", lambda *a, **k: pytest.fail("loaded despite an unused option"))
    with pytest.raises(ValueError, match=f"--{next(iter(given))}: not supported"):
        trainers.policy_from(ModelConfig(model_name_or_path="smollm2-135m-instruct", **given))


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
            model, _ = policy_from(
                ModelConfig(model_name_or_path=str(tmp_path), dtype=dtype, use_peft=True), bf16=autocast
            )
        emulated = [str(w.message) for w in caught if "no fast bfloat16" in str(w.message)]
        assert model.dtype == getattr(torch, dtype)
        if native or flag is None:
            assert emulated == []
        else:
            assert len(emulated) == 1 and emulated[0].startswith(flag) and "--dtype float32 --bf16 false" in emulated[0]


@pytest.mark.parametrize(
    ("spec", "message"),
    [("math:no_such_function", "has no function 'no_such_function'"), ("math:pi", "has no function 'pi'")],
)
def test_an_extra_reward_that_names_no_function_is_a_user_error(spec, message, monkeypatch, tiny_reward):
    """``module:function`` naming nothing callable is a ValueError (one line from the CLI), not an AttributeError
    traceback, or a number handed to TRL as a reward function."""
    from pmi_reward.policy.trainers import PMIReward, build_rewards

    monkeypatch.setattr(PMIReward, "from_pretrained", lambda *a, **k: tiny_reward)
    with pytest.raises(ValueError, match=rf"reward function '{spec}': module 'math' {message}"):
        build_rewards(ScriptArguments(extra_reward_funcs=[spec]))


def test_reward_functions_sharing_a_name_are_refused_before_training(monkeypatch, tiny_reward):
    """TRL logs each reward function under its name: two with one name merged their metrics and crashed its
    completions table. build_rewards and train_with_trl (a caller's own list) refuse them before anything loads."""
    from pmi_reward.policy.trainers import PMIReward, build_rewards
    from pmi_reward.rewards.options import RewardOptions

    monkeypatch.setattr(PMIReward, "from_pretrained", lambda *a, **k: PMIReward(tiny_reward.scorer, k["options"]))
    args = ScriptArguments(extra_reward_funcs=["pmi_reward.rewards.diversity:diversity_reward"])
    with pytest.raises(ValueError, match=r"distinct names.*\['diversity_reward'\].*RewardOptions\(name=\.\.\.\)"):
        build_rewards(args, RewardOptions(name="diversity_reward"))
    assert len(build_rewards(args, RewardOptions())) == 2

    class NoTraining:
        reward_weights, seed = None, 0

    twin = PMIReward(tiny_reward.scorer, scale=2.0)  # the default name, as tiny_reward's
    with pytest.raises(ValueError, match="distinct names"):
        train_with_trl(object, ScriptArguments(), NoTraining(), None, rewards=[tiny_reward, twin])


def test_run_summaries_hold_no_nan(tmp_path, capsys):
    """A step whose replies were all unscorable logs a NaN reward: the summary averages the steps that have one
    and writes null, never a NaN that is not JSON."""
    from pmi_reward.policy.trainers import last_mean, write_summary

    history = [{"score": 1.0}, {"score": float("nan")}, {"score": 3.0}]
    assert last_mean(history, "score") == 2.0 and last_mean(history[1:2], "score") is None
    write_summary(str(tmp_path), {"last_reward": float("nan"), "reward_last10": last_mean(history, "score")})

    def refuse(constant):
        raise AssertionError(f"run_summary.json holds {constant}")

    saved = json.loads((tmp_path / "run_summary.json").read_text(), parse_constant=refuse)
    assert saved == {"last_reward": None, "reward_last10": 2.0}


def test_lora_top_layers_below_zero_is_refused_when_read():
    """A negative count put LoRA on no layer, which peft refused only once the policy had loaded."""
    with pytest.raises(ValueError, match="lora_top_layers must be >= 0"):
        ScriptArguments(lora_top_layers=-2)


@pytest.mark.parametrize(
    "command",
    [
        ["grpo", "--use_cpu", "true", "--bf16", "false"],
        ["rloo", "--use_cpu", "true", "--bf16", "false"],
        ["ppo"],
        ["rft", "--use_cpu", "true", "--bf16", "false"],
        ["dpo", "--use_cpu", "true", "--bf16", "false"],
    ],
)
def test_reward_weights_are_counted_before_anything_loads(command, monkeypatch, capsys):
    """A weight per reward function (PMI, the extras, the penalty): a wrong count is one line and exit code 2
    before the policy and the scorer load (and a length-neutral baseline is fitted), not the trainer's error
    once they have."""
    from pmi_reward.cli.main import main
    from pmi_reward.policy import ppo, rft, trainers

    def forbidden(*args, **kwargs):
        pytest.fail("a model loaded before the reward weights were counted")

    for module in (trainers, ppo, rft):
        monkeypatch.setattr(module, "policy_from", forbidden)
    monkeypatch.setattr(trainers.PMIReward, "from_pretrained", forbidden)
    assert main([*command, "--output_dir", "unused", "--reward_weights", "1.0", "0.5"]) == 2
    assert "got 2 reward_weights for 1 reward functions" in capsys.readouterr().err
    flags = ["--extra_reward_funcs", "math:fabs", "--truncation_penalty", "-2", "--reward_weights", "1", "1", "1", "1"]
    assert main([*command, "--output_dir", "unused", *flags]) == 2
    assert (
        "got 4 reward_weights for 3 reward functions (PMI, 1 extra, the truncation penalty)" in capsys.readouterr().err
    )


def test_the_length_baseline_reads_contexts_as_the_reward_does(tiny_scorer, monkeypatch, tmp_path):
    """The baseline's fitting reward kept only max_context_turns: with include_system (or another max_chars) the
    reward subtracted an expected PMI fitted on other contexts. It takes the reward's reading, unshaped."""
    import datasets

    from pmi_reward.policy import trainers
    from pmi_reward.rewards.options import RewardOptions

    prompts = [
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": f"I love {t}."}] for t in "abcd"
    ]
    monkeypatch.setattr(
        trainers,
        "build_prompts",
        lambda args: datasets.Dataset.from_dict({"prompt": prompts, "reference": list("wxyz")}),
    )
    seen = []

    class Spy(trainers.PMIReward):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            seen.append(self.options)

    monkeypatch.setattr(trainers, "PMIReward", Spy)
    options = RewardOptions(include_system=True, max_chars=500, scale=3.0, clip=2.0, empty_score=-5.0, center="group")
    trainers.fit_prompt_length_baseline(
        ScriptArguments(), trainers.PMIReward(tiny_scorer, options), tmp_path / "b.json"
    )
    fit = seen[-1]
    assert fit.include_system and fit.max_chars == 500  # read as the reward reads them
    assert (fit.scale, fit.clip, fit.empty_score, fit.center) == (1.0, None, None, "none")  # raw PMI


def test_the_length_baseline_reads_the_prompts_the_policy_trains_on(tiny_scorer, smol_tokenizer, monkeypatch, tmp_path):
    """Under a chat template that refuses a conversation opening with an assistant turn, training fits such prompts
    (their oldest turn dropped); the baseline was fitted on the unfitted ones, other contexts than the reward reads."""
    import copy

    import datasets
    from test_policy_prompts import GEMMA

    from pmi_reward.policy import trainers

    prompts = [[{"role": "assistant", "content": "Hi."}, {"role": "user", "content": f"I love {t}."}] for t in "ab"]
    monkeypatch.setattr(
        trainers, "build_prompts", lambda args: datasets.Dataset.from_dict({"prompt": prompts, "reference": ["w", "x"]})
    )
    read = []
    monkeypatch.setattr(trainers.PMIReward, "__call__", lambda self, p, c, **kw: read.append(p) or [0.0] * len(c))
    gemma = copy.deepcopy(smol_tokenizer)
    gemma.chat_template = GEMMA
    reward = trainers.PMIReward(tiny_scorer)
    trainers.fit_prompt_length_baseline(ScriptArguments(), reward, tmp_path / "b.json", gemma)
    assert read[-1] == [p[1:] for p in prompts]
    trainers.fit_prompt_length_baseline(ScriptArguments(), reward, tmp_path / "c.json", smol_tokenizer)
    assert read[-1] == prompts  # ChatML takes them as they are


def test_an_unscorable_reply_stays_unscorable_beside_other_rewards(tiny_reward, monkeypatch):
    """TRL counts PMI's None as 0 once another function scores the sample: an empty or unfinished reply would beat
    every reply of negative PMI. empty_score None with extra rewards is refused for TRL before anything loads; our
    trainers sum with CombinedReward, which keeps the sample unscorable, and build such rewards."""
    from pmi_reward.policy.trainers import PMIReward, build_rewards, check_trl_empty_score, train_with_trl
    from pmi_reward.rewards.combined import CombinedReward
    from pmi_reward.rewards.options import RewardOptions

    monkeypatch.setattr(PMIReward, "from_pretrained", lambda *a, **k: tiny_reward)
    args = ScriptArguments(extra_reward_funcs=["pmi_reward.rewards.diversity:diversity_reward"])
    unscorable = RewardOptions(empty_score=None)
    with pytest.raises(ValueError, match="empty_score None .* give a number"):
        check_trl_empty_score(args, unscorable)
    check_trl_empty_score(args, RewardOptions(empty_score=-5.0))
    check_trl_empty_score(ScriptArguments(), unscorable)  # PMI alone: its None is TRL's "unscorable"

    class NoTraining:  # the refusal comes before the prompts, the policy or the scorer load
        reward_weights, seed = None, 0

    with pytest.raises(ValueError, match="empty_score None"):
        train_with_trl(object, args, NoTraining(), None, reward_options=unscorable)
    assert len(build_rewards(args, unscorable)) == 2

    def pmi(prompts, completions, **k):
        return [None, 1.0]

    def extra(prompts, completions, **k):
        return [0.5, 0.5]

    combined = CombinedReward([pmi, extra])
    assert combined(["a", "b"], ["x", "y"]) == [None, 1.5]


def test_the_cpu_budget_stops_every_process_when_one_has_spent_it(monkeypatch):
    """GRPO/RLOO under accelerate: a process that crossed the budget stopped alone and left the others in a
    collective (a gloo all_gather failed); the decision is now reduced over the processes (PPO shares the check)."""
    import torch

    from pmi_reward.policy import trainers

    assert trainers.budget_spent(0.0, trainers.cpu_seconds(), "cpu")
    assert not trainers.budget_spent(1e9, trainers.cpu_seconds(), "cpu")
    reduced: list[float] = []

    def another_rank_spent_it(flag, op=None):  # this process is under budget; another is over
        reduced.append(float(flag.item()))
        flag.fill_(1.0)

    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "all_reduce", another_rank_spent_it)
    assert trainers.budget_spent(1e9, trainers.cpu_seconds(), "cpu") and reduced == [0.0]

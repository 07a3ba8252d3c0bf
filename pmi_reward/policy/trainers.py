"""GRPO and RLOO on TRL with the PMI reward, and what every policy trainer shares: the reward functions,
LoRA on the top layers, the reward's share of training time, a run summary.

A trainer's options are four dataclasses: ``ScriptArguments`` (prompts, the reward's scorer, extra rewards,
where LoRA goes), ``RewardOptions`` (how PMI becomes a reward), the trainer's config (TRL's ``GRPOConfig`` /
``RLOOConfig``, or our ``PPOConfig``) and TRL's ``ModelConfig`` (the policy and its LoRA adapter). Extra TRL
reward functions are named ``module:function`` and sit beside ``PMIReward`` (weights via the trainer config's
``reward_weights``).
"""

from __future__ import annotations

import importlib
import json
import os
import resource
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from peft import LoraConfig
from transformers import PreTrainedModel, PreTrainedTokenizerBase, TrainerCallback, set_seed
from trl import ModelConfig, get_peft_config

from ..configs import parse_args
from ..rewards.options import RewardOptions
from ..rewards.reward import PMIReward
from .loading import load_policy
from .prompts import PromptArguments, build_prompts

__all__ = [
    "ScriptArguments",
    "policy_from",
    "lora_config",
    "build_rewards",
    "RewardTimer",
    "cpu_seconds",
    "write_summary",
    "train_with_trl",
    "trl_main",
]


@dataclass
class ScriptArguments(PromptArguments):
    """Prompts (dialogue contexts), the reward's scorer and extra reward functions, and where LoRA goes."""

    scorer: str = field(default="outputs/scorers/reward-minilm-s0", metadata={"help": "reward scorer directory"})
    extra_reward_funcs: list[str] = field(
        default_factory=list, metadata={"help": "more reward callables as module:function"}
    )
    lora_top_layers: int | None = field(
        default=None,
        metadata={"help": "put LoRA only on the top N transformer layers (backprop stops below them: faster on CPU)"},
    )


def policy_from(model_args: ModelConfig) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The policy LM and its tokenizer that TRL's model arguments name."""
    return load_policy(model_args.model_name_or_path, model_args.dtype, model_args.attn_implementation)


def lora_config(model_args: ModelConfig, model: PreTrainedModel, top_layers: int | None = None):
    """TRL's LoRA config from the model arguments (None without ``--use_peft``), optionally on the top layers."""
    config = get_peft_config(model_args)
    if isinstance(config, LoraConfig) and top_layers:
        n = model.config.num_hidden_layers
        config.layers_to_transform = list(range(max(0, n - top_layers), n))
    return config


def _import(spec: str) -> Callable:
    module, _, name = spec.partition(":")
    if not name:
        raise ValueError(f"reward function {spec!r}: expected module:function")
    return getattr(importlib.import_module(module), name)


def build_rewards(args: ScriptArguments, options: RewardOptions | None = None) -> list[Callable]:
    """``PMIReward`` first, then the extra reward functions in the order given."""
    pmi = PMIReward.from_pretrained(args.scorer, options=options or RewardOptions())
    return [pmi] + [_import(spec) for spec in args.extra_reward_funcs]


def cpu_seconds() -> float:
    """CPU time of this process so far, all threads (a wall-time-free measure of a run's cost on a busy machine)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class RewardTimer(TrainerCallback):
    """Wall and CPU time of training vs wall time spent inside PMIReward calls (the reward's share)."""

    def __init__(self, reward: Any) -> None:  # a reward that counts its own ``seconds`` (PMIReward does)
        self.reward, self.start, self.seconds, self.cpu = reward, 0.0, 0.0, 0.0

    def on_train_begin(self, args, state, control, **kwargs) -> None:
        self.reward.seconds, self.start, self.cpu = 0.0, time.perf_counter(), cpu_seconds()

    def on_train_end(self, args, state, control, **kwargs) -> None:
        self.seconds, self.cpu = time.perf_counter() - self.start, cpu_seconds() - self.cpu

    def summary(self) -> dict[str, float]:
        total = max(self.seconds, 1e-9)
        return {
            "train_seconds": round(self.seconds, 1),
            "train_cpu_seconds": round(self.cpu, 1),
            "load_average": round(os.getloadavg()[0], 2),
            "reward_seconds": round(self.reward.seconds, 2),
            "reward_share": round(self.reward.seconds / total, 4),
        }


def write_summary(output_dir: str, summary: dict[str, Any]) -> Path:
    """Write ``run_summary.json`` next to the saved policy and print it."""
    path = Path(output_dir) / "run_summary.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary, indent=2))
    return path


def train_with_trl(
    trainer_cls: type,
    script_args: ScriptArguments,
    training_args: Any,
    model_args: ModelConfig,
    model: PreTrainedModel | None = None,
    tokenizer: PreTrainedTokenizerBase | None = None,
    rewards: list[Callable] | None = None,
    reward_options: RewardOptions | None = None,
) -> dict:
    """Train a policy with a TRL online trainer (GRPO, RLOO) and PMIReward; save it and a run summary.

    ``model``/``tokenizer`` and ``rewards`` (PMIReward first) replace what the arguments would load.
    """
    set_seed(training_args.seed)
    dataset = build_prompts(script_args)
    if model is None:
        model, tokenizer = policy_from(model_args)
    rewards = rewards or build_rewards(script_args, reward_options)
    timer = RewardTimer(rewards[0])
    trainer = trainer_cls(
        model=model,
        reward_funcs=rewards,
        args=training_args,
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=lora_config(model_args, model, script_args.lora_top_layers),
        callbacks=[timer],
    )
    trainer.train()
    trainer.save_model(training_args.output_dir)
    logged = [h for h in trainer.state.log_history if "reward" in h]
    summary = {
        "trainer": trainer_cls.__name__,
        "steps": trainer.state.global_step,
        "prompts": len(dataset),
        "first_reward": logged[0]["reward"] if logged else None,
        "last_reward": logged[-1]["reward"] if logged else None,
        "mean_step_time": _mean(h.get("step_time") for h in logged),
        **timer.summary(),
    }
    write_summary(training_args.output_dir, summary)
    return summary


def trl_main(trainer_cls: type, config_cls: type, argv: list[str] | None = None, prog: str | None = None) -> dict:
    """A TRL trainer's command: script, reward, trainer and model options from YAML and flags; train; summary."""
    script_args, reward_options, training_args, model_args = parse_args(
        (ScriptArguments, RewardOptions, config_cls, ModelConfig), argv, prog
    )
    return train_with_trl(trainer_cls, script_args, training_args, model_args, reward_options=reward_options)


def _mean(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return round(sum(present) / len(present), 3) if present else None

"""PPO for a chat policy with PMIReward (TRL dropped its PPOTrainer; this is the standard RLHF recipe).

    pmi-reward ppo --config recipes/smollm2-135m/ppo/config_cpu.yaml
    accelerate launch --config_file recipes/accelerate_configs/multi_cpu.yaml -m pmi_reward.cli.main ppo --config ...

Each step: sample replies to a batch of prompts; score them with PMIReward (the reward sits on the last
reply token); subtract a per-token KL penalty to the frozen reference (the policy with its LoRA adapter
disabled, or a frozen copy without LoRA); GAE on a value head over the policy's last hidden state;
whitened advantages; ``ppo_epochs`` passes of clipped policy and value losses over mini-batches. Runs on
accelerate: each process rolls out its own prompts, gradients and whitening statistics are pooled. A reply
the reward cannot score (None) carries no learning signal, as in TRL's GRPO and RLOO: it is masked out of the
losses and the advantage statistics. Extra reward functions and the truncation penalty are summed with PMI
(``reward_weights``, as in TRL); ``mask_truncated_completions`` leaves replies cut at ``max_new_tokens`` out
of the losses, as TRL's option does; ``--cpu_budget_seconds`` stops after that much CPU time.
"""

from __future__ import annotations

import copy
import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from safetensors.torch import save_file
from trl import ModelConfig

from ..configs import parse_args
from ..data.records import json_safe
from ..progress import progress_bar
from ..rewards.combined import CombinedReward
from ..rewards.options import RewardOptions
from .ppo_core import gae, ppo_loss, response_mask, shaped_rewards, token_logprobs, truncated_rows, whiten
from .prompts import build_prompts, fit_prompts
from .sampling import plain_sampling, render_prompts
from .trainers import (
    LAST_N,
    ScriptArguments,
    budget_spent,
    build_rewards,
    check_policy_dtype,
    check_reward_weights,
    command_streams,
    cpu_seconds,
    last_mean,
    lora_config,
    policy_from,
    run_provenance,
    write_summary,
)


@dataclass
class PPOConfig:
    """Rollout, loss and optimisation settings (names follow the usual RLHF PPO recipe)."""

    output_dir: str = field(
        default="outputs/policies/ppo",
        metadata={"help": "where the policy (LoRA adapter or full weights), its value head, log and summary go"},
    )
    steps: int = field(default=20, metadata={"help": "rollout + update iterations"})
    rollout_batch_size: int = field(default=16, metadata={"help": "replies sampled per step and process"})
    mini_batch_size: int = field(default=8, metadata={"help": "replies per gradient step of an update"})
    ppo_epochs: int = field(default=2, metadata={"help": "passes over each step's rollouts"})
    learning_rate: float = field(default=1e-4, metadata={"help": "AdamW learning rate"})
    weight_decay: float = field(
        default=0.01,
        metadata={"help": "AdamW's weight decay (torch's default, which every PPO run here used; TRL's trainers: 0.0)"},
    )
    max_grad_norm: float = field(default=1.0, metadata={"help": "gradient norm clipped to this"})
    kl_coef: float = field(
        default=0.05, metadata={"help": "per-token penalty on the KL to the reference, subtracted from the reward"}
    )
    gamma: float = field(default=1.0, metadata={"help": "discount of future rewards (GAE)"})
    lam: float = field(default=0.95, metadata={"help": "GAE's lambda: bias vs. variance of the advantages"})
    clip_range: float = field(default=0.2, metadata={"help": "the policy ratio is clipped to [1 - this, 1 + this]"})
    clip_range_value: float = field(
        default=0.2, metadata={"help": "a value prediction moves at most this far from the rollout's"}
    )
    vf_coef: float = field(default=0.1, metadata={"help": "weight of the value loss beside the policy loss"})
    whiten_advantages: bool = field(
        default=True,
        metadata={"help": "normalise the advantages to zero mean and unit variance (pooled over processes)"},
    )
    max_new_tokens: int = field(default=32, metadata={"help": "longest reply sampled, in tokens"})
    temperature: float = field(
        default=0.8,
        metadata={"help": "sampling temperature; the policy is the tempered softmax and its log-probs use it too"},
    )
    mask_truncated_completions: bool = field(
        default=False, metadata={"help": "leave replies cut at max_new_tokens out of the losses (as TRL's option)"}
    )
    reward_weights: list[float] | None = field(
        default=None, metadata={"help": "weights of the reward functions (PMI, extras, penalty); default all 1"}
    )
    seed: int = field(
        default=0, metadata={"help": "seed of the prompt order and the sampling (each process adds its rank)"}
    )
    use_cpu: bool = field(default=True, metadata={"help": "run on CPU even when a GPU is visible"})

    def __post_init__(self) -> None:
        """Refuse settings that would crash the run after its models have loaded or its first rollout (no steps
        to summarise, no mini-batch to update on, a zero temperature dividing the logits)."""
        for name in ("steps", "rollout_batch_size", "mini_batch_size", "ppo_epochs", "max_new_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not self.temperature > 0:
            raise ValueError(
                f"temperature must be > 0 (PPO samples and divides the logits by it), got {self.temperature}"
            )


class PolicyWithValue(torch.nn.Module):
    """A causal LM and a scalar value head reading its last hidden state (the frozen reference uses the same
    wrapper and ignores its values)."""

    def __init__(self, lm: Any) -> None:
        super().__init__()
        self.lm = lm
        self.value_head = torch.nn.Linear(lm.config.hidden_size, 1)
        torch.nn.init.zeros_(self.value_head.weight)
        torch.nn.init.zeros_(self.value_head.bias)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, keep: int):
        """Logits of the last ``keep`` positions and values of every position."""
        positions = (attention_mask.cumsum(-1) - 1).clamp(min=0)  # as generate() numbers left-padded rows
        out = self.lm(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=positions,
            output_hidden_states=True,
            use_cache=False,
            logits_to_keep=keep,
        )
        return out.logits, self.value_head(out.hidden_states[-1].float()).squeeze(-1)


def response_stats(model: torch.nn.Module, batch: dict, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token log-probs of the response under ``model`` and the values of the states before each token."""
    p, r = batch["prompt_len"], batch["response"].shape[1]
    logits, values = model(batch["ids"], batch["attention"], keep=r + 1)
    return token_logprobs(logits[:, :-1].float() / temperature, batch["response"]), values[:, p - 1 : -1]


@torch.no_grad()
def rollout(
    model, ref_model, tokenizer, prompts: list, reward: Callable, cfg: PPOConfig, accelerator: Accelerator
) -> dict:
    """Sample replies, score them, and record old log-probs, reference log-probs and values."""
    policy = accelerator.unwrap_model(model)
    enc = render_prompts(tokenizer, prompts, accelerator.device)
    seq = policy.lm.generate(
        **enc,
        do_sample=True,
        temperature=cfg.temperature,
        top_p=1.0,
        top_k=0,
        max_new_tokens=cfg.max_new_tokens,
        pad_token_id=tokenizer.pad_token_id,
        **plain_sampling(policy.lm),
    )
    p = enc["input_ids"].shape[1]
    eos = policy.lm.generation_config.eos_token_id
    eos_ids = set(eos if isinstance(eos, list) else [eos]) | {tokenizer.eos_token_id}
    mask = response_mask(seq[:, p:], eos_ids)
    truncated = truncated_rows(seq[:, p:], eos_ids)
    response = seq[:, p:].masked_fill(mask == 0, tokenizer.pad_token_id)
    batch = {
        "ids": torch.cat([enc["input_ids"], response], 1),
        "response": response,
        "mask": mask,
        "attention": torch.cat([enc["attention_mask"], mask.long()], 1),
        "prompt_len": p,
    }
    replies = tokenizer.batch_decode(response, skip_special_tokens=True)
    ids = [row[m.bool()].tolist() for row, m in zip(response.cpu(), mask.cpu(), strict=True)]
    # as TRL passes them: text for text prompts, an assistant message for chat prompts
    completions = [
        t if isinstance(q, str) else [{"role": "assistant", "content": t}]
        for q, t in zip(prompts, replies, strict=True)
    ]
    scores = reward(prompts, completions, completion_ids=ids)
    # None: unscorable. Such a reply gets no learning signal (masked out of losses and statistics), as in TRL.
    batch["scored"] = torch.tensor([s is not None for s in scores], device=accelerator.device)
    batch["scores"] = torch.tensor([0.0 if s is None else s for s in scores], device=accelerator.device)
    batch["truncated"] = truncated
    keep = batch["scored"] & ~truncated if cfg.mask_truncated_completions else batch["scored"]
    batch["loss_mask"] = mask * keep[:, None]
    batch["logprobs"], batch["values"] = response_stats(model, batch, cfg.temperature)
    if ref_model is None:  # LoRA: the reference is the policy with its adapter switched off
        with policy.lm.disable_adapter():
            batch["ref_logprobs"], _ = response_stats(policy, batch, cfg.temperature)
    else:
        batch["ref_logprobs"], _ = response_stats(ref_model, batch, cfg.temperature)
    batch["replies"] = replies
    return batch


LOSS_STATS = ("policy_loss", "value_loss", "clip_frac", "approx_kl")  # ppo_loss's, pooled over processes


def _finite_mean(values: np.ndarray) -> float:
    finite = values[np.isfinite(values)]
    return float(finite.mean()) if len(finite) else float("nan")


def ppo_update(model, optimizer, accelerator: Accelerator, batch: dict, cfg: PPOConfig) -> dict[str, float]:
    """``ppo_epochs`` passes of clipped policy + value losses over shuffled mini-batches of one rollout batch. A
    mini-batch with no token to learn from on any process (every reply unscorable or cut) takes no optimizer step:
    AdamW's momentum and weight decay would move the weights on a zero loss."""
    n, stats = len(batch["ids"]), []
    for _ in range(cfg.ppo_epochs):
        for idx in torch.randperm(n).split(cfg.mini_batch_size):
            mb = {k: v[idx] if torch.is_tensor(v) and v.dim() else v for k, v in batch.items() if k != "replies"}
            if accelerator.reduce(mb["loss_mask"].sum(), "sum").item() == 0:  # the same answer on every process
                continue
            logprobs, values = response_stats(model, mb, cfg.temperature)
            loss, s = ppo_loss(
                logprobs,
                mb["logprobs"],
                mb["advantages"],
                values,
                mb["values"],
                mb["returns"],
                mb["loss_mask"],
                cfg.clip_range,
                cfg.clip_range_value,
                cfg.vf_coef,
            )
            accelerator.backward(loss)
            accelerator.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if mb["loss_mask"].sum().item() > 0:  # a process with no token here steps along (DDP) but reports nothing
                stats.append(s)
    return {k: float(np.mean([s[k] for s in stats])) if stats else float("nan") for k in LOSS_STATS}


def _policies(model: Any, model_args: ModelConfig, top_layers: int | None, accelerator: Accelerator):
    """(policy with a value head, frozen reference or None): with LoRA, the reference is the policy with its
    adapter disabled; without, a frozen copy."""
    peft = lora_config(model_args, model, top_layers)
    ref_model = None
    if peft is not None:
        from peft import get_peft_model

        model = get_peft_model(model, peft)
    else:
        ref_model = PolicyWithValue(copy.deepcopy(model)).requires_grad_(False).eval().to(accelerator.device)
    return PolicyWithValue(model).eval(), ref_model  # eval: no dropout, so old and new log-probs agree at step 0


def ppo_step(
    policy, ref_model, optimizer, tokenizer, prompts: list, reward: Callable, cfg: PPOConfig, accelerator: Accelerator
) -> dict:
    """One rollout and update on ``prompts``; the step's statistics, pooled over processes."""
    batch = rollout(policy, ref_model, tokenizer, prompts, reward, cfg, accelerator)
    rewards, kl = shaped_rewards(batch["scores"], batch["logprobs"], batch["ref_logprobs"], batch["mask"], cfg.kl_coef)
    advantages, batch["returns"] = gae(rewards, batch["values"], batch["mask"], cfg.gamma, cfg.lam)
    if cfg.whiten_advantages:
        advantages = whiten(advantages, batch["loss_mask"], all_reduce=lambda t: accelerator.reduce(t, "sum"))
    batch["advantages"] = advantages
    stats = ppo_update(policy, optimizer, accelerator, batch, cfg)
    scored = batch["scored"].float()
    per_process = [
        (batch["scores"] * scored).sum(),
        scored.sum(),
        kl.sum(1).mean(),
        batch["mask"].sum(1).mean(),
        batch["truncated"].float().mean(),
        *[torch.tensor(stats[k], device=accelerator.device) for k in LOSS_STATS],
    ]
    pooled = accelerator.gather(torch.stack(per_process)[None])
    totals, means = pooled.sum(0), pooled.mean(0)
    losses = pooled[:, 5:].cpu().numpy()  # each process's mean over its mini-batches (NaN: every one skipped)
    stats = {k: _finite_mean(losses[:, i]) for i, k in enumerate(LOSS_STATS)}
    return {
        "score": (totals[0] / totals[1]).item() if totals[1] > 0 else float("nan"),  # over the scorable replies
        "kl": means[2].item(),
        "response_tokens": means[3].item(),
        "clipped_ratio": means[4].item(),
        "unscorable": 1.0 - totals[1].item() / len(pooled) / len(prompts),
        **stats,
        "example": batch["replies"][0],
    }


def train_ppo(
    cfg: PPOConfig,
    script_args: ScriptArguments,
    model_args: ModelConfig,
    model=None,
    tokenizer=None,
    reward: Callable | None = None,
    reward_options: RewardOptions | None = None,
) -> dict:
    """Run PPO; save the policy (LoRA adapter or full weights), its value head, a log and a summary. A caller's
    ``model`` fully fine-tuned (no ``--use_peft``) must hold its trainable weights in float32
    (``check_policy_dtype``); the reward's scorer runs on the trainer's device (the CPU under ``use_cpu``)."""
    if reward is None:
        check_reward_weights(script_args, cfg.reward_weights)
    check_policy_dtype(model_args, model)  # a half-precision full fine-tune: before the prompts, policy or reward load
    accelerator = Accelerator(cpu=cfg.use_cpu)
    set_seed(cfg.seed, device_specific=True)  # processes sample different replies
    prompts = list(build_prompts(script_args)["prompt"])
    device = str(accelerator.device)  # the policy's, and the reward scorer's
    if model is None:
        model, tokenizer = policy_from(model_args, device=device)
    prompts = fit_prompts(prompts, tokenizer)
    if reward is None:
        reward = CombinedReward(
            build_rewards(script_args, reward_options, model, tokenizer, cfg.output_dir, device=device),
            cfg.reward_weights,
        )
    policy, ref_model = _policies(model, model_args, script_args.lora_top_layers, accelerator)
    trainable = [p for p in policy.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=cfg.learning_rate, weight_decay=cfg.weight_decay)
    policy, optimizer = accelerator.prepare(policy, optimizer)
    order = np.random.default_rng(cfg.seed).permutation(len(prompts))
    per_step, size = cfg.rollout_batch_size * accelerator.num_processes, cfg.rollout_batch_size
    log_path = Path(cfg.output_dir) / "ppo_log.jsonl"
    if accelerator.is_main_process:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_path.write_text("")
    history, start, cpu_start = [], time.perf_counter(), cpu_seconds()
    reward_seconds = getattr(reward, "seconds", 0.0)
    bar = progress_bar(range(cfg.steps), desc="ppo", unit="step", disable=not accelerator.is_main_process)
    for step in bar:
        first = step * per_step + accelerator.process_index * size
        take = [prompts[order[(first + j) % len(prompts)]] for j in range(size)]
        t0 = time.perf_counter()
        row = {"step": step + 1, **ppo_step(policy, ref_model, optimizer, tokenizer, take, reward, cfg, accelerator)}
        row["seconds"] = time.perf_counter() - t0
        history.append(row)
        if accelerator.is_main_process:
            with log_path.open("a") as f:
                f.write(json.dumps(json_safe(row), allow_nan=False) + "\n")  # a step with nothing scored: null
        bar.set_postfix(score=f"{row['score']:+.2f}", kl=f"{row['kl']:.3f}", len=f"{row['response_tokens']:.0f}")
        budget = script_args.cpu_budget_seconds
        if budget is not None and budget_spent(budget, cpu_start, accelerator.device):
            break
    total = time.perf_counter() - start
    accelerator.wait_for_everyone()
    unwrapped = accelerator.unwrap_model(policy)
    summary = {
        "trainer": "PPO",
        "steps": len(history),
        "prompts_used": len(prompts),
        "processes": accelerator.num_processes,
        "first_reward": history[0]["score"],
        "last_reward": history[-1]["score"],
        "last_kl": history[-1]["kl"],
        f"reward_last{LAST_N}": last_mean(history, "score"),
        f"kl_last{LAST_N}": last_mean(history, "kl"),
        "kl_unit": "nats per reply (log-ratio to the reference summed over its tokens)",
        f"clipped_ratio_last{LAST_N}": last_mean(history, "clipped_ratio"),
        f"completion_length_last{LAST_N}": last_mean(history, "response_tokens"),
        "train_seconds": round(total, 1),
        "train_cpu_seconds": round(cpu_seconds() - cpu_start, 1),
        "stopped_by_cpu_budget": len(history) < cfg.steps,
        "load_average": round(os.getloadavg()[0], 2),
        "reward_share": round((getattr(reward, "seconds", 0.0) - reward_seconds) / total, 4),
        "config": asdict(cfg),
        # the policy unwrapped: DDP's wrapper (several processes) hides its ``lm``, so its start_model read null
        **run_provenance(script_args, _pmi_options(reward), asdict(cfg), unwrapped),
    }
    if accelerator.is_main_process:
        _save(unwrapped, tokenizer, cfg.output_dir)
        write_summary(cfg.output_dir, summary)
    return summary


def _pmi_options(reward: Any) -> RewardOptions | None:
    first = reward.rewards[0] if isinstance(reward, CombinedReward) else reward
    return getattr(first, "options", None)


def _save(policy: PolicyWithValue, tokenizer, output_dir: str) -> None:
    policy.lm.save_pretrained(output_dir)  # a LoRA adapter (peft) or the full model
    tokenizer.save_pretrained(output_dir)
    save_file(
        {k: v.detach().contiguous() for k, v in policy.value_head.state_dict().items()},
        str(Path(output_dir) / "value_head.safetensors"),
    )


ARGUMENTS = (ScriptArguments, RewardOptions, PPOConfig, ModelConfig)


def ppo_main(argv: list[str] | None = None, prog: str | None = None) -> dict:
    """PPO's command: script, reward, PPO and model options from YAML and flags; train; the run summary."""
    script_args, reward_options, cfg, model_args = parse_args(ARGUMENTS, argv, prog)
    with command_streams():  # stdout: the run summary alone
        return train_ppo(cfg, script_args, model_args, reward_options=reward_options)

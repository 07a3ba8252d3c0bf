"""Rejection-sampling fine-tuning (RFT, a.k.a. best-of-n distillation or ReST/expert iteration) with the PMI reward,
and its preference form, iterative DPO on the reward's best-versus-worst pairs.

    pmi-reward rft --config recipes/smollm2-135m/tune/rft.yaml
    pmi-reward dpo --config recipes/smollm2-135m/tune/dpo.yaml

Each round: take the next ``prompts_per_round`` training prompts, sample ``samples_per_prompt`` replies from
the current policy (or, with ``sample_from: base``, from the starting model: best-of-n distillation), score them
with the reward functions (PMI, plus any extras and the truncation penalty, summed with ``reward_weights``), keep
each prompt's best reply (never one cut at the token limit with ``drop_truncated``; only above ``keep_min_score``
if set) and fine-tune on the kept (prompt, reply) pairs with TRL's SFTTrainer (loss on the reply only; LoRA as the
other trainers). ``rounds`` rounds, or fewer when ``--cpu_budget_seconds`` is spent. The cheap baseline users
reach for before RL: no value model, no reference forward, no on-policy loss.
``pmi-reward dpo`` runs the same rounds but pairs each prompt's best reply with its worst (the same candidates,
the best scoring strictly higher) and trains with TRL's DPOTrainer against the starting model as the reference in
every round: the reward's ranking, not only its pick, reaches the policy, and the KL anchor is the model the
evaluation measures KL to. A reply cut at the token limit (kept with ``drop_truncated false``) trains as sampled,
with no end of turn (``cut_replies``): as a rejected reply it teaches the policy to stop, not to go on.
Writes the policy (adapter or full model), ``rft_log.jsonl`` (per round: scores and mean words of all samples
and of the kept ones, how many were kept, the clipped ratio, the share the fluency penalty hit; for DPO also the
rejected replies' and DPO's last margin and pair accuracy) and ``run_summary.json``.
"""

from __future__ import annotations

import copy
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from datasets import Dataset
from transformers import set_seed
from trl import DPOConfig, ModelConfig, SFTConfig

from ..configs import parse_args
from ..data.records import DataError
from ..rewards.combined import CombinedReward
from ..rewards.fluency import FluencyPenalty
from ..rewards.length import reply_words
from ..rewards.options import RewardOptions
from .cut_replies import CUT, CutRepliesDPOTrainer, CutRepliesSFTTrainer, check_sft_settings, cut_ids
from .prompts import build_prompts, fit_prompts
from .sampling import Replies, SamplingSettings, generate_replies
from .trainers import (
    LAST_N,
    ScriptArguments,
    build_rewards,
    check_policy_dtype,
    check_reward_weights,
    command_streams,
    cpu_seconds,
    last_mean,
    lora_config,
    policy_from,
    print_result,
    resume_flag,
    run_provenance,
    settle_bf16,
    settle_output_dir,
    settle_warned_defaults,
    starting_model,
    write_summary,
)

__all__ = [
    "RFTConfig",
    "RFTSFTConfig",
    "RFTDPOConfig",
    "ARGUMENTS",
    "DPO_ARGUMENTS",
    "select_best",
    "select_pairs",
    "train_rft",
    "rft_main",
    "dpo_main",
]


SAMPLE_FROM = ("policy", "base")


@dataclass
class RFTConfig:
    """Rounds of sampling and selection (the fit's settings are TRL's ``SFTConfig``, or ``DPOConfig`` for DPO)."""

    rounds: int = field(default=4, metadata={"help": "sample-select-SFT rounds"})
    prompts_per_round: int = field(default=64, metadata={"help": "training prompts sampled per round"})
    samples_per_prompt: int = field(default=8, metadata={"help": "replies sampled per prompt (n of best-of-n)"})
    keep_min_score: float | None = field(default=None, metadata={"help": "keep a best reply only at this reward"})
    drop_truncated: bool = field(
        default=True,
        metadata={
            "help": "never keep a reply cut at the token limit (false: keep it, trained as sampled, with no end of "
            "turn; with a truncation penalty it becomes DPO's rejected reply)"
        },
    )
    rollout_max_new_tokens: int = field(default=64, metadata={"help": "token limit of the sampled replies"})
    rollout_temperature: float = field(
        default=1.0, metadata={"help": "sampling temperature of the rollouts (0: greedy)"}
    )
    rollout_top_p: float = field(
        default=1.0,
        metadata={"help": "nucleus sampling of the rollouts: the smallest top set of this mass (0: greedy)"},
    )
    rollout_batch_size: int = field(default=32, metadata={"help": "sequences per generate call"})
    reward_weights: list[float] | None = field(
        default=None, metadata={"help": "weights of the reward functions (PMI, extras, penalty); default all 1"}
    )
    sample_from: str = field(
        default="policy",
        metadata={
            "help": "policy: each round samples the policy trained so far (expert iteration); base: every round "
            "samples the starting model, so the policy distils the base's best-of-n and cannot feed on itself"
        },
    )

    def __post_init__(self) -> None:
        if self.sample_from not in SAMPLE_FROM:
            raise ValueError(f"sample_from must be one of {SAMPLE_FROM}, got {self.sample_from!r}")
        # checked when read: each would otherwise fail (or train nothing) after the models and the scorer load
        for name in (
            "rounds",
            "prompts_per_round",
            "samples_per_prompt",
            "rollout_max_new_tokens",
            "rollout_batch_size",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not self.rollout_temperature >= 0:
            raise ValueError(f"rollout_temperature must be >= 0 (0: greedy), got {self.rollout_temperature}")
        if not 0 <= self.rollout_top_p <= 1:  # generate() fails on a negative top_p and reads one above 1 as 1
            raise ValueError(f"rollout_top_p must be in [0, 1] (0: greedy), got {self.rollout_top_p}")


class RFTSFTConfig(SFTConfig):
    """TRL's ``SFTConfig`` as ``pmi-reward rft`` reads it: an unset ``bf16`` settled for a CPU-only machine
    (``settle_bf16``) before TRL turns it on and transformers refuses it there (pointing to ``--use_cpu``: bf16
    autocast, emulated and slow), as ``grpo``/``rloo``'s configs do, and the defaults that warned on every run
    settled (``settle_warned_defaults``); an unset ``output_dir`` is ``outputs/policies/rft``
    (``settle_output_dir``), not transformers' ``./trainer_output``. It declares no field: the sampler's
    ``rollout_top_p`` is ``RFTConfig``'s, checked there. Module-level, so that the trainer's checkpoints can pickle
    it (``training_args.bin``)."""

    def __post_init__(self) -> None:
        settle_bf16(self)
        settle_warned_defaults(self)
        settle_output_dir(self, "rft")
        super().__post_init__()


class RFTDPOConfig(DPOConfig):
    """TRL's ``DPOConfig`` as ``pmi-reward dpo`` reads it, its unset ``bf16`` and the defaults that warned settled
    as ``RFTSFTConfig``'s, and its unset ``output_dir`` ``outputs/policies/dpo``."""

    def __post_init__(self) -> None:
        settle_bf16(self)
        settle_warned_defaults(self)
        settle_output_dir(self, "dpo")
        super().__post_init__()


ARGUMENTS = (ScriptArguments, RewardOptions, RFTConfig, RFTSFTConfig, ModelConfig)
DPO_ARGUMENTS = (ScriptArguments, RewardOptions, RFTConfig, RFTDPOConfig, ModelConfig)


def _candidates(replies: Replies, scores: np.ndarray, i: int, drop_truncated: bool) -> np.ndarray:
    """Which of prompt ``i``'s replies may be kept: scored, not empty and (with ``drop_truncated``) not cut."""
    ok = np.isfinite(scores[i]) & np.array([bool(t.strip()) for t in replies.texts[i]])
    if drop_truncated:
        ok &= ~np.array(replies.truncated[i], dtype=bool)
    return ok


def _reply(prompt: str | list, text: str) -> str | list[dict]:
    """A reply in its prompt's form, as TRL's datasets pair them: text after a text prompt, an assistant message
    after chat messages."""
    return text if isinstance(prompt, str) else [{"role": "assistant", "content": text}]


def select_best(
    prompts: list, replies: Replies, scores: np.ndarray, drop_truncated: bool = True, min_score: float | None = None
) -> list[dict]:
    """Each prompt's best reply by ``scores`` (prompts, samples) as a prompt-completion row; prompts whose
    candidates are all unscorable (NaN), cut (with ``drop_truncated``) or below ``min_score`` are skipped."""
    rows = []
    for i, prompt in enumerate(prompts):
        ok = _candidates(replies, scores, i, drop_truncated)
        if not ok.any():
            continue
        best = int(np.argmax(np.where(ok, scores[i], -np.inf)))
        if min_score is not None and scores[i, best] < min_score:
            continue
        rows.append(
            {
                "prompt": prompt,
                "completion": _reply(prompt, replies.texts[i][best]),
                "completion" + CUT: cut_ids(replies, i, best),
                "score": float(scores[i, best]),
            }
        )
    return rows


def select_pairs(
    prompts: list, replies: Replies, scores: np.ndarray, drop_truncated: bool = True, min_score: float | None = None
) -> list[dict]:
    """Each prompt's best and worst reply among the same candidates as :func:`select_best`, as a preference row
    (``prompt``, ``chosen``, ``rejected``); prompts without two candidates whose scores differ, or whose best is
    below ``min_score``, are skipped (a tie says nothing about which reply is better)."""
    rows = []
    for i, prompt in enumerate(prompts):
        ok = _candidates(replies, scores, i, drop_truncated)
        if ok.sum() < 2:
            continue
        best = int(np.argmax(np.where(ok, scores[i], -np.inf)))
        worst = int(np.argmin(np.where(ok, scores[i], np.inf)))
        if scores[i, best] <= scores[i, worst] or (min_score is not None and scores[i, best] < min_score):
            continue
        rows.append(
            {
                "prompt": prompt,
                "chosen": _reply(prompt, replies.texts[i][best]),
                "rejected": _reply(prompt, replies.texts[i][worst]),
                "chosen" + CUT: cut_ids(replies, i, best),
                "rejected" + CUT: cut_ids(replies, i, worst),
                "score": float(scores[i, best]),
                "rejected_score": float(scores[i, worst]),
            }
        )
    return rows


def _as_sampled(tokenizer: Any, prompts: list, replies: Replies) -> Replies:
    """The replies to train on, as sampled: after a text prompt TRL tokenizes prompt + reply as one string, so a
    reply stripped of its leading space ("Me too!" for the sampled " Me too!") would train other tokens than the
    policy drew. After chat messages the template puts the reply on its own, and the stripped text stands."""
    texts = [
        [tokenizer.decode(ids, skip_special_tokens=True) for ids in tok_row] if isinstance(p, str) else row
        for p, row, tok_row in zip(prompts, replies.texts, replies.tokens, strict=True)
    ]
    return Replies(texts, replies.tokens, replies.truncated)


def _score(reward: CombinedReward, prompts: list, replies: Replies) -> np.ndarray:
    flat_p = [p for p, row in zip(prompts, replies.texts, strict=True) for _ in row]
    flat_c = [_reply(p, t) for p, row in zip(prompts, replies.texts, strict=True) for t in row]  # as TRL passes them
    ids = [t for row in replies.tokens for t in row]
    out = [np.nan if s is None else s for s in reward(flat_p, flat_c, completion_ids=ids)]
    return np.asarray(out, dtype=np.float64).reshape(len(prompts), -1)


def _kept(row: dict, key: str | None = None) -> str:
    """The text of a row's reply ``key``; by default the one it trains toward (RFT's completion, DPO's chosen)."""
    reply = row[key or ("chosen" if "chosen" in row else "completion")]
    return reply if isinstance(reply, str) else reply[0]["content"]


def _mean_words(texts: list[str]) -> float:
    """Mean reply length in words: the log shows whether selection keeps shorter or longer replies than sampled.
    Counted as the reward's length baseline counts (``reply_words``: whitespace words, each letter of a script written
    without spaces a word), so that a Chinese reply is not one word."""
    return round(float(np.mean([reply_words(t) for t in texts])), 2) if texts else 0.0


def _sft(model, tokenizer, rows: list[dict], sft_args: Any, peft_config, reference=None) -> tuple[Any, dict]:
    """One SFT pass on the kept rows; the (LoRA-wrapped) model it leaves, and nothing more to log."""
    data = Dataset.from_list([{k: r[k] for k in ("prompt", "completion", "completion" + CUT)} for r in rows])
    trainer = CutRepliesSFTTrainer(
        model=model, args=sft_args, train_dataset=data, processing_class=tokenizer, peft_config=peft_config
    )
    trainer.train()
    return trainer.model, {}


def _dpo(model, tokenizer, rows: list[dict], dpo_args: Any, peft_config, reference) -> tuple[Any, dict]:
    """One DPO pass on the preference rows against ``reference`` (a fresh copy of the starting model: the trainer
    wraps the reference it is given); the model it leaves, and the last logged DPO margin and pair accuracy."""
    keys = ("prompt", "chosen", "rejected", "chosen" + CUT, "rejected" + CUT)
    data = Dataset.from_list([{k: r[k] for k in keys} for r in rows])
    trainer = CutRepliesDPOTrainer(
        model=model,
        ref_model=copy.deepcopy(reference),
        args=dpo_args,
        train_dataset=data,
        processing_class=tokenizer,
        peft_config=peft_config,
    )
    trainer.train()
    logged = [h for h in trainer.state.log_history if "rewards/margins" in h]
    last = logged[-1] if logged else {}
    return trainer.model, {
        "dpo_margin": _finite(last.get("rewards/margins")),
        "dpo_accuracy": _finite(last.get("rewards/accuracies")),
    }


def _finite(value: float | None) -> float | None:
    """A logged figure, or None where there is none or it is not finite (the round log is JSON: no NaN)."""
    return float(value) if value is not None and np.isfinite(value) else None


def train_rft(  # the round loop reads top to bottom: sample, score, select, fine-tune, log
    cfg: RFTConfig,
    script_args: ScriptArguments,
    train_args: SFTConfig | DPOConfig,
    model_args: ModelConfig,
    model=None,
    tokenizer=None,
    rewards: list | None = None,
    reward_options: RewardOptions | None = None,
) -> dict:
    """Run RFT (``train_args`` an ``SFTConfig``) or iterative DPO (a ``DPOConfig``); save the policy, a per-round
    log and a run summary."""
    preference = isinstance(train_args, DPOConfig)
    if resume_flag(train_args) is not None:
        # each round builds a fresh trainer: no checkpoint holds the round loop (its rounds, sampler, log) to resume
        raise ValueError(
            f"{'dpo' if preference else 'rft'} rounds cannot resume (--resume_from_checkpoint "
            f"{train_args.resume_from_checkpoint}): each round's fit starts a new trainer, and no checkpoint holds "
            "the rounds run so far; start the run again, or continue from a saved policy with --model_name_or_path"
        )
    if preference and (cfg.samples_per_prompt < 2 or cfg.rollout_temperature == 0):
        raise ValueError(
            "DPO pairs two sampled replies of a prompt whose scores differ: give samples_per_prompt >= 2 and a "
            f"rollout_temperature above 0 (got {cfg.samples_per_prompt} and {cfg.rollout_temperature}); else every "
            "round keeps no pair and the base is saved as the tuned policy"
        )
    if isinstance(train_args, SFTConfig) and not cfg.drop_truncated:  # before anything loads, not after a round
        check_sft_settings(train_args.packing, train_args.completion_only_loss)
    select, fit = (select_pairs, _dpo) if preference else (select_best, _sft)
    if rewards is None:
        check_reward_weights(script_args, cfg.reward_weights)
    check_policy_dtype(model_args, model)  # a half-precision full fine-tune: before the prompts, policy or reward load
    set_seed(train_args.seed)
    prompts = list(build_prompts(script_args)["prompt"])
    device = str(train_args.device)  # the policy's, and the reward scorer's
    if model is None:
        model, tokenizer = policy_from(model_args, train_args.bf16, device)
    start_from = starting_model(model)  # before a round's LoRA wraps it
    prompts = fit_prompts(prompts, tokenizer)
    built = rewards or build_rewards(
        script_args, reward_options, model, tokenizer, train_args.output_dir, device=device
    )
    reward = CombinedReward(built, cfg.reward_weights)
    fluency = next((f for f in built if isinstance(f, FluencyPenalty)), None)
    peft_config = lora_config(model_args, model, script_args.lora_top_layers)
    base = copy.deepcopy(model).eval() if cfg.sample_from == "base" or preference else None  # training changes model
    sampler = base if cfg.sample_from == "base" else None
    assert train_args.output_dir is not None  # TrainingArguments fills an unset one (settle_output_dir: ours)
    out = Path(train_args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    log_path = out / "rft_log.jsonl"
    log_path.write_text("")
    order = np.random.default_rng(train_args.seed).permutation(len(prompts))
    history: list[dict] = []
    start, cpu_start = time.perf_counter(), cpu_seconds()
    rounds_fitted = 0
    for r in range(cfg.rounds):
        if script_args.cpu_budget_seconds is not None and cpu_seconds() - cpu_start >= script_args.cpu_budget_seconds:
            break
        t0 = time.perf_counter()
        first = r * cfg.prompts_per_round
        take = [prompts[order[(first + j) % len(prompts)]] for j in range(cfg.prompts_per_round)]
        settings = SamplingSettings(
            max_new_tokens=cfg.rollout_max_new_tokens,
            temperature=cfg.rollout_temperature,
            top_p=cfg.rollout_top_p,
            batch_size=cfg.rollout_batch_size,
            seed=train_args.seed * 1000 + r,
        )
        source = model if sampler is None else sampler
        label = f"{'dpo' if preference else 'rft'} round {r + 1}"
        replies = generate_replies(source, tokenizer, take, cfg.samples_per_prompt, settings, label)
        scores = _score(reward, take, replies)
        rows = select(take, _as_sampled(tokenizer, take, replies), scores, cfg.drop_truncated, cfg.keep_min_score)
        fitted: dict = {}
        if rows:
            model, fitted = fit(model, tokenizer, rows, train_args, peft_config, base)
            peft_config = None  # the adapter now sits on the model: later rounds train it further
            rounds_fitted += 1
        row = {
            "round": r + 1,
            "score": float(np.nanmean(scores)) if np.isfinite(scores).any() else None,  # None: nothing scored
            "kept": len(rows),
            "kept_score": float(np.mean([x["score"] for x in rows])) if rows else None,
            "clipped_ratio": replies.truncated_share(),
            "words": _mean_words(replies.flat()),
            "kept_words": _mean_words([_kept(x) for x in rows]) if rows else None,
            "seconds": round(time.perf_counter() - t0, 1),
            "example": _kept(rows[0]) if rows else None,
        }
        if fluency is not None:
            row["fluency_penalised"] = fluency.penalised  # share of the round's samples above its NLL threshold
        if preference:
            row["rejected_score"] = float(np.mean([x["rejected_score"] for x in rows])) if rows else None
            row["rejected_words"] = _mean_words([_kept(x, "rejected") for x in rows]) if rows else None
            row.update(fitted)
        history.append(row)
        with log_path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        print_result(json.dumps(row))  # a JSON line on the command's stdout; TRL's logs go to stderr
    if not rounds_fitted:  # the starting model is no tuned policy: saved as one, evaluate-policy read it as tuned
        raise DataError(
            f"{'dpo' if preference else 'rft'}: no round trained ({len(history)} of {cfg.rounds} run, each keeping no "
            "sample, or --cpu_budget_seconds spent before the first): nothing saved as a tuned policy; see "
            f"{log_path} (a lower --keep_min_score, --drop_truncated false, or a larger budget)"
        )
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    total = time.perf_counter() - start
    summary = {
        "trainer": "DPO" if preference else "RFT",
        "steps": len(history),
        "prompts_used": len(prompts),
        "first_reward": history[0]["score"] if history else None,
        "last_reward": history[-1]["score"] if history else None,
        f"reward_last{LAST_N}": last_mean(history, "score"),
        f"clipped_ratio_last{LAST_N}": last_mean(history, "clipped_ratio"),
        "train_seconds": round(total, 1),
        "train_cpu_seconds": round(cpu_seconds() - cpu_start, 1),
        "stopped_by_cpu_budget": len(history) < cfg.rounds,
        "reward_share": round(reward.seconds / max(total, 1e-9), 4),
        "config": asdict(cfg),
        **run_provenance(
            script_args,
            getattr(reward.rewards[0], "options", reward_options),
            {
                "seed": train_args.seed,
                "learning_rate": train_args.learning_rate,
                "epochs": train_args.num_train_epochs,
                "loss_type": getattr(train_args, "loss_type", None),  # DPO's losses, e.g. [sigmoid, sft]
            },
            model,
            start_from,
        ),
    }
    write_summary(str(out), summary)
    return summary


def rft_main(argv: list[str] | None = None, prog: str | None = None) -> dict:
    """RFT's command: script, reward, RFT, SFT and model options from YAML and flags; train; the run summary."""
    script_args, reward_options, cfg, sft_args, model_args = parse_args(ARGUMENTS, argv, prog)
    with command_streams():  # stdout: the round rows and the run summary alone
        return train_rft(cfg, script_args, sft_args, model_args, reward_options=reward_options)


def dpo_main(argv: list[str] | None = None, prog: str | None = None) -> dict:
    """Iterative DPO's command: script, reward, round, DPO and model options from YAML and flags; train; the run
    summary."""
    script_args, reward_options, cfg, dpo_args, model_args = parse_args(DPO_ARGUMENTS, argv, prog)
    with command_streams():  # stdout: the round rows and the run summary alone
        return train_rft(cfg, script_args, dpo_args, model_args, reward_options=reward_options)

"""GRPO and RLOO on TRL with the PMI reward, and what every policy trainer shares: the reward functions,
LoRA on the top layers, the reward's share of training time, a run summary.

A trainer's options are four dataclasses: ``ScriptArguments`` (prompts, the reward's scorer, extra rewards,
where LoRA goes), ``RewardOptions`` (how PMI becomes a reward), the trainer's config (TRL's ``GRPOConfig`` /
``RLOOConfig``, or our ``PPOConfig``) and TRL's ``ModelConfig`` (the policy and its LoRA adapter). Extra TRL
reward functions are named ``module:function`` and sit beside ``PMIReward`` (weights via the trainer config's
``reward_weights``).
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import json
import math
import os
import re
import resource
import sys
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import IO, Any

import torch
import trl
from datasets import Dataset
from peft import LoraConfig
from transformers import PreTrainedModel, PreTrainedTokenizerBase, TrainerCallback, TrainerState, set_seed
from transformers.utils import is_torch_bf16_gpu_available, is_torch_xla_available
from trl import ModelConfig, get_peft_config

from ..configs import parse_args
from ..data.records import DataError, atomic_write, json_safe
from ..evaluation.baselines.lm_pmi import LMPMIConfig, LMPMIScorer
from ..rewards.combined import check_reward_names
from ..rewards.fluency import BASE_NLL_P95, FLUENCY_DTYPES, FluencyPenalty
from ..rewards.length import fit_length_baseline
from ..rewards.options import RewardOptions
from ..rewards.reward import PMIReward
from ..rewards.truncation import TruncationPenalty
from ..scoring.scorer import DEFAULT_SCORER
from .loading import check_bf16, load_policy
from .prompts import PromptArguments, build_prompts, fit_prompt_column
from .sampling import CHAT_TEMPLATE_KWARGS, stop_ids

__all__ = [
    "ScriptArguments",
    "policy_from",
    "check_policy_dtype",
    "lora_config",
    "build_rewards",
    "check_trl_empty_score",
    "check_reward_weights",
    "check_top_p",
    "settle_trl_config",
    "settle_bf16",
    "settle_warned_defaults",
    "settle_output_dir",
    "resume_argument",
    "resume_flag",
    "resume_note",
    "checkpoints",
    "run_settings",
    "check_run_folder",
    "write_run_args",
    "check_generation_batch",
    "main_process_first",
    "RewardTimer",
    "cpu_seconds",
    "command_streams",
    "print_result",
    "write_summary",
    "train_with_trl",
    "trl_main",
]


@dataclass
class ScriptArguments(PromptArguments):
    """Prompts (dialogue contexts), the reward's scorer and extra reward functions, and where LoRA goes."""

    scorer: str = field(
        default=DEFAULT_SCORER,
        metadata={
            "help": "the reward's scorer: a directory written by `pmi-reward train`, or a Hub repo id org/name "
            "(by default, as for score/rerank/serve, the recommended scorer, where `pmi-reward train --config "
            "scorer/recommended` (or `make scorer` in a checkout) saves it; the recipes' configs name theirs)"
        },
    )
    extra_reward_funcs: list[str] = field(
        default_factory=list, metadata={"help": "more reward callables as module:function"}
    )
    lora_top_layers: int | None = field(
        default=None,
        metadata={"help": "put LoRA only on the top N transformer layers (backprop stops below them: faster on CPU)"},
    )
    length_neutral: bool = field(
        default=False,
        metadata={
            "help": "length-neutral PMI: fit the reward scorer's mean PMI of the training prompts' human replies by "
            "length (saved as length_baseline.json in output_dir) and subtract it (unless --length_baseline is given)"
        },
    )
    truncation_penalty: float | None = field(
        default=None,
        metadata={"help": "add this reward (e.g. -2) to completions cut at the token limit (a reward function last)"},
    )
    fluency_penalty: float | None = field(
        default=None,
        metadata={
            "help": "add this reward (e.g. -10) to completions the starting model finds unlikely: NLL per token above "
            "--fluency_max_nll under a frozen copy of it (a reward function after the truncation penalty)"
        },
    )
    fluency_max_nll: float = field(
        default=BASE_NLL_P95,
        metadata={
            "help": "nats per token above which --fluency_penalty applies (default: the 95th percentile of "
            "SmolLM2-135M-Instruct's own replies on the tuning contexts, recipes/smollm2-135m/fluency.py)"
        },
    )
    fluency_dtype: str = field(
        default="float32",
        metadata={
            "help": "precision of the fluency penalty's frozen copy: on an AMD CPU with AVX512-BF16, bfloat16 read "
            "360 replies 2.6-2.9x faster with no decision changed (recipes/smollm2-135m/fluency_dtype.py; time it on "
            "an Intel CPU without AMX, where bf16 ran slower than float32)",
            "choices": list(FLUENCY_DTYPES),
        },
    )
    cpu_budget_seconds: float | None = field(
        default=None,
        metadata={
            "help": "stop training once a process has used this much CPU time (equal-cost comparisons): grpo/rloo/ppo "
            "within a step, every process of an accelerate/torchrun launch stopping with the first; rft/dpo (one "
            "process only) start no round after it, and finish the round under way (up to a round over)"
        },
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.lora_top_layers is not None and self.lora_top_layers < 0:  # would match no layer: peft fails late
            raise ValueError(f"lora_top_layers must be >= 0 (0: every layer), got {self.lora_top_layers}")
        if not self.fluency_max_nll > 0:  # FluencyPenalty would refuse it only after the models load
            raise ValueError(f"fluency_max_nll must be a positive number of nats per token, got {self.fluency_max_nll}")
        if self.fluency_dtype not in FLUENCY_DTYPES:
            raise ValueError(f"fluency_dtype must be one of {FLUENCY_DTYPES}, got {self.fluency_dtype!r}")


def policy_from(
    model_args: ModelConfig, bf16: bool | None = False, device: str | None = None
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The policy LM and its tokenizer that TRL's model arguments name (``bf16``: the trainer autocasts to bf16), on
    ``device``: the one the trainer will use (its config's ``device``, the CPU under ``use_cpu``; each process's own
    GPU when several run), else the GPU where there is one. A full fine-tune (no ``--use_peft``) in float16 or
    bfloat16 is refused before anything loads (``check_policy_dtype``)."""
    check_policy_dtype(model_args)
    check_bf16(model_args.dtype, bool(bf16), device)
    ignored = {
        "--model_revision": model_args.model_revision != "main",
        "--load_in_8bit": model_args.load_in_8bit,
        "--load_in_4bit": model_args.load_in_4bit,
    }
    if any(ignored.values()):  # TRL's options, accepted by the parser; the policy loader has no such setting
        given = ", ".join(name for name, on in ignored.items() if on)
        raise ValueError(
            f"{given}: not supported by pmi-reward's policy loader (it loads a folder or Hub id at its main revision, "
            "unquantized); give a local folder of the weights you want instead"
        )
    return load_policy(model_args.model_name_or_path, model_args.dtype, model_args.attn_implementation, device)


# the weight dtypes AdamW cannot fine-tune in: it keeps its moments in the weights' dtype and steps them there
HALF_PRECISION = ("float16", "bfloat16")


def check_policy_dtype(model_args: ModelConfig | None, model: torch.nn.Module | None = None) -> None:
    """A ValueError when a full fine-tune (no ``--use_peft`` in ``model_args``) would train half-precision weights:
    the ``--dtype`` asked for (``model`` None: checked before the policy loads), or the dtype of ``model``'s
    trainable parameters (a caller's own model). AdamW keeps its moments in the weights' dtype and steps them there:
    in float16 its second moment and ``eps`` round to 0 and every weight is NaN after one step; in bfloat16 most
    updates are below half a unit in the last place of the weight they move, so they round away
    (``tests/test_policy_precision.py``). A LoRA adapter is allowed: peft keeps it in float32 over half-precision
    base weights.
    As ``check_encoder_dtype`` refuses for a scorer's encoder."""
    if model_args is not None and model_args.use_peft:
        return
    if model is None:
        asked = getattr(model_args, "dtype", None)
        held = [asked] if asked in HALF_PRECISION else []
        what = f"--dtype {asked}"
    else:
        trained = {str(p.dtype).removeprefix("torch.") for p in model.parameters() if p.requires_grad}
        held = sorted(trained & set(HALF_PRECISION))
        what = f"the policy's trainable weights in {', '.join(held)}"
    if held:
        raise ValueError(
            f"{what} without --use_peft: full fine-tuning steps the policy's weights in their own dtype, where "
            "AdamW's updates are lost (float16: its moments round to 0 and every weight is NaN after the first step; "
            "bfloat16: most updates round away): load the policy with --dtype float32 (mixed precision over float32 "
            "weights: --bf16 true for grpo/rloo/rft/dpo, `accelerate launch --mixed_precision bf16` for ppo), or "
            "train a LoRA adapter with --use_peft (peft keeps it in float32)"
        )


def lora_config(model_args: ModelConfig, model: PreTrainedModel, top_layers: int | None = None):
    """TRL's LoRA config from the model arguments (None without ``--use_peft``), optionally on the top layers."""
    config = get_peft_config(model_args)
    if isinstance(config, LoraConfig) and top_layers:
        n = model.config.num_hidden_layers
        config.layers_to_transform = list(range(max(0, n - top_layers), n))
    return config


def _import(spec: str) -> Callable:
    """The callable ``module:function`` names (a user error, not a traceback, when it names none)."""
    module, _, name = spec.partition(":")
    if not module or not name:
        raise ValueError(f"reward function {spec!r}: expected module:function")
    function = getattr(importlib.import_module(module), name, None)
    if not callable(function):
        raise ValueError(f"reward function {spec!r}: module {module!r} has no function {name!r}")
    return function


def fit_prompt_length_baseline(
    args: ScriptArguments,
    reward: PMIReward,
    path: str | Path,
    tokenizer: PreTrainedTokenizerBase | None = None,
    prompts: Dataset | None = None,
) -> Path:
    """Fit the reward scorer's mean PMI of the training prompts' human replies by length and save it (the
    baseline of the length-neutral reward; no judge involved); with the policy's ``tokenizer``, on the prompts as its
    chat template takes them (``fit_prompt_column``), the contexts the reward then reads in training. ``prompts``:
    the dataset the trainer gets, already fitted (``tokenizer`` then unused), so that the baseline is fitted on the
    very prompts trained on, without building them a second time (a prompt file changed in between, or another
    draw, fitted it on others); without it they are built from ``args``."""
    data = prompts
    if data is None:
        data = build_prompts(args)
        if tokenizer is not None:
            data = fit_prompt_column(data, tokenizer)
    if "reference" not in data.column_names:
        raise ValueError(
            "--length_neutral needs prompts cut from dialogues (their human replies); give --length_baseline"
        )
    # raw PMI of the contexts the reward reads (system prompt, turns, cut), unshaped
    plain = PMIReward(
        reward.scorer,
        replace(
            reward.options,
            empty_score=None,
            center="none",
            scale=1.0,
            clip=None,
            length_baseline=None,
            think_opened=False,
            name="fit",
        ),
    )
    scores = [float("nan") if s is None else s for s in plain(list(data["prompt"]), list(data["reference"]))]
    source = {
        "scorer": args.scorer,
        "dialogues": args.dialogues,
        "first_dialogue": args.first_dialogue,
        "max_dialogues": args.max_dialogues,
    }
    return fit_length_baseline(scores, list(data["reference"]), source=source).save(path)


# the fluency penalty's log-likelihoods kept in memory: RL replies are new every step, so a few thousand cover a
# step's repeats (an unbounded cache grew by every reply of the whole run, never read again)
FLUENCY_CACHE_ENTRIES = 4096


def build_rewards(
    args: ScriptArguments,
    options: RewardOptions | None = None,
    model: PreTrainedModel | None = None,
    tokenizer: PreTrainedTokenizerBase | None = None,
    output_dir: str | None = None,
    prompts: Dataset | None = None,
    device: str | torch.device | None = None,
) -> list[Callable]:
    """``PMIReward`` first (length-neutral with ``--length_neutral``), then the extra reward functions in the order
    given, then the truncation and fluency penalties when asked for (they need the policy's ``model`` and
    ``tokenizer``, still the starting model: the fluency penalty reads replies with a frozen copy of it, in
    ``--fluency_dtype``). The length-neutral baseline is fitted on ``prompts`` (the trainer's dataset, fitted to the
    chat template) where given, else on the prompts ``args`` name; under DDP the main process alone fits and writes
    it, the others then read its file. The reward's scorer runs on ``device``: the one the policy trains on (a
    ``--use_cpu`` run on a machine with a GPU keeps it off the GPU); None: the GPU where there is one, else the CPU."""
    options = options or RewardOptions()
    pmi = PMIReward.from_pretrained(args.scorer, device=device, options=options)
    if args.length_neutral and options.length_baseline is None:
        path = Path(output_dir or ".") / "length_baseline.json"
        with main_process_first() as main:
            if main:
                path = fit_prompt_length_baseline(args, pmi, path, tokenizer, prompts)
        pmi = PMIReward(pmi.scorer, replace(pmi.options, length_baseline=str(path)))
    rewards: list[Callable] = [pmi] + [_import(spec) for spec in args.extra_reward_funcs]
    if args.truncation_penalty is not None:
        if model is None or tokenizer is None:
            raise ValueError("--truncation_penalty needs the policy's model and tokenizer (its end-of-sequence ids)")
        rewards.append(TruncationPenalty(stop_ids(model, tokenizer), args.truncation_penalty))
    if args.fluency_penalty is not None:
        if model is None or tokenizer is None:
            raise ValueError("--fluency_penalty needs the policy's starting model and tokenizer")
        name = str(getattr(model.config, "_name_or_path", ""))
        config = LMPMIConfig(model=name, dtype=args.fluency_dtype, system_prompt=args.system_prompt)
        frozen = copy.deepcopy(model).to(getattr(torch, args.fluency_dtype)).eval().requires_grad_(False)
        lm = LMPMIScorer(config, model=frozen, tokenizer=tokenizer, cache_entries=FLUENCY_CACHE_ENTRIES)
        rewards.append(FluencyPenalty(lm, args.fluency_max_nll, args.fluency_penalty))
    check_reward_names(rewards)  # TRL keys metrics and its completions table by name
    return rewards


@contextmanager
def main_process_first() -> Iterator[bool]:
    """Whether this is its node's main process (local rank 0), the others entering only once the main ones have
    left: what it writes inside is there for them to read (every rank had fitted and written the same file, each then
    reading whichever write landed last). One main process per node, as transformers saves on nodes without a shared
    disk; on a shared one they write the same file, each in one step. A main process's exit lets the others in even
    when it fails (they then fail on the missing file rather than wait). A single process goes straight through."""
    distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
    main = not distributed or int(os.environ.get("LOCAL_RANK", torch.distributed.get_rank())) == 0
    if distributed and not main:
        torch.distributed.barrier()
    try:
        yield main
    finally:
        if distributed and main:
            torch.distributed.barrier()


def check_top_p(config: Any) -> None:
    """TRL's GRPO/RLOO sampling ``top_p`` in (0, 1], refused when read: generate() failed on a negative one only once
    the models had loaded, read one above 1 as 1 and 0 as the likeliest token alone."""
    top_p = getattr(config, "top_p", None)
    if top_p is not None and not 0 < top_p <= 1:
        raise ValueError(
            f"--top_p must be in (0, 1] (1: every token), got {top_p}; unlike `evaluate`'s and `rft`'s samplers, "
            "0 is not greedy here: a group of identical greedy completions has no advantage to learn from"
        )


def settle_trl_config(config: Any) -> None:
    """Called by ``pmi-reward grpo``/``rloo``'s config classes as they are read, before TRL's own checks: ``top_p``
    checked (``check_top_p``), ``bf16`` settled (``settle_bf16``), the defaults transformers and torch warned about
    settled (``settle_warned_defaults``) and an unset ``output_dir`` given the command's own folder
    (``settle_output_dir``)."""
    check_top_p(config)
    settle_bf16(config)
    settle_warned_defaults(config)
    settle_output_dir(config, "grpo" if isinstance(config, trl.GRPOConfig) else "rloo")


POLICY_OUTPUTS = "outputs/policies"  # where a policy command writes without --output_dir (ppo's default too)


def settle_output_dir(config: Any, command: str) -> None:
    """An unset ``output_dir`` set to ``outputs/policies/<command>``, as ``pmi-reward ppo``'s default, before
    transformers sets it to ``./trainer_output``: there every command run without the flag wrote into one folder,
    where a later run's policy could sit beside an earlier one's adapter (which ``load_policy`` then refuses)."""
    if getattr(config, "output_dir", "") is None:  # a stand-in config without the field is left alone
        config.output_dir = f"{POLICY_OUTPUTS}/{command}"


def resume_flag(config: Any) -> str | bool | None:
    """The config's ``--resume_from_checkpoint`` as read: a folder, True, or None for a fresh run (unset, false, or
    the strings "true"/"false" in any case and spacing, as the command line gives them)."""
    value = getattr(config, "resume_from_checkpoint", None)
    if value is None or isinstance(value, bool):
        return value or None
    return {"true": True, "false": None, "": None}.get(str(value).strip().lower(), str(value))


def _local_main() -> bool:
    """Whether this is its node's main process (local rank 0), from the launcher's environment: read before
    torch.distributed starts (the trainer starts it), for what one process per node writes or prints."""
    return int(os.environ.get("LOCAL_RANK", "0") or 0) == 0


def _note(message: str) -> None:
    """A line on stderr for the user (from one process per node): which checkpoint a run resumes, and why."""
    if _local_main():
        print(f"pmi-reward: {message}", file=sys.stderr, flush=True)


CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")  # the folders transformers' Trainer saves into output_dir
TRAINER_STATE = "trainer_state.json"  # written last into a checkpoint: a folder without it is a save cut short
# RewardTimer's totals in the trainer state's stateful_callbacks (so in every checkpoint's trainer_state.json): a
# key no callback class is named, which transformers' restore_callback_states_from_checkpoint passes over
CLOCK = "pmi_reward_clock"


def checkpoints(output_dir: str | Path) -> list[Path]:
    """The ``checkpoint-N`` folders in ``output_dir``, by step (complete or not; none when it is not a folder)."""
    folder = Path(output_dir)
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in folder.iterdir() if p.is_dir() and (m := CHECKPOINT.match(p.name))]
    return [p for _, p in sorted(found)]


def resume_argument(config: Any) -> str | None:
    """What ``Trainer.train(resume_from_checkpoint=...)`` gets from the config's ``--resume_from_checkpoint``: a
    checkpoint folder or None (a fresh run). ``true`` means the newest COMPLETE ``checkpoint-N`` in ``output_dir``
    (one holding ``trainer_state.json``, written last; ``resume_note`` says which): a requeued job whose last
    save a kill cut short resumes from the one before instead of failing every time. Checked before any model
    loads (transformers' own error came only after the policy, the scorer and the trainer had been built); a
    folder given by name that is not a complete checkpoint is refused by name."""
    flag = resume_flag(config)
    if flag is True:
        found = checkpoints(str(config.output_dir))
        complete = [p for p in found if (p / TRAINER_STATE).is_file()]
        if not complete:
            what = f"only {', '.join(p.name for p in found)}, cut short while saving (no {TRAINER_STATE})"
            raise ValueError(
                f"--resume_from_checkpoint true: no checkpoint-N folder with {TRAINER_STATE} (a complete one) in "
                f"output_dir {config.output_dir} to resume from ({what if found else 'none there'}); give the "
                "checkpoint's folder, or the run's --output_dir"
            )
        flag = str(complete[-1])
    if isinstance(flag, str) and not (Path(flag) / TRAINER_STATE).is_file():
        raise ValueError(
            f"--resume_from_checkpoint {flag}: not a training checkpoint (a checkpoint-N folder holding "
            f"{TRAINER_STATE})"
        )
    return flag if isinstance(flag, str) else None


def resume_note(resume: str) -> str:
    """What a run resumed with ``--resume_from_checkpoint true`` tells the user: the checkpoint it took, and the
    newer ones it passed over (their save cut short)."""
    found = checkpoints(Path(resume).parent)
    cut = [p.name for p in found[found.index(Path(resume)) + 1 :]] if Path(resume) in found else []
    skipped = f" ({', '.join(cut)} skipped: no {TRAINER_STATE}, a save cut short)" if cut else ""
    return f"--resume_from_checkpoint true: resuming from {resume}{skipped}"


RUN_ARGS = "run_args.json"  # a grpo/rloo run's settings, beside its checkpoints: what a resume must match

# trainer-config fields a resume may change: where the run writes, logs and reports, how it saves and resumes, the
# process's rank and whether batches are pinned (settle_warned_defaults: off on a machine without an accelerator);
# none of them changes the policy trained
UNCOMPARED = re.compile(
    r"^(output_dir|resume_from_checkpoint|restore_callback_states_from_checkpoint|run_name|project|report_to|"
    r"local_rank|disable_tqdm|num_completions_to_print|skip_memory_metrics|push_to_hub|dataloader_pin_memory|"
    r"(logging|log|save|hub|trackio)_\w+)$"
)


def run_settings(
    script_args: ScriptArguments, reward_options: RewardOptions | None, training_args: Any, model_args: ModelConfig
) -> dict:
    """A run's options as JSON (script, reward, trainer, model), less the trainer fields a resume may change
    (``UNCOMPARED``): what ``run_args.json`` records and a resume compares."""
    config = training_args.to_dict() if hasattr(training_args, "to_dict") else dict(vars(training_args))
    settings = {
        "script": asdict(script_args),
        "reward": asdict(reward_options) if reward_options is not None else None,
        "trainer": {k: v for k, v in config.items() if not UNCOMPARED.match(k)},
        "model": asdict(model_args) if model_args is not None else None,
    }
    return json.loads(json.dumps(json_safe(settings), default=str))  # as read back from the file


def _setting_differences(saved: dict, current: dict) -> list[str]:
    """``group.field (saved: X, this run: Y)`` for each setting that differs; a field the saved file does not hold
    (one a later TRL or pmi-reward added) is not compared."""
    out = []
    for group in sorted(set(saved) | set(current)):
        old, new = saved.get(group), current.get(group)
        if not isinstance(old, dict) or not isinstance(new, dict):
            if old != new:
                out.append(f"{group} (saved: {old!r}, this run: {new!r})")
            continue
        out += [
            f"{group}.{k} (saved: {old[k]!r}, this run: {new.get(k)!r})" for k in sorted(old) if old[k] != new.get(k)
        ]
    return out


def check_run_folder(resume: str | None, settings: dict, output_dir: str | Path) -> None:
    """Refuse what would mix two runs in one folder, before any model loads: a fresh run into an ``output_dir``
    that holds ``checkpoint-N`` folders (a later ``--resume_from_checkpoint true`` would pick up the other run's
    newest, its weights, optimizer and step count). A resume whose settings differ from those its checkpoint's run
    recorded in ``run_args.json`` beside it goes on with a warning naming the fields (a requeue on another machine,
    a longer ``max_steps`` or another reward batch size are legitimate); one without that file (a run of an older
    pmi-reward) with a warning that its settings are not checked."""
    if resume is None:
        found = checkpoints(output_dir)
        if found:
            names = ", ".join(p.name for p in found[:3]) + (f" and {len(found) - 3} more" if len(found) > 3 else "")
            raise ValueError(
                f"output_dir {output_dir} holds checkpoints of an earlier run ({names}): pass "
                "--resume_from_checkpoint true to continue it, or another --output_dir"
            )
        return
    recorded = Path(resume).parent / RUN_ARGS
    if not recorded.is_file():
        _note(f"{resume}: no {RUN_ARGS} beside it (a run of an older pmi-reward): its settings are not checked")
        return
    try:
        saved = json.loads(recorded.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(
            f"{recorded}: not readable as a run's settings ({err}); delete it to resume unchecked"
        ) from None
    differ = _setting_differences(saved if isinstance(saved, dict) else {}, settings)
    if differ:  # said, not refused: a requeue on another machine, a longer run or a faster reward batch are legitimate
        shown = "; ".join(differ[:6]) + (f"; and {len(differ) - 6} more" if len(differ) > 6 else "")
        _note(
            f"WARNING: --resume_from_checkpoint {resume}: its run had other settings ({shown}; saved in {recorded}): "
            "the run goes on from that checkpoint's weights, optimizer and step under this run's settings"
        )


def write_run_args(output_dir: str | Path, settings: dict) -> None:
    """Record a run's settings as ``output_dir/run_args.json`` (atomically; one process per node), for a resume
    to compare with."""
    if not _local_main():
        return
    path = Path(output_dir) / RUN_ARGS
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(settings, indent=2, allow_nan=False) + "\n"
    atomic_write(path, lambda tmp: Path(tmp).write_text(text))


def finished_at(resume: str, training_args: Any) -> str | None:
    """Why checkpoint ``resume`` is the end of its run, or None: its step is ``max_steps`` (transformers would train
    one step past it: it checks ``max_steps`` only after a step), or its run had spent ``--cpu_budget_seconds``
    (``RewardTimer`` records that in the trainer state)."""
    state = json.loads((Path(resume) / TRAINER_STATE).read_text())
    done = int(state.get("global_step") or 0)
    target = (
        training_args.max_steps if getattr(training_args, "max_steps", -1) > 0 else int(state.get("max_steps") or 0)
    )
    if target > 0 and done >= target:
        return f"step {done} of max_steps {target}"
    clock = (state.get("stateful_callbacks") or {}).get(CLOCK) or {}
    if clock.get("stopped_by_cpu_budget"):
        return f"step {done}, where its run had spent --cpu_budget_seconds ({clock.get('cpu_seconds')} CPU seconds)"
    return None


def check_generation_batch(config: Any, prompts: int) -> None:
    """Refuse fewer distinct prompts than one GRPO/RLOO step samples (``generation_batch_size /
    num_generations``, every process counted): TRL's sampler drops an incomplete batch, so the run trained 0
    steps, exited 0 and saved the starting model as the tuned policy."""
    batch, group = getattr(config, "generation_batch_size", None), getattr(config, "num_generations", None)
    if not batch or not group:
        return
    need = batch // group
    if prompts < need:
        raise DataError(
            f"{prompts} prompts, but one step takes {need} distinct prompts ({batch} completions, "
            f"{group} per prompt): give more prompts or a smaller --per_device_train_batch_size"
        )


def settle_bf16(config: Any) -> None:
    """Called by every TRL-based command's config class as it is read (``grpo``/``rloo`` through
    ``settle_trl_config``; ``rft``'s SFT and ``dpo``'s DPO configs), before TRL's and transformers' checks: ``bf16``
    left unset turned off where no GPU computes bfloat16 and ``--use_cpu`` is not given: training runs in float32 on
    the CPU, as README advises there (TRL turns an unset bf16 on, which transformers then refused on a CPU-only
    machine, pointing to ``--use_cpu``: bf16 autocast, emulated and slow on most CPUs); ``--bf16 true`` there is
    refused naming the flags to pass."""
    if config.use_cpu or is_torch_bf16_gpu_available() or is_torch_xla_available():
        return
    if config.bf16 is None:
        config.bf16 = False
    elif config.bf16:
        raise ValueError(
            "--bf16 true: no GPU here computes bfloat16; pass --bf16 false to train in float32 (README's setting on a "
            "CPU), or --use_cpu true for bfloat16 autocast on the CPU (slow without AMX or a non-Intel CPU's "
            "AVX512-BF16)"
        )


def settle_warned_defaults(config: Any) -> None:
    """Called by every TRL-based command's config class as it is read (with ``settle_bf16``), before transformers'
    checks: two defaults that warned on every run, of nothing the user had set, settled without changing the run.
    TRL's ``gradient_checkpointing=True`` (and its kwargs, if any) moves to ``activation_checkpointing``, the name
    transformers 5 gave it (the old one warned as deprecated), where that is unset: the run checkpoints as TRL set
    it, and transformers keeps the old name mirroring the new one. ``dataloader_pin_memory`` is turned off where
    torch finds no accelerator: there is no device memory to pin for, and torch's DataLoader warned so."""
    for old, new in (
        ("gradient_checkpointing", "activation_checkpointing"),
        ("gradient_checkpointing_kwargs", "activation_checkpointing_kwargs"),
    ):
        if hasattr(config, new) and getattr(config, new) is None and getattr(config, old, None) is not None:
            setattr(config, new, getattr(config, old))
            setattr(config, old, None)
    if getattr(config, "dataloader_pin_memory", False) and not torch.accelerator.is_available():
        config.dataloader_pin_memory = False


def check_trl_empty_score(args: ScriptArguments, options: RewardOptions | None) -> None:
    """TRL's GRPO/RLOO count PMI's None as 0 as soon as another reward function scores the sample, so an empty or
    unfinished reply would beat every reply of negative PMI: there, empty_score None is refused beside other reward
    functions. (Our PPO, RFT and DPO sum with ``CombinedReward``, which keeps such a sample unscorable.)"""
    if (options or RewardOptions()).empty_score is None and (args.extra_reward_funcs or penalties(args)):
        raise ValueError(
            "empty_score None (an unscorable reply) with other reward functions: TRL counts a None as 0 as soon as "
            "another function scores the sample, so an empty or unfinished reply would beat every reply of negative "
            "PMI; give a number (e.g. --empty_score -5)"
        )


def penalties(args: ScriptArguments) -> int:
    """How many penalty reward functions ``build_rewards`` adds after the extras (truncation, fluency)."""
    return (args.truncation_penalty is not None) + (args.fluency_penalty is not None)


def check_reward_weights(args: ScriptArguments, weights: list[float] | None, penalty_default: bool = False) -> None:
    """One weight per reward function that ``build_rewards`` will build (PMI, the extras, the truncation and fluency
    penalties), checked before the policy and the scorer load rather than by the trainer once they have.
    ``penalty_default``: the penalties' weights may be left out (``train_with_trl`` gives them 1.0)."""
    if weights is None:
        return
    count = 1 + len(args.extra_reward_funcs) + penalties(args)
    if len(weights) == count or (penalty_default and penalties(args) and len(weights) == count - penalties(args)):
        return
    named = [("the truncation penalty", args.truncation_penalty), ("the fluency penalty", args.fluency_penalty)]
    extra = "".join(f", {name}" for name, value in named if value is not None)
    raise ValueError(
        f"got {len(weights)} reward_weights for {count} reward functions (PMI, {len(args.extra_reward_funcs)} "
        f"extra{extra})"
    )


def cpu_seconds() -> float:
    """CPU time of this process so far, all threads (a wall-time-free measure of a run's cost on a busy machine)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def budget_spent(budget: float, cpu_start: float, device: Any) -> bool:
    """Whether this process, or any other of a distributed run, has used ``budget`` CPU seconds since
    ``cpu_start``: all stop at the same step (one that stopped alone left the others in a collective, which failed)."""
    spent = float(cpu_seconds() - cpu_start >= budget)
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        flag = torch.tensor([spent], device=device)
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
        spent = float(flag.item())
    return bool(spent)


class RewardTimer(TrainerCallback):
    """Wall and CPU time of training vs wall time spent inside PMIReward calls (the reward's share); with a CPU
    budget, stops training once the budget is spent. The totals go into the trainer state at every step (``CLOCK``),
    so that a run resumed from a checkpoint continues its clock and its budget from there rather than from zero,
    and its summary says the step it resumed from."""

    def __init__(self, reward: Any, cpu_budget: float | None = None) -> None:  # a reward that counts its ``seconds``
        self.reward, self.cpu_budget, self.stopped_by_budget = reward, cpu_budget, False
        self.start, self.cpu_start = 0.0, 0.0  # this process's clocks when training began
        self.carried = {"wall_seconds": 0.0, "cpu_seconds": 0.0, "reward_seconds": 0.0}  # the checkpoint's totals
        self.seconds, self.cpu = 0.0, 0.0  # the run's totals when training ended
        self.resumed_from_step: int | None = None

    def restore(self, state: Any) -> None:
        """Take up the totals of the checkpoint a resumed run's ``state`` was read from (none for a fresh run, at
        step 0): the time and budget it had used, and whether that budget had stopped it."""
        saved = (getattr(state, "stateful_callbacks", None) or {}).get(CLOCK) or {}
        self.carried = {k: float(saved.get(k) or 0.0) for k in self.carried}
        self.stopped_by_budget = bool(saved.get("stopped_by_cpu_budget", False))
        self.resumed_from_step = state.global_step or None
        self.seconds, self.cpu = self.carried["wall_seconds"], self.carried["cpu_seconds"]
        self.reward.seconds = 0.0

    def on_train_begin(self, args, state, control, **kwargs) -> None:
        self.restore(state)
        self.start, self.cpu_start = time.perf_counter(), cpu_seconds()

    def _totals(self) -> tuple[float, float]:
        """The run's wall and CPU seconds so far, the checkpoint's included."""
        wall = self.carried["wall_seconds"] + time.perf_counter() - self.start
        return wall, self.carried["cpu_seconds"] + cpu_seconds() - self.cpu_start

    def on_step_end(self, args, state, control, **kwargs) -> None:
        # budget_spent counts from its start: the checkpoint's CPU seconds are this process's before it started
        if self.cpu_budget is not None and budget_spent(
            self.cpu_budget, self.cpu_start - self.carried["cpu_seconds"], args.device
        ):
            control.should_training_stop = self.stopped_by_budget = True
        wall, cpu = self._totals()
        if isinstance(state.stateful_callbacks, dict):  # saved with the state at this step's checkpoint, if any
            state.stateful_callbacks[CLOCK] = {
                "wall_seconds": wall,
                "cpu_seconds": cpu,
                "reward_seconds": self.carried["reward_seconds"] + self.reward.seconds,
                "stopped_by_cpu_budget": self.stopped_by_budget,
            }

    def on_train_end(self, args, state, control, **kwargs) -> None:
        self.seconds, self.cpu = self._totals()

    def summary(self) -> dict[str, Any]:
        total = max(self.seconds, 1e-9)
        reward_seconds = self.carried["reward_seconds"] + self.reward.seconds
        return {
            "train_seconds": round(self.seconds, 1),
            "train_cpu_seconds": round(self.cpu, 1),
            "stopped_by_cpu_budget": self.stopped_by_budget,
            "resumed_from_step": self.resumed_from_step,
            "load_average": round(os.getloadavg()[0], 2),
            "reward_seconds": round(reward_seconds, 2),
            "reward_share": round(reward_seconds / total, 4),
        }


# transformers 5's FutureWarnings for the checkpointing methods it renamed, called by TRL and peft from their own
# code (is_gradient_checkpointing, gradient_checkpointing_enable/_disable): nothing a command's user can change
LIBRARY_DEPRECATIONS = r"`\w*gradient_checkpointing\w*` is deprecated"

_RESULTS: ContextVar[IO[str] | None] = ContextVar("pmi_reward_results", default=None)  # set by command_streams


def print_result(text: str) -> None:
    """Print a command's machine-readable output (its JSON) on the command's stdout, also inside
    ``command_streams``, where all else printed to stdout goes to stderr."""
    out = _RESULTS.get()
    print(text, file=sys.stdout if out is None else out, flush=True)


@contextmanager
def command_streams() -> Iterator[None]:
    """What the policy commands (grpo, rloo, ppo, rft, dpo) run inside. Their stdout holds only their JSON, written
    with ``print_result`` (the run summary, rft/dpo's round rows), so that ``> summary.json`` or ``| jq`` reads
    it: everything else printed to stdout meanwhile (transformers' logged steps, which its progress callback
    writes with ``tqdm.write``; TRL's completion tables) goes to stderr, beside the progress bars and the logs.
    ``LIBRARY_DEPRECATIONS`` warnings are not shown."""
    token = _RESULTS.set(sys.stdout)
    try:
        with contextlib.redirect_stdout(sys.stderr), warnings.catch_warnings():
            warnings.filterwarnings("ignore", LIBRARY_DEPRECATIONS, FutureWarning)
            yield
    finally:
        _RESULTS.reset(token)


def write_summary(output_dir: str, summary: dict[str, Any]) -> Path:
    """Write ``run_summary.json`` next to the saved policy and print it on the command's stdout (``print_result``;
    a NaN, e.g. the reward of a step whose replies were all unscorable, as null: JSON has no NaN)."""
    path = Path(output_dir) / "run_summary.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(json_safe(summary), indent=2, default=str, allow_nan=False)
    path.write_text(text)
    print_result(text)
    return path


LAST_N = 10  # run summaries average the last N logged steps (the per-step figures swing a lot)

# the settings of a TRL run that a trials log needs (the whole config is in the trainer's own output)
TRL_SETTINGS = (
    "seed",
    "learning_rate",
    "max_steps",
    "per_device_train_batch_size",
    "num_generations",
    "max_completion_length",
    "temperature",
    "loss_type",
    "scale_rewards",
    "beta",
    "epsilon",
    "mask_truncated_completions",
    "reward_weights",
)


def starting_model(model: Any) -> str | None:
    """The name or folder a policy was loaded from (``load_policy`` names a folder by its absolute path): the
    base of its LoRA adapter, else its config's ``_name_or_path``; None for a model built from a config. PPO's
    policy with its value head is read through its ``lm``."""
    lm = getattr(model, "lm", model)
    peft = getattr(lm, "peft_config", None)
    if isinstance(peft, dict) and peft:
        return next(iter(peft.values())).base_model_name_or_path or None
    return getattr(getattr(lm, "config", None), "_name_or_path", None) or None


def run_provenance(
    script_args: ScriptArguments,
    reward_options: RewardOptions | None,
    settings: dict,
    model: Any,
    start: str | None = None,
) -> dict:
    """What a run summary records about a run's inputs: the starting model (``start``: the name or folder it was
    loaded from, else read off ``model``; evaluate-policy compares it with its ``--base_model``), prompts, reward,
    the main settings, and the device the policy trained on."""
    return {
        "start_model": start or starting_model(model),
        "device": str(next(model.parameters()).device),
        "prompts": {
            k: getattr(script_args, k) for k in ("dialogues", "prompt_file", "first_dialogue", "max_dialogues")
        },
        "reward": {
            "scorer": script_args.scorer,
            "extra_reward_funcs": script_args.extra_reward_funcs,
            "length_neutral": script_args.length_neutral,
            "truncation_penalty": script_args.truncation_penalty,
            "fluency_penalty": script_args.fluency_penalty,
            "fluency_max_nll": script_args.fluency_max_nll if script_args.fluency_penalty is not None else None,
            "fluency_dtype": script_args.fluency_dtype if script_args.fluency_penalty is not None else None,
            "options": asdict(reward_options or RewardOptions()),
        },
        "settings": settings,
    }


def last_mean(history: list[dict], key: str, n: int = LAST_N) -> float | None:
    """Mean of ``key`` over the last ``n`` logged entries that have it (a NaN, nothing scored, is not a value)."""
    values = [h[key] for h in history if h.get(key) is not None and math.isfinite(h[key])][-n:]
    return round(sum(values) / len(values), 4) if values else None


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
    """Train a policy with a TRL online trainer (GRPO, RLOO) and PMIReward; save it and a run summary (written and
    printed by the main process alone; every process returns it, with its own time figures).

    ``model``/``tokenizer`` and ``rewards`` (PMIReward first) replace what the arguments would load.
    """
    set_seed(training_args.seed)
    if rewards is None:
        check_reward_weights(script_args, getattr(training_args, "reward_weights", None), penalty_default=True)
        check_trl_empty_score(script_args, reward_options)
    else:  # a caller's own list (e.g. two PMIRewards, both named pmi_reward by default), before anything loads
        check_reward_names(rewards)
    check_top_p(training_args)  # a caller's own config, not read by the commands' classes
    check_policy_dtype(model_args, model)  # a half-precision full fine-tune: before run_args.json is written
    resume = resume_argument(training_args)
    settings = run_settings(script_args, reward_options, training_args, model_args)
    check_run_folder(resume, settings, training_args.output_dir)
    write_run_args(training_args.output_dir, settings)  # from the start: a run killed in step 1 has it too
    if resume and resume_flag(training_args) is True:  # which checkpoint `true` took (once the checks passed)
        _note(resume_note(resume))
    finished = finished_at(resume, training_args) if resume else None
    dataset = build_prompts(script_args)
    check_generation_batch(training_args, len(dataset))
    device = str(training_args.device)  # the policy's, and the reward scorer's
    if model is None:
        model, tokenizer = policy_from(model_args, training_args.bf16, device)
    start = starting_model(model)  # before the trainer wraps it
    dataset = fit_prompt_column(dataset, tokenizer)
    rewards = rewards or build_rewards(
        script_args, reward_options, model, tokenizer, training_args.output_dir, prompts=dataset, device=device
    )
    weights = training_args.reward_weights
    missing = penalties(script_args)
    if weights is not None and missing and len(weights) == len(rewards) - missing:
        training_args.reward_weights = [*weights, *[1.0] * missing]  # the penalties added last count as given
    timer = RewardTimer(rewards[0], script_args.cpu_budget_seconds)
    # the pinned date of every chat prompt the package renders, for TRL's own rendering of the prompts (the user's
    # keywords win); set after run_args.json is written, so that a resume compares the settings as given
    training_args.chat_template_kwargs = {
        **CHAT_TEMPLATE_KWARGS,
        **(getattr(training_args, "chat_template_kwargs", None) or {}),
    }
    trainer = trainer_cls(
        model=model,
        reward_funcs=rewards,
        args=training_args,
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=lora_config(model_args, model, script_args.lora_top_layers),
        callbacks=[timer],
    )
    if finished and resume is not None:  # finished_at read the checkpoint resume names
        save_finished(trainer, timer, resume, finished)
    else:
        trainer.train(resume_from_checkpoint=resume)
    if trainer.state.global_step == 0:  # nothing trained: the starting model must not be saved as a tuned policy
        raise DataError(
            f"training ran 0 steps on {len(dataset)} prompts (nothing saved as a tuned policy): give more prompts "
            "than one step samples, or a smaller --per_device_train_batch_size"
        )
    trainer.save_model(training_args.output_dir)
    logged = [h for h in trainer.state.log_history if "reward" in h]
    settings = {k: getattr(training_args, k) for k in TRL_SETTINGS if hasattr(training_args, k)}
    summary = {
        "trainer": trainer_cls.__name__,
        "steps": trainer.state.global_step,
        "prompts_used": len(dataset),
        "processes": trainer.accelerator.num_processes,  # trained together, their per-device batches adding up
        "first_reward": logged[0]["reward"] if logged else None,
        "last_reward": logged[-1]["reward"] if logged else None,
        f"reward_last{LAST_N}": last_mean(logged, "reward"),
        f"clipped_ratio_last{LAST_N}": last_mean(logged, "completions/clipped_ratio"),
        f"completion_length_last{LAST_N}": last_mean(logged, "completions/mean_length"),
        f"kl_last{LAST_N}": last_mean(logged, "kl"),
        "kl_unit": "nats per token (TRL's mean over completion tokens; PPO's summary counts per reply)",
        "mean_step_time": _mean(h.get("step_time") for h in logged),
        **timer.summary(),
        **run_provenance(script_args, getattr(rewards[0], "options", reward_options), settings, trainer.model, start),
    }
    if trainer.accelerator.is_main_process:  # one record of the run (every process wrote and printed its own)
        write_summary(training_args.output_dir, summary)
    return summary


def save_finished(trainer: Any, timer: RewardTimer, resume: str, why: str) -> None:
    """Take up checkpoint ``resume`` that ended its run (``why``: ``finished_at``) without training: its weights
    into ``trainer``'s model and its trainer state, so that the policy and summary saved next are those the run
    saved uninterrupted (``Trainer.train`` would have trained one step more before checking ``max_steps``)."""
    if getattr(trainer, "is_deepspeed_enabled", False) or getattr(trainer, "is_fsdp_enabled", False):
        raise ValueError(
            f"--resume_from_checkpoint {resume}: its run had finished ({why}), and under DeepSpeed/FSDP its policy "
            "is not saved again here: take that checkpoint as the tuned policy"
        )
    _note(f"{resume} ended its run ({why}): saving its policy as the tuned one, training no further step")
    trainer._load_from_checkpoint(resume)
    trainer.state = TrainerState.load_from_json(str(Path(resume) / TRAINER_STATE))
    timer.restore(trainer.state)


def trl_main(trainer_cls: type, config_cls: type, argv: list[str] | None = None, prog: str | None = None) -> dict:
    """A TRL trainer's command: script, reward, trainer and model options from YAML and flags; train; summary."""
    script_args, reward_options, training_args, model_args = parse_args(  # --help: on stdout
        (ScriptArguments, RewardOptions, config_cls, ModelConfig), argv, prog
    )
    with command_streams():  # stdout: the run summary alone
        return train_with_trl(trainer_cls, script_args, training_args, model_args, reward_options=reward_options)


def _mean(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return round(sum(present) / len(present), 3) if present else None

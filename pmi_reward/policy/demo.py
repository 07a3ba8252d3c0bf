"""``make demo``: the main job on the embedded default, offline, on a CPU, in under 30 minutes.

1. Train a reward scorer (MiniLM) on Chit-Chat dialogues 0-249, and show what it rewards.
2. Train an evaluation scorer on dialogues 250-499 with another seed: independent of the reward.
3. GRPO on SmolLM2-135M-Instruct with PMIReward (LoRA on the top layers), prompts from dialogues 2000+.
4. Evaluate base vs tuned on held-out contexts (dialogues 3700+) with the evaluation scorer; print the table.

Every step reads a config that ships with the package (``pmi_reward/configs``), so an installed wheel runs it.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from trl import GRPOConfig, GRPOTrainer

from ..configs import parse_args
from ..rewards.rerank import rerank
from ..scoring.scorer import PMIScorer
from ..training.job import ARGUMENTS as TRAIN_ARGUMENTS
from ..training.job import train_scorer
from . import evaluate
from .report import policy_table
from .trainers import cpu_seconds, trl_main

__all__ = ["DemoArguments", "run_demo"]

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
    output_dir: str = "outputs/demo"
    scorer_dialogues: int = field(default=250, metadata={"help": "dialogues per scorer (encoded once, then cached)"})
    scorer_config: str = field(default="scorer/minilm", metadata={"help": "the scorers' config (path or shipped)"})
    grpo_config: str = field(default="demo/grpo", metadata={"help": "the GRPO run's config (path or shipped)"})
    eval_config: str = field(default="demo/evaluate", metadata={"help": "the evaluation's config (path or shipped)"})
    cache_dir: str | None = field(default=None, metadata={"help": "embedding cache (default: ~/.cache/pmi_reward)"})


def _stage(title: str) -> tuple[float, float]:
    print(f"\n=== {title} ===", flush=True)
    return time.perf_counter(), cpu_seconds()


def _done(times: dict, name: str, since: tuple[float, float]) -> None:
    times[name] = (time.perf_counter() - since[0], cpu_seconds() - since[1])


def _train_scorer(argv: list[str]) -> None:
    print(json.dumps(train_scorer(*parse_args(TRAIN_ARGUMENTS, argv, prog="demo: pmi-reward train")), indent=2))


def run_demo(args: DemoArguments) -> dict:  # four stages, each a few lines: read top to bottom
    out, n = Path(args.output_dir), args.scorer_dialogues
    cache = ["--cache_dir", args.cache_dir] if args.cache_dir else []
    times: dict[str, tuple[float, float]] = {}
    start = (time.perf_counter(), cpu_seconds())
    base = ["--config", args.scorer_config, "--dialogues", "chitchat", "--max_dialogues", str(n), "--overwrite", *cache]

    t = _stage(f"1/4 reward scorer: MiniLM, seed 0, chitchat dialogues 0-{n - 1}")
    _train_scorer(base + ["--output_dir", str(out / "reward-scorer")])
    scorer = PMIScorer.from_pretrained(out / "reward-scorer")
    print("\n  PMI  reply   (context: " + CONTEXT.replace("\n", " / ") + ")")
    for text, value in rerank(scorer, CONTEXT, CANDIDATES):
        print(f"{value:+6.2f}  {text}")
    _done(times, "reward scorer", t)

    t = _stage(f"2/4 evaluation scorer: MiniLM, seed 1, chitchat dialogues {n}-{2 * n - 1} (disjoint)")
    _train_scorer(
        base
        + ["--skip_dialogues", str(n), "--seed", "1", "--split_seed", "1", "--output_dir", str(out / "eval-scorer")]
    )
    _done(times, "evaluation scorer", t)

    t = _stage("3/4 GRPO on SmolLM2-135M-Instruct with PMIReward")
    summary = trl_main(
        GRPOTrainer,
        GRPOConfig,
        ["--config", args.grpo_config, "--scorer", str(out / "reward-scorer"), "--output_dir", str(out / "grpo")],
        prog="demo: pmi-reward grpo",
    )
    _done(times, "GRPO", t)

    t = _stage("4/4 engagement gain on held-out contexts (evaluation scorer)")
    result = evaluate.run_evaluation(
        *parse_args(
            evaluate.ARGUMENTS,
            [
                "--config",
                args.eval_config,
                "--tuned",
                str(out / "grpo"),
                "--scorer",
                str(out / "eval-scorer"),
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
        f"{summary['last_reward']:+.2f}, reward share of training time {summary['reward_share']:.1%}"
    )
    print(f"  report: {out / 'eval' / 'results.md'}, plot: {out / 'eval' / 'pmi_hist.png'}\n")
    print(policy_table(result["rows"]))
    return {"times": times, "grpo": summary, "rows": result["rows"]}

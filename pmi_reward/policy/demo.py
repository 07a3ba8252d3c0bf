"""``make demo``: the main job on the embedded default, offline, on a CPU, in under 30 minutes.

1. Train a reward scorer (MiniLM) on Chit-Chat dialogues 0-249, and show what it rewards.
2. Train an evaluation scorer on dialogues 250-499 with another seed: independent of the reward.
3. GRPO on SmolLM2-135M-Instruct with PMIReward (LoRA on the top layers), prompts from dialogues 2000+.
4. Evaluate base vs tuned on held-out contexts (dialogues 3700+) with the evaluation scorer; print the table.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from trl import TrlParser

from ..cli.train import main as train_scorer
from ..rewards.rerank import rerank
from ..scoring.scorer import PMIScorer
from . import evaluate, grpo
from .report import markdown_table
from .trainers import cpu_seconds

RECIPES = Path(__file__).resolve().parents[2] / "recipes" / "smollm2-135m"
CONTEXT = ("I just got back from a hiking trip in the mountains.\nOh nice, where did you go?\n"
           "We went to Yosemite, the views were amazing.")
CANDIDATES = ["Did you see Half Dome? I heard the trail up there is brutal but worth it.",
              "Wow, how long did you hike for? Did you camp overnight?", "That's interesting.", "ok",
              "We went to Yosemite, the views were amazing.", "I like pizza with pineapple."]


@dataclass
class DemoArguments:
    output_dir: str = "outputs/demo"
    scorer_dialogues: int = field(default=250, metadata={"help": "dialogues per scorer (encoded once, then cached)"})
    grpo_config: str = str(RECIPES / "grpo" / "config_demo.yaml")
    eval_config: str = str(RECIPES / "evaluate_demo.yaml")
    cache_dir: str | None = field(default=None, metadata={"help": "embedding cache (default: ~/.cache/pmi_reward)"})


def _stage(title: str) -> tuple[float, float]:
    print(f"\n=== {title} ===", flush=True)
    return time.perf_counter(), cpu_seconds()


def _done(times: dict, name: str, since: tuple[float, float]) -> None:
    times[name] = (time.perf_counter() - since[0], cpu_seconds() - since[1])


def main(argv: list[str] | None = None) -> dict:
    (args,) = TrlParser((DemoArguments,), prog="pmi_reward.policy.demo").parse_args_and_config(argv)
    out, n = Path(args.output_dir), args.scorer_dialogues
    cache = ["--cache_dir", args.cache_dir] if args.cache_dir else []
    times, start = {}, (time.perf_counter(), cpu_seconds())
    base = ["--config", str(RECIPES.parents[1] / "configs" / "scorer" / "minilm.yaml"), "--dialogues", "chitchat",
            "--max_dialogues", str(n), *cache]

    t = _stage(f"1/4 reward scorer: MiniLM, seed 0, chitchat dialogues 0-{n - 1}")
    train_scorer(base + ["--output_dir", str(out / "reward-scorer")])
    scorer = PMIScorer.from_pretrained(out / "reward-scorer")
    print("\n  PMI  reply   (context: " + CONTEXT.replace("\n", " / ") + ")")
    for text, value in rerank(scorer, CONTEXT, CANDIDATES):
        print(f"{value:+6.2f}  {text}")
    _done(times, "reward scorer", t)

    t = _stage(f"2/4 evaluation scorer: MiniLM, seed 1, chitchat dialogues {n}-{2 * n - 1} (disjoint)")
    train_scorer(base + ["--skip_dialogues", str(n), "--seed", "1", "--split_seed", "1",
                         "--output_dir", str(out / "eval-scorer")])
    _done(times, "evaluation scorer", t)

    t = _stage("3/4 GRPO on SmolLM2-135M-Instruct with PMIReward")
    summary = grpo.main(["--config", args.grpo_config, "--scorer", str(out / "reward-scorer"),
                         "--output_dir", str(out / "grpo")])
    _done(times, "GRPO", t)

    t = _stage("4/4 engagement gain on held-out contexts (evaluation scorer)")
    result = evaluate.main(["--config", args.eval_config, "--tuned", str(out / "grpo"),
                            "--scorer", str(out / "eval-scorer"), "--reward_scorer", str(out / "reward-scorer"),
                            "--output_dir", str(out / "eval")])
    _done(times, "evaluation", t)
    _done(times, "total", start)

    wall, cpu = times["total"]
    print(f"\n=== done in {wall / 60:.1f} min (CPU time {cpu / 60:.1f} min, load average {os.getloadavg()[0]:.1f}) ===")
    print("  " + ", ".join(f"{k}: {w / 60:.1f} min" for k, (w, _) in times.items() if k != "total"))
    print(f"  GRPO: {summary['steps']} steps, reward mean {summary['first_reward']:+.2f} -> "
          f"{summary['last_reward']:+.2f}, reward share of training time {summary['reward_share']:.1%}")
    print(f"  report: {out / 'eval' / 'results.md'}, plot: {out / 'eval' / 'pmi_hist.png'}\n")
    print(markdown_table(result["rows"]))
    return {"times": times, "grpo": summary, "rows": result["rows"]}


if __name__ == "__main__":
    main()

"""``pmi-reward <command> [--config FILE.yaml] [--flag value ...]``."""

from __future__ import annotations

import importlib
import sys

COMMANDS = {
    "train": ("pmi_reward.cli.train", "train a PMIScore scorer on pairs or dialogues"),
    "score": ("pmi_reward.cli.score", "add a pmi column to a CSV/JSONL of (context, response) rows"),
    "serve": ("pmi_reward.cli.serve", "serve a scorer over HTTP (OpenRLHF /get_reward, /score, /rerank, /health)"),
    "evaluate": ("pmi_reward.cli.evaluate", "AUC against negatives and correlations with target columns, with CIs"),
    "rerank": ("pmi_reward.cli.rerank", "sort candidate replies by PMI (or sample n with a chat model: best-of-n)"),
    "prepare-models": ("pmi_reward.cli.prepare", "convert/locate the offline PyPI-shipped models once"),
    "grpo": ("pmi_reward.cli.grpo", "GRPO of a chat policy with PMIReward (TRL's GRPOTrainer)"),
    "rloo": ("pmi_reward.cli.rloo", "RLOO of a chat policy with PMIReward (TRL's RLOOTrainer)"),
    "ppo": ("pmi_reward.cli.ppo", "PPO of a chat policy with PMIReward (ours: value head, GAE, KL to the reference)"),
    "evaluate-policy": ("pmi_reward.cli.evaluate_policy", "engagement gain of tuned policies over their base"),
    "demo": ("pmi_reward.cli.demo", "the main job: scorers, a short GRPO run and its held-out engagement gain"),
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        width = max(map(len, COMMANDS))
        lines = [f"  {name:<{width}}  {help_}" for name, (_, help_) in COMMANDS.items()]
        print(
            "usage: pmi-reward <command> [--config FILE.yaml] [options]\n\ncommands:\n"
            + "\n".join(lines)
            + "\n\n`pmi-reward <command> --help` lists a command's options."
        )
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    module = importlib.import_module(COMMANDS[argv[0]][0])
    return module.main(argv[1:]) or 0


if __name__ == "__main__":
    sys.exit(main())

"""``pmi-reward <command> [--config FILE.yaml] [--flag value ...] [--debug]``.

A user's mistake (a missing file, a bad column, an output that exists, a scorer that does not load) ends the
command with one line on stderr and exit code 2; ``--debug`` (anywhere on the line, or ``PMI_REWARD_DEBUG=1``)
shows the traceback instead.
"""

from __future__ import annotations

import importlib
import os
import sys
import traceback
from collections.abc import Sequence

import yaml

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
    "rft": ("pmi_reward.cli.rft", "rejection-sampling fine-tuning: sample n, keep the best by PMI, SFT, repeat"),
    "dpo": ("pmi_reward.cli.dpo", "iterative DPO: sample n, pair the best and worst by PMI, DPO (TRL), repeat"),
    "evaluate-policy": ("pmi_reward.cli.evaluate_policy", "engagement gain of tuned policies over their base"),
    "demo": ("pmi_reward.cli.demo", "the main job: scorers, a short GRPO run and its held-out engagement gain"),
}

# What a user's mistake raises: bad data, files and folders (DataError and ScorerLoadError are ValueErrors), bad
# option values, a --config that is not YAML; anything else is a bug and keeps its traceback.
USER_ERRORS = (ValueError, OSError, ModuleNotFoundError, yaml.YAMLError)
USAGE = 2


def _usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [f"  {name:<{width}}  {help_}" for name, (_, help_) in COMMANDS.items()]
    return (
        "usage: pmi-reward <command> [--config FILE.yaml] [options] [--debug]\n\ncommands:\n"
        + "\n".join(lines)
        + "\n\n`pmi-reward <command> --help` lists a command's options; --debug shows tracebacks."
    )


def _one_line(error: object) -> str:
    return " ".join(str(error).split()) or type(error).__name__


def _debug_from_env() -> bool:
    """``PMI_REWARD_DEBUG``: on unless unset, empty or one of 0, false, no, off (``=false`` turned it on)."""
    return os.environ.get("PMI_REWARD_DEBUG", "").strip().lower() not in ("", "0", "false", "no", "off")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv or _debug_from_env()
    argv = [a for a in argv if a != "--debug"]
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        print(_usage())
        return 0 if argv and argv[0] in ("-h", "--help") else USAGE
    command = argv[0]
    try:
        module = importlib.import_module(COMMANDS[command][0])
        return module.main(argv[1:]) or 0
    except SystemExit as stop:
        if isinstance(stop.code, str):  # our own `raise SystemExit("message")`: exit code 2, --debug or not
            if debug:  # (uncaught, Python printed the message alone, no traceback, and exited 1)
                traceback.print_exc()
            print(f"pmi-reward {command}: {_one_line(stop.code)}", file=sys.stderr)
            return USAGE
        raise
    except USER_ERRORS as err:
        if debug:
            raise
        print(f"pmi-reward {command}: {_one_line(err)} (--debug shows the traceback)", file=sys.stderr)
        return USAGE
    except KeyboardInterrupt:
        print(f"pmi-reward {command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

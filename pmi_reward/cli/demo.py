"""``pmi-reward demo`` (``make demo``): the main job on the embedded default, offline, on a CPU.

Trains a reward scorer and two judges (a MiniLM twin on other dialogues, a SmolLM2 judge on other data; the chat
LM's own PMI is a third), runs a short GRPO with PMIReward and prints the held-out engagement gain by that panel
(``pmi_reward.policy.demo``).
"""

from __future__ import annotations

import sys

from ..configs import parse_args
from ..policy.demo import DemoArguments, run_demo
from .processes import single_process


def main(argv: list[str] | None = None) -> int:
    single_process("demo")  # before anything loads: it has no multi-process path
    (args,) = parse_args((DemoArguments,), argv, prog="pmi-reward demo")
    run_demo(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``pmi-reward evaluate-policy``: the engagement gain of tuned policies over their base, judged by an independent
scorer (``pmi_reward.policy.evaluate`` says what is measured).

    pmi-reward evaluate-policy --config recipes/smollm2-135m/evaluate.yaml --tuned outputs/policies/grpo-cpu
"""

from __future__ import annotations

import sys

from ..configs import parse_args
from ..policy.evaluate import ARGUMENTS, run_evaluation
from .processes import single_process


def main(argv: list[str] | None = None) -> int:
    single_process("evaluate-policy")  # before anything loads: it has no multi-process path
    run_evaluation(*parse_args(ARGUMENTS, argv, prog="pmi-reward evaluate-policy"))
    return 0


if __name__ == "__main__":
    sys.exit(main())

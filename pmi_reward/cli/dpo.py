"""``pmi-reward dpo``: iterative DPO with PMIReward (sample n, pair the best and worst by PMI, DPO with TRL, repeat).

pmi-reward dpo --config recipes/smollm2-135m/tune/dpo.yaml
"""

from __future__ import annotations

import sys

from ..policy.rft import dpo_main
from .processes import single_process


def main(argv: list[str] | None = None) -> int:
    """Prompts, reward, round, DPO and model options from ``--config`` YAML and flags (``--help`` lists them)."""
    single_process("dpo")  # before anything loads: it has no multi-process path
    dpo_main(argv, prog="pmi-reward dpo")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``pmi-reward rft``: rejection-sampling fine-tuning with PMIReward (sample n, keep the best, SFT with TRL, repeat).

pmi-reward rft --config recipes/smollm2-135m/tune/rft.yaml
"""

from __future__ import annotations

import sys

from ..policy.rft import rft_main
from .processes import single_process


def main(argv: list[str] | None = None) -> int:
    """Prompts, reward, RFT, SFT and model options from ``--config`` YAML and flags (``--help`` lists them)."""
    single_process("rft")  # before anything loads: it has no multi-process path
    rft_main(argv, prog="pmi-reward rft")
    return 0


if __name__ == "__main__":
    sys.exit(main())

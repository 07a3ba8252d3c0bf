"""``pmi-reward rloo``: RLOO with PMIReward on TRL's RLOOTrainer (full or LoRA fine-tuning of a chat policy).

    pmi-reward rloo --config recipes/smollm2-135m/rloo/config_cpu.yaml
    accelerate launch --config_file recipes/accelerate_configs/multi_cpu.yaml -m pmi_reward.cli.main rloo --config ...

RLOO samples ``num_generations`` replies per prompt; each reply's baseline is the mean reward of the other
replies to the same prompt (leave-one-out), an unbiased REINFORCE baseline with no value model.
"""

from __future__ import annotations

import sys

import trl
from trl import RLOOTrainer

from ..policy.trainers import settle_trl_config, trl_main


class RLOOConfig(trl.RLOOConfig):
    """TRL's ``RLOOConfig``, with ``top_p`` checked and an unset ``bf16`` settled for a CPU-only machine as it is
    read (``settle_trl_config``), before TRL's and transformers' checks."""

    def __post_init__(self) -> None:
        settle_trl_config(self)
        super().__post_init__()


def main(argv: list[str] | None = None) -> int:
    """Prompts, reward, trainer and model options from ``--config`` YAML and flags (``--help`` lists them)."""
    trl_main(RLOOTrainer, RLOOConfig, argv, prog="pmi-reward rloo")
    return 0


if __name__ == "__main__":
    sys.exit(main())

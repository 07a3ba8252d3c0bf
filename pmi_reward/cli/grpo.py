"""``pmi-reward grpo``: GRPO with PMIReward on TRL's GRPOTrainer (full or LoRA fine-tuning of a chat policy).

    pmi-reward grpo --config recipes/smollm2-135m/grpo/config_cpu.yaml
    accelerate launch --config_file recipes/accelerate_configs/multi_cpu.yaml -m pmi_reward.cli.main grpo --config ...

GRPO samples ``num_generations`` replies per prompt and uses each reply's reward minus its group's mean (divided by
the group's spread unless ``scale_rewards: none``, as the finals set) as the advantage, so no value model is needed
and a constant offset of PMI cancels.
"""

from __future__ import annotations

import sys

import trl
from trl import GRPOTrainer

from ..policy.trainers import settle_trl_config, trl_main


class GRPOConfig(trl.GRPOConfig):
    """TRL's ``GRPOConfig``, with ``top_p`` checked and an unset ``bf16`` settled for a CPU-only machine as it is
    read (``settle_trl_config``), before TRL's and transformers' checks."""

    def __post_init__(self) -> None:
        settle_trl_config(self)
        super().__post_init__()


def main(argv: list[str] | None = None) -> int:
    """Prompts, reward, trainer and model options from ``--config`` YAML and flags (``--help`` lists them)."""
    trl_main(GRPOTrainer, GRPOConfig, argv, prog="pmi-reward grpo")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""GRPO with PMIReward on TRL's GRPOTrainer: full or LoRA fine-tuning of a chat policy on dialogue prompts.

    python -m pmi_reward.policy.grpo --config recipes/smollm2-135m/grpo/config_cpu.yaml
    accelerate launch --config_file recipes/accelerate_configs/multi_cpu.yaml -m pmi_reward.policy.grpo --config ...

GRPO samples ``num_generations`` replies per prompt and uses each reply's reward minus its group's mean
as the advantage, so no value model is needed and a constant offset of PMI cancels.
"""

from __future__ import annotations

from trl import GRPOConfig, GRPOTrainer

from .trainers import trl_main


def main(argv: list[str] | None = None) -> dict:
    """Prompts, reward, trainer and model options from ``--config`` YAML and flags (``--help`` lists them)."""
    return trl_main(GRPOTrainer, GRPOConfig, argv)


if __name__ == "__main__":
    main()

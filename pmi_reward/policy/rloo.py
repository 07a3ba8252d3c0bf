"""RLOO with PMIReward on TRL's RLOOTrainer: full or LoRA fine-tuning of a chat policy on dialogue prompts.

    python -m pmi_reward.policy.rloo --config recipes/smollm2-135m/rloo/config_cpu.yaml
    accelerate launch --config_file recipes/accelerate_configs/multi_cpu.yaml -m pmi_reward.policy.rloo --config ...

RLOO samples ``num_generations`` replies per prompt; each reply's baseline is the mean reward of the other
replies to the same prompt (leave-one-out), an unbiased REINFORCE baseline with no value model.
"""

from __future__ import annotations

from trl import RLOOConfig, RLOOTrainer

from .trainers import trl_main


def main(argv: list[str] | None = None) -> dict:
    """Prompts, reward, trainer and model options from ``--config`` YAML and flags (``--help`` lists them)."""
    return trl_main(RLOOTrainer, RLOOConfig, argv)


if __name__ == "__main__":
    main()

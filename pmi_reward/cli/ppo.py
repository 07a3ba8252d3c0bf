"""``pmi-reward ppo``: PPO with PMIReward (ours: TRL dropped its PPOTrainer), see ``pmi_reward.policy.ppo``.

pmi-reward ppo --config recipes/smollm2-135m/ppo/config_cpu.yaml
accelerate launch --config_file recipes/accelerate_configs/multi_cpu.yaml -m pmi_reward.cli.main ppo --config ...
"""

from __future__ import annotations

import sys

from ..policy.ppo import ppo_main


def main(argv: list[str] | None = None) -> int:
    """Prompts, reward, PPO and model options from ``--config`` YAML and flags (``--help`` lists them)."""
    ppo_main(argv, prog="pmi-reward ppo")
    return 0


if __name__ == "__main__":
    sys.exit(main())

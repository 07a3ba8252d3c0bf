"""Policy training with PMIReward: GRPO and RLOO on TRL, our PPO on accelerate, and engagement-gain evaluation.

Each script is ``python -m pmi_reward.policy.<name> --config recipes/...yaml [--flag value ...]``.
"""

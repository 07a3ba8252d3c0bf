"""Stage 7, policy: chat policies trained and judged with the PMI reward.

``loading`` loads a policy (a shipped name, a hub id, a saved directory or a LoRA adapter); ``prompts`` cuts
chat prompts from dialogues; ``sampling`` samples replies (and best-of-n); ``trainers`` runs TRL's GRPO and
RLOO, ``ppo`` (+ ``ppo_core``) our PPO, ``rft`` rejection-sampling fine-tuning and iterative DPO; ``evaluate``
measures the engagement gain with a panel of judges (``report`` shows it); ``demo`` is the main job of ``make
demo``. The commands are ``pmi-reward grpo``, ``rloo``, ``ppo``, ``rft``, ``dpo``, ``evaluate-policy`` and
``demo``.
"""

"""GRPO with PMIReward on TRL's GRPOTrainer: full or LoRA fine-tuning of a chat policy on dialogue prompts.

    python -m train_policy.grpo --config recipes/smollm2-135m/grpo/config_cpu.yaml
    accelerate launch --config_file recipes/accelerate_configs/multi_cpu.yaml -m train_policy.grpo --config ...

GRPO samples ``num_generations`` replies per prompt and uses each reply's reward minus its group's mean
as the advantage, so no value model is needed and a constant offset of PMI cancels.
"""

from __future__ import annotations

from trl import GRPOConfig, GRPOTrainer, ModelConfig, TrlParser

from .common import ScriptArguments, train_with_trl


def main(argv: list[str] | None = None) -> dict:
    parser = TrlParser((ScriptArguments, GRPOConfig, ModelConfig), prog="train_policy.grpo")
    script_args, training_args, model_args = parser.parse_args_and_config(argv)
    return train_with_trl(GRPOTrainer, script_args, training_args, model_args)


if __name__ == "__main__":
    main()

#!/usr/bin/env bash
# The fifth tuning round of recipes/smollm2-135m (issue 10; 2026-11-25): PPO, the last of the methods not yet
# tried under the protocol, at the GRPO finals' CPU budget with their reward options, on the TUNING contexts
# (3400-3699) only, with the panel and reward of sweep2.sh (run that first). Rule written before the run:
# RESULTS.md, "Fifth tuning round".
# bash recipes/smollm2-135m/sweep5.sh   (from the repository root)
set -euo pipefail
export HF_HUB_OFFLINE=1 OMP_NUM_THREADS=2
PMI=${PMI:-pmi-reward}
# trial ppo-a: tune/ppo.yaml (KL coef 0.1, as GRPO's beta) + the GRPO finals' reward: length-neutral PMI and the
# diversity reward 4x; 3200 CPU-s (float32: our PPO has no bf16 autocast)
$PMI ppo --config recipes/smollm2-135m/tune/ppo.yaml --length_neutral true \
    --extra_reward_funcs pmi_reward.rewards.diversity:diversity_reward --reward_weights 1.0 4.0 \
    --cpu_budget_seconds 3200 --output_dir outputs/policies/tune/ppo-a
$PMI evaluate-policy --config recipes/smollm2-135m/tune/evaluate.yaml --tuned outputs/policies/tune/ppo-a \
    --output_dir outputs/eval/tune/ppo-a

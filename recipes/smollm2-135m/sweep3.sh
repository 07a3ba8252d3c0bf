#!/usr/bin/env bash
# The third tuning round of recipes/smollm2-135m (issue 10; 2026-11-24), in the order it was run, on the TUNING
# contexts (3400-3699) only, with the panel and reward of sweep2.sh (run that first): GRPO trials that add the
# options against reward hacking to trial d (RESULTS.md, "Third tuning round").
# bash recipes/smollm2-135m/sweep3.sh   (from the repository root)
set -euo pipefail
export HF_HUB_OFFLINE=1 OMP_NUM_THREADS=2
PMI=${PMI:-pmi-reward}
# trial e: trial d (bf16, length-neutral, 3400 CPU-s) + a KL term (beta 0.04, trial c's) + the diversity reward
$PMI grpo --config recipes/smollm2-135m/tune/grpo.yaml --length_neutral true --dtype bfloat16 --bf16 true \
    --beta 0.04 --extra_reward_funcs pmi_reward.rewards.diversity:diversity_reward \
    --output_dir outputs/policies/tune/grpo-e
$PMI evaluate-policy --config recipes/smollm2-135m/tune/evaluate.yaml --tuned outputs/policies/tune/grpo-e \
    --output_dir outputs/eval/tune/grpo-e
# trial f: trial e with a stronger KL term
$PMI grpo --config recipes/smollm2-135m/tune/grpo.yaml --length_neutral true --dtype bfloat16 --bf16 true \
    --beta 0.1 --extra_reward_funcs pmi_reward.rewards.diversity:diversity_reward \
    --output_dir outputs/policies/tune/grpo-f
$PMI evaluate-policy --config recipes/smollm2-135m/tune/evaluate.yaml --tuned outputs/policies/tune/grpo-f \
    --output_dir outputs/eval/tune/grpo-f
# trial g: trial f with the diversity reward weighted 4x (its repetition penalty was small beside PMI's spread)
$PMI grpo --config recipes/smollm2-135m/tune/grpo.yaml --length_neutral true --dtype bfloat16 --bf16 true \
    --beta 0.1 --extra_reward_funcs pmi_reward.rewards.diversity:diversity_reward --reward_weights 1.0 4.0 \
    --output_dir outputs/policies/tune/grpo-g
$PMI evaluate-policy --config recipes/smollm2-135m/tune/evaluate.yaml --tuned outputs/policies/tune/grpo-g \
    --output_dir outputs/eval/tune/grpo-g

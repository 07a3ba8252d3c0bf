#!/usr/bin/env bash
# The tuning sweep of recipes/smollm2-135m (issue 10), in the order it was run: every trial starts from
# tune/grpo.yaml, trains on prompts 2000-3399 and is judged on the TUNING contexts (3400-3699) only.
# bash recipes/smollm2-135m/sweep.sh   (from the repository root; ~15 min of 2-core CPU time per trial)
set -euo pipefail
export HF_HUB_OFFLINE=1 OMP_NUM_THREADS=2
PMI=${PMI:-pmi-reward}
BUDGET=${BUDGET:-1500}
trial() {  # name, then flags on top of tune/grpo.yaml
    local name=$1; shift
    $PMI grpo --config recipes/smollm2-135m/tune/grpo.yaml --cpu_budget_seconds "$BUDGET" \
        --output_dir "outputs/policies/tune/grpo-$name" "$@"
}
trial a                                  # the starting settings: Dr. GRPO, lr 5e-4, no KL, 64 tokens, masking
trial b --length_neutral true            # PMI minus the reward scorer's expected PMI of a human reply at that length
trial c --length_neutral true --beta 0.04 \
    --extra_reward_funcs pmi_reward.rewards.diversity:diversity_reward  # + KL to the base + the diversity reward
$PMI evaluate-policy --config recipes/smollm2-135m/tune/evaluate.yaml \
    --tuned outputs/policies/tune/grpo-a outputs/policies/tune/grpo-b outputs/policies/tune/grpo-c \
    --output_dir outputs/eval/tune/sweep

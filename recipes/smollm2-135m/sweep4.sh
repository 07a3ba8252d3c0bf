#!/usr/bin/env bash
# The fourth tuning round of recipes/smollm2-135m (issue 10; 2026-11-25), on the TUNING contexts (3400-3699) only,
# with the panel and reward of sweep2.sh (run that first): rejection-sampling fine-tuning (RFT) again, set up to
# distil best-of-n as the evaluation measures it; trials b-g in the order run, each rule written before its run
# (RESULTS.md, "Fourth tuning round").
# bash recipes/smollm2-135m/sweep4.sh   (from the repository root)
set -euo pipefail
export HF_HUB_OFFLINE=1 OMP_NUM_THREADS=2
PMI=${PMI:-pmi-reward}
# trial rft-b: tune/rft.yaml (plain reward) sampled like the evaluation (T 0.8, top-p 0.95), bf16 policy weights,
# 32 prompts x 8 samples per round, the finals' CPU budget (3200 CPU-s)
$PMI rft --config recipes/smollm2-135m/tune/rft.yaml --rollout_temperature 0.8 --rollout_top_p 0.95 \
    --dtype bfloat16 --bf16 true --prompts_per_round 32 --rounds 40 --cpu_budget_seconds 3200 \
    --output_dir outputs/policies/tune/rft-b
$PMI evaluate-policy --config recipes/smollm2-135m/tune/evaluate.yaml --tuned outputs/policies/tune/rft-b \
    --output_dir outputs/eval/tune/rft-b
# trial rft-c: trial b, but every round samples the BASE policy (`--sample_from base`: best-of-8 distillation; the
# policy never trains on its own samples), with 1500 CPU-s (the time left in the session for finals)
$PMI rft --config recipes/smollm2-135m/tune/rft.yaml --rollout_temperature 0.8 --rollout_top_p 0.95 \
    --dtype bfloat16 --bf16 true --prompts_per_round 32 --rounds 40 --cpu_budget_seconds 1500 --sample_from base \
    --output_dir outputs/policies/tune/rft-c
$PMI evaluate-policy --config recipes/smollm2-135m/tune/evaluate.yaml --tuned outputs/policies/tune/rft-c \
    --output_dir outputs/eval/tune/rft-c
# trial rft-d: trial c with one epoch of SFT per round instead of two
$PMI rft --config recipes/smollm2-135m/tune/rft.yaml --rollout_temperature 0.8 --rollout_top_p 0.95 \
    --dtype bfloat16 --bf16 true --prompts_per_round 32 --rounds 40 --cpu_budget_seconds 1500 --sample_from base \
    --num_train_epochs 1 --output_dir outputs/policies/tune/rft-d
$PMI evaluate-policy --config recipes/smollm2-135m/tune/evaluate.yaml --tuned outputs/policies/tune/rft-d \
    --output_dir outputs/eval/tune/rft-d
# trial rft-e: trial c with the diversity reward beside PMI, 4x (as final/grpo.yaml): it changes which sample is kept
$PMI rft --config recipes/smollm2-135m/tune/rft.yaml --rollout_temperature 0.8 --rollout_top_p 0.95 \
    --dtype bfloat16 --bf16 true --prompts_per_round 32 --rounds 40 --cpu_budget_seconds 1500 --sample_from base \
    --extra_reward_funcs pmi_reward.rewards.diversity:diversity_reward --reward_weights 1.0 4.0 \
    --output_dir outputs/policies/tune/rft-e
$PMI evaluate-policy --config recipes/smollm2-135m/tune/evaluate.yaml --tuned outputs/policies/tune/rft-e \
    --output_dir outputs/eval/tune/rft-e
# trial rft-f: trial c with half the SFT learning rate
$PMI rft --config recipes/smollm2-135m/tune/rft.yaml --rollout_temperature 0.8 --rollout_top_p 0.95 \
    --dtype bfloat16 --bf16 true --prompts_per_round 32 --rounds 40 --cpu_budget_seconds 1500 --sample_from base \
    --learning_rate 1.0e-4 --output_dir outputs/policies/tune/rft-f
$PMI evaluate-policy --config recipes/smollm2-135m/tune/evaluate.yaml --tuned outputs/policies/tune/rft-f \
    --output_dir outputs/eval/tune/rft-f
# trial rft-g: trial f's learning rate and trial e's diversity reward together; float32 and trial f's 10 rounds
# (within 3400 CPU-s), as run on a CPU without native bf16 (RESULTS.md, the amendment)
$PMI rft --config recipes/smollm2-135m/tune/rft.yaml --rollout_temperature 0.8 --rollout_top_p 0.95 \
    --dtype float32 --bf16 false --prompts_per_round 32 --rounds 10 --cpu_budget_seconds 3400 --sample_from base \
    --learning_rate 1.0e-4 --extra_reward_funcs pmi_reward.rewards.diversity:diversity_reward --reward_weights 1.0 4.0 \
    --output_dir outputs/policies/tune/rft-g
$PMI evaluate-policy --config recipes/smollm2-135m/tune/evaluate.yaml --tuned outputs/policies/tune/rft-g \
    --output_dir outputs/eval/tune/rft-g

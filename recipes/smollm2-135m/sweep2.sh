#!/usr/bin/env bash
# The second tuning round of recipes/smollm2-135m (issue 10; 2026-11-24), in the order it was run, on the TUNING
# contexts (3400-3699) only: build the judges and two rewards (frozen and fine-tuned MiniLM, both on Chit-Chat 0-999),
# rank the rewards by judge (b)'s best-of-n gains, then GRPO trial d with the chosen reward and trial b again (RESULTS.md).
# bash recipes/smollm2-135m/sweep2.sh   (from the repository root; ~115 min of 2-core CPU)
set -euo pipefail
export HF_HUB_OFFLINE=1
PMI=${PMI:-pmi-reward}
S=recipes/smollm2-135m/scorers
$PMI train --config scorer/smollm2 --config $S/judge-smollm2-study.yaml       # judge (b), 8 min
$PMI train --config scorer/minilm --config $S/judge-minilm-study.yaml         # judge (c)
$PMI train --config scorer/minilm --config $S/reward-minilm.yaml              # reward, frozen MiniLM, 2 min
$PMI evaluate-policy --config recipes/smollm2-135m/tune/evaluate.yaml --best_of_n 4 8 16 \
    --output_dir outputs/eval/tune/bon-frozen
$PMI train --config scorer/recommended --config $S/reward-minilm-ft.yaml      # reward, MiniLM fine-tuned, 37 min
$PMI evaluate-policy --config recipes/smollm2-135m/tune/evaluate.yaml --best_of_n 4 8 16 \
    --reward_scorer outputs/scorers/reward-minilm-ft-s0 --output_dir outputs/eval/tune/bon-ft
# trial d: trial b's settings (sweep.sh) with bfloat16 policy weights (1.5x the steps per CPU-second) and
# tune/grpo.yaml's own budget (3400 CPU-s, ~28 min: the 30 min of training), the frozen reward
export OMP_NUM_THREADS=2
$PMI grpo --config recipes/smollm2-135m/tune/grpo.yaml --length_neutral true --dtype bfloat16 --bf16 true \
    --output_dir outputs/policies/tune/grpo-d
$PMI evaluate-policy --config recipes/smollm2-135m/tune/evaluate.yaml --tuned outputs/policies/tune/grpo-d \
    --output_dir outputs/eval/tune/grpo-d
# trial b of sweep.sh again, judged by this panel (its earlier figures came from other judge copies)
$PMI grpo --config recipes/smollm2-135m/tune/grpo.yaml --cpu_budget_seconds 1500 --length_neutral true \
    --output_dir outputs/policies/tune/grpo-b2
$PMI evaluate-policy --config recipes/smollm2-135m/tune/evaluate.yaml --tuned outputs/policies/tune/grpo-b2 \
    --output_dir outputs/eval/tune/grpo-b2

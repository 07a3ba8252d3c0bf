#!/usr/bin/env bash
# The final runs of recipes/smollm2-135m (issue 10): final/<method>.yaml (grpo: the settings chosen on the tuning
# contexts by sweep3.sh, trial g; dpo: sweep7.sh's trial dpo-a; ~30 min of training per seed) with three seeds, then
# ONE evaluation of all three on the held-out contexts (3700+).
# bash recipes/smollm2-135m/final.sh [grpo|dpo]   (from the repository root; grpo when no method is named)
set -euo pipefail
export HF_HUB_OFFLINE=1 OMP_NUM_THREADS=2
PMI=${PMI:-pmi-reward}
M=${1:-grpo}
for seed in 0 1 2; do
    $PMI "$M" --config "recipes/smollm2-135m/final/$M.yaml" --seed "$seed" --output_dir "outputs/policies/final/$M-s$seed"
done
$PMI evaluate-policy --config recipes/smollm2-135m/final/evaluate.yaml \
    --tuned "outputs/policies/final/$M-s0" "outputs/policies/final/$M-s1" "outputs/policies/final/$M-s2" \
    --output_dir "outputs/eval/final/$M"
${PYTHON:-python} recipes/smollm2-135m/seeds.py "outputs/eval/final/$M"   # mean +- std over seeds, CI over contexts

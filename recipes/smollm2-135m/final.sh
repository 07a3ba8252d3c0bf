#!/usr/bin/env bash
# The final runs of recipes/smollm2-135m (issue 10): final/grpo.yaml (the settings chosen on the tuning contexts
# by sweep3.sh, trial g; ~30 min of training per seed) with three seeds, then ONE evaluation of all three on the
# held-out contexts (3700+).
# bash recipes/smollm2-135m/final.sh   (from the repository root)
set -euo pipefail
export HF_HUB_OFFLINE=1 OMP_NUM_THREADS=2
PMI=${PMI:-pmi-reward}
for seed in 0 1 2; do
    $PMI grpo --config recipes/smollm2-135m/final/grpo.yaml --seed "$seed" --output_dir "outputs/policies/final/grpo-s$seed"
done
$PMI evaluate-policy --config recipes/smollm2-135m/final/evaluate.yaml \
    --tuned outputs/policies/final/grpo-s0 outputs/policies/final/grpo-s1 outputs/policies/final/grpo-s2 \
    --output_dir outputs/eval/final/grpo
${PYTHON:-python} recipes/smollm2-135m/seeds.py outputs/eval/final/grpo   # mean +- std over seeds, CI over contexts

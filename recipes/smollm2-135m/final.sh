#!/usr/bin/env bash
# The final runs of recipes/smollm2-135m (issue 10): final/<method>.yaml (grpo: the settings chosen on the tuning
# contexts by sweep3.sh, trial g; dpo: sweep7.sh's trial dpo-a; ~30 min of training per seed) with three seeds, then
# ONE evaluation of all three on the held-out contexts (3700+). A name with a suffix (final/dpo-b.yaml) runs the
# command before the first '-' (pmi-reward dpo).
# bash recipes/smollm2-135m/final.sh [grpo|dpo|<method>-<trial>]   (from the repository root; grpo when none is named)
set -euo pipefail
export HF_HUB_OFFLINE=1 OMP_NUM_THREADS=2
PMI=${PMI:-pmi-reward}
M=${1:-grpo}
CMD=${M%%-*}
for seed in 0 1 2; do
    $PMI "$CMD" --config "recipes/smollm2-135m/final/$M.yaml" --seed "$seed" --output_dir "outputs/policies/final/$M-s$seed"
done
$PMI evaluate-policy --config recipes/smollm2-135m/final/evaluate.yaml \
    --tuned "outputs/policies/final/$M-s0" "outputs/policies/final/$M-s1" "outputs/policies/final/$M-s2" \
    --output_dir "outputs/eval/final/$M"
${PYTHON:-python} recipes/smollm2-135m/seeds.py "outputs/eval/final/$M"   # mean +- std over seeds, CI over contexts

#!/usr/bin/env bash
# One trial of iterative DPO on the policy's own samples (the eleventh tuning round on): tune/dpo.yaml
# with cut replies kept and penalised by 10 nats, at most 8 rounds, each round sampling the policy trained so far, at
# LEARNING_RATE and scored by REWARD_DIR (and any further FLAGS of pmi-reward dpo); seeds 0-2 on the tuning prompts,
# then one evaluation of the three on the TUNING contexts (tune/evaluate.yaml) and seeds.py's mean ± std over seeds.
# A seed whose run_summary.json exists (written when its training ends) is kept, not trained again.
# bash recipes/smollm2-135m/dpo_seeds.sh TRIAL LEARNING_RATE REWARD_DIR [FLAGS...]   (from the repository root; ~100 min)
set -euo pipefail
TRIAL=$1 LR=$2 REWARD=$3
shift 3
PMI=${PMI:-pmi-reward}
for seed in 0 1 2; do
    if [ -f "outputs/policies/tune/$TRIAL-s$seed/run_summary.json" ]; then
        echo "outputs/policies/tune/$TRIAL-s$seed: already trained (run_summary.json), kept"
        continue
    fi
    $PMI dpo --config recipes/smollm2-135m/tune/dpo.yaml --learning_rate "$LR" --drop_truncated false \
        --truncation_penalty -10 --rounds 8 --sample_from policy --scorer "$REWARD" --seed "$seed" \
        --output_dir "outputs/policies/tune/$TRIAL-s$seed" "$@"
done
$PMI evaluate-policy --config recipes/smollm2-135m/tune/evaluate.yaml \
    --tuned "outputs/policies/tune/$TRIAL-s0" "outputs/policies/tune/$TRIAL-s1" "outputs/policies/tune/$TRIAL-s2" \
    --output_dir "outputs/eval/tune/$TRIAL"
${PYTHON:-python} recipes/smollm2-135m/seeds.py "outputs/eval/tune/$TRIAL"

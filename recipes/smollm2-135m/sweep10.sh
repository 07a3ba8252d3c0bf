#!/usr/bin/env bash
# The tenth tuning round of recipes/smollm2-135m (issue 10; 2026-11-27): trial dpo-e, the ninth round's dpo-d
# (iterative DPO on the base's samples, cut replies kept and penalised by 10 nats) at 2e-4 instead of 5e-4 and at most
# 8 rounds, trained with THREE seeds on the tuning contexts, because dpo-d's three final seeds went three ways. One
# evaluation of the three on the TUNING contexts (3400-3699), with the reward and judges of sweep2.sh and sweep6.sh
# (run those first). Rule written before the run: RESULTS.md, "Tenth tuning round".
# bash recipes/smollm2-135m/sweep10.sh   (from the repository root; ~100 min of 2-core CPU)
set -euo pipefail
export HF_HUB_OFFLINE=1 OMP_NUM_THREADS=2
PMI=${PMI:-pmi-reward}
for seed in 0 1 2; do
    $PMI dpo --config recipes/smollm2-135m/tune/dpo.yaml --learning_rate 2.0e-4 --drop_truncated false \
        --truncation_penalty -10 --rounds 8 --seed "$seed" --output_dir "outputs/policies/tune/dpo-e-s$seed"
done
$PMI evaluate-policy --config recipes/smollm2-135m/tune/evaluate.yaml \
    --tuned outputs/policies/tune/dpo-e-s0 outputs/policies/tune/dpo-e-s1 outputs/policies/tune/dpo-e-s2 \
    --output_dir outputs/eval/tune/dpo-e
${PYTHON:-python} recipes/smollm2-135m/seeds.py outputs/eval/tune/dpo-e

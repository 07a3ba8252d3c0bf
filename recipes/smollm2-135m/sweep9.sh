#!/usr/bin/env bash
# The ninth tuning round of recipes/smollm2-135m (issue 10; 2026-11-26): trial dpo-d, the eighth round's dpo-b (DPO at
# 5x dpo-a's learning rate, on the base's samples) with the replies cut at the token limit kept as candidates and
# penalised by 10 nats, so that a reply that does not stop is the rejected one of its pair (dpo-b dropped them and
# learned not to stop). On the TUNING contexts (3400-3699) only, with the reward and judges of sweep2.sh and
# sweep6.sh (run those first). Rule written before the run: RESULTS.md, "Ninth tuning round".
# bash recipes/smollm2-135m/sweep9.sh   (from the repository root; ~40 min of 2-core CPU)
set -euo pipefail
export HF_HUB_OFFLINE=1 OMP_NUM_THREADS=2
PMI=${PMI:-pmi-reward}
$PMI dpo --config recipes/smollm2-135m/tune/dpo.yaml --learning_rate 5.0e-4 --drop_truncated false \
    --truncation_penalty -10 --output_dir outputs/policies/tune/dpo-d
$PMI evaluate-policy --config recipes/smollm2-135m/tune/evaluate.yaml --tuned outputs/policies/tune/dpo-d \
    --output_dir outputs/eval/tune/dpo-d

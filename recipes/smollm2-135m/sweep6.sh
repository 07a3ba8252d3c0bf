#!/usr/bin/env bash
# The sixth tuning round of recipes/smollm2-135m (issue 10; 2026-11-26): judge (e) joins the tuning panel (it needs
# `make mpnet`), then RFT trial h, best-of-8 distillation from the base's samples (trial f's settings, float32), on the
# TUNING contexts (3400-3699) only, with the reward and judges of sweep2.sh (run that first). Rule written before the
# run: RESULTS.md, "Sixth tuning round".
# bash recipes/smollm2-135m/sweep6.sh   (from the repository root; ~45 min of 2-core CPU)
set -euo pipefail
export HF_HUB_OFFLINE=1 OMP_NUM_THREADS=2
PMI=${PMI:-pmi-reward}
$PMI train --config scorer/minilm --config recipes/smollm2-135m/scorers/judge-mpnet-study.yaml   # judge (e)
$PMI rft --config recipes/smollm2-135m/tune/rft.yaml --rollout_temperature 0.8 --rollout_top_p 0.95 \
    --dtype float32 --bf16 false --prompts_per_round 32 --rounds 10 --cpu_budget_seconds 3400 --sample_from base \
    --learning_rate 1.0e-4 --output_dir outputs/policies/tune/rft-h
$PMI evaluate-policy --config recipes/smollm2-135m/tune/evaluate.yaml --tuned outputs/policies/tune/rft-h \
    --output_dir outputs/eval/tune/rft-h

#!/usr/bin/env bash
# The nineteenth tuning round of recipes/smollm2-135m (issue 10; rule and script written 2026-11-28, twenty-sixth
# session, before any run): trial dpo-l, a pilot of ONE seed. dpo-k's command (eighteenth round: tune/dpo.yaml, lr
# 5e-4, the base's samples, cut replies kept as candidates and trained as sampled) with a truncation penalty of one
# spread of finished replies' PMI (-2 nats: cut_spread.py, the median within-context std of finished base replies on
# the tuning contexts, 2.18) instead of -10, under which a cut reply was the rejected one in 99% of the prompts that
# held both kinds and the pairs rewarded brevity. Judged by tune/evaluate-all.yaml (297 tuning contexts, the base
# drawn 4 times), then fluency.py; whether seeds 1 and 2 follow is decided by the rule in RESULTS.md, "Nineteenth
# tuning round".
# bash recipes/smollm2-135m/sweep19.sh   (from the repository root; ~55 min of 2-core CPU)
set -euo pipefail
export HF_HUB_OFFLINE=1 OMP_NUM_THREADS=2
command -v pmi-reward > /dev/null || export PATH="$PWD/.venv/bin:$PATH"  # the Makefile's venv, when none is active
PMI=${PMI:-pmi-reward}
PY=${PYTHON:-python}
POLICY=outputs/policies/tune/dpo-l-s0
OUT=outputs/eval/tune/dpo-l-pilot
[ -f "$POLICY/run_summary.json" ] || $PMI dpo --config recipes/smollm2-135m/tune/dpo.yaml --learning_rate 5.0e-4 \
    --drop_truncated false --truncation_penalty -2 --seed 0 --output_dir "$POLICY"
$PMI evaluate-policy --config recipes/smollm2-135m/tune/evaluate-all.yaml --tuned "$POLICY" --output_dir "$OUT"
$PY recipes/smollm2-135m/fluency.py "$OUT/samples.jsonl" --policies base dpo-l-s0 "human reference"

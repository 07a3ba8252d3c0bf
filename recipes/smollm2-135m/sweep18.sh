#!/usr/bin/env bash
# The eighteenth tuning round of recipes/smollm2-135m (issue 10; rule and script written 2026-11-28, twenty-second
# session, before any run): trial dpo-k, a pilot of ONE seed. dpo-d's command (ninth round: tune/dpo.yaml, lr 5e-4,
# the base's samples, cut replies kept as candidates with a 10-nat penalty) on the code that trains a cut reply as it
# was sampled (cc84af0): dpo-d and every later --drop_truncated false trial closed it with an end of turn the policy
# never drew. Seed 0 only, judged by tune/evaluate-all.yaml (297 tuning contexts, the base drawn 4 times), then
# fluency.py; whether seeds 1 and 2 follow is decided by the rule in RESULTS.md, "Eighteenth tuning round".
# bash recipes/smollm2-135m/sweep18.sh   (from the repository root; ~55 min of 2-core CPU)
set -euo pipefail
export HF_HUB_OFFLINE=1 OMP_NUM_THREADS=2
command -v pmi-reward > /dev/null || export PATH="$PWD/.venv/bin:$PATH"  # the Makefile's venv, when none is active
PMI=${PMI:-pmi-reward}
PY=${PYTHON:-python}
POLICY=outputs/policies/tune/dpo-k-s0
OUT=outputs/eval/tune/dpo-k-pilot
[ -f "$POLICY/run_summary.json" ] || $PMI dpo --config recipes/smollm2-135m/tune/dpo.yaml --learning_rate 5.0e-4 \
    --drop_truncated false --truncation_penalty -10 --seed 0 --output_dir "$POLICY"
$PMI evaluate-policy --config recipes/smollm2-135m/tune/evaluate-all.yaml --tuned "$POLICY" --output_dir "$OUT"
$PY recipes/smollm2-135m/fluency.py "$OUT/samples.jsonl" --policies base dpo-k-s0 "human reference"

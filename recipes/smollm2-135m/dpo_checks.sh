#!/usr/bin/env bash
# What the thirteenth and later DPO tuning rounds run on a trial's evaluation samples, after dpo_seeds.sh: the
# order-aware judge (e) beside judge (e) (seeds.py over its rejudge), fluency.py (the base model's NLL per token of
# each seed's replies) and scrambled.py (each scorer's replies against their own scramble), for TRIAL's seeds 0-2.
# bash recipes/smollm2-135m/dpo_checks.sh TRIAL   (from the repository root, after sourcing scramble_scorers.sh)
set -euo pipefail
TRIAL=$1
source recipes/smollm2-135m/scramble_scorers.sh
SAMPLES="outputs/eval/tune/$TRIAL/samples.jsonl"
POLICIES=(base "$TRIAL-s0" "$TRIAL-s1" "$TRIAL-s2" "human reference")
$PMI evaluate-policy --config recipes/smollm2-135m/tune/evaluate.yaml \
    --from_samples "$SAMPLES" --judges mpnet-en=outputs/scorers/judge-mpnet-en \
    mpnet-en-scr="$ORDER_JUDGE" --kl false --log_file "" --output_dir "outputs/eval/tune/$TRIAL-rejudge-scr"
$PY recipes/smollm2-135m/seeds.py "outputs/eval/tune/$TRIAL-rejudge-scr"
$PY recipes/smollm2-135m/fluency.py "$SAMPLES" --policies "${POLICIES[@]}"
$PY recipes/smollm2-135m/scrambled.py "$SAMPLES" --policies "${POLICIES[@]}" \
    --scorers reward=outputs/scorers/reward-minilm-s0 reward-scrambled="$REWARD" \
    smollm2-en=outputs/scorers/judge-smollm2-en minilm-en=outputs/scorers/judge-minilm-en \
    mpnet-en=outputs/scorers/judge-mpnet-en mpnet-en-scr="$ORDER_JUDGE"

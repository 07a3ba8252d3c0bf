#!/usr/bin/env bash
# The sixteenth tuning round of recipes/smollm2-135m (issue 10; rule and script written 2026-11-27, seventeenth
# session, before any run): no training. The two near misses of the DPO rounds, dpo-f (eleventh round) and dpo-j
# (fifteenth), whose every seed passed every gate and which held every condition over the seeds but judge (e)'s
# interval, are judged once more, their six trained policies unchanged, on the tuning contexts that no evaluation has
# read: Chit-Chat dialogues 3460-3699 (every tuning evaluation so far read tune/evaluate.yaml's first 60 prompts,
# dialogues 3400-3459), one sample per context; then the order-aware judge (e) and fluency.py on those replies.
# Rule written before the run: RESULTS.md, "Sixteenth tuning round".
# bash recipes/smollm2-135m/sweep16.sh   (from the repository root; ~35 min of 2-core CPU)
set -euo pipefail
source recipes/smollm2-135m/scramble_scorers.sh
OUT=outputs/eval/tune/fresh16
POLICIES=(base dpo-f-s0 dpo-f-s1 dpo-f-s2 dpo-j-s0 dpo-j-s1 dpo-j-s2 "human reference")
$PMI evaluate-policy --config recipes/smollm2-135m/tune/evaluate.yaml \
    --first_dialogue 3460 --max_dialogues 240 --max_prompts 0 --samples 1 \
    --tuned outputs/policies/tune/dpo-f-s{0,1,2} outputs/policies/tune/dpo-j-s{0,1,2} --output_dir "$OUT"
$PY recipes/smollm2-135m/seeds.py "$OUT"
$PMI evaluate-policy --config recipes/smollm2-135m/tune/evaluate.yaml \
    --from_samples "$OUT/samples.jsonl" --judges mpnet-en=outputs/scorers/judge-mpnet-en \
    mpnet-en-scr="$ORDER_JUDGE" --kl false --log_file "" --output_dir "$OUT-rejudge-scr"
$PY recipes/smollm2-135m/seeds.py "$OUT-rejudge-scr"
$PY recipes/smollm2-135m/fluency.py "$OUT/samples.jsonl" --policies "${POLICIES[@]}"

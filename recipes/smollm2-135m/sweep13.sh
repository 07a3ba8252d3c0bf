#!/usr/bin/env bash
# The thirteenth tuning round of recipes/smollm2-135m (issue 10; 2026-11-27): trial dpo-h, the twelfth round's dpo-g
# (iterative DPO on the policy's own samples, the scramble-aware reward, cut replies penalised by 10 nats, lr 4e-4,
# at most 8 rounds) with the fluency penalty: a sample the starting model reads at more than 2.66 nats a token (its
# own replies' 95th percentile on the tuning contexts) is penalised by 10 nats, so it becomes a rejected reply.
# Seeds 0-2 on the tuning prompts, then one evaluation of the three on the TUNING contexts (3400-3699) with the
# panel of sweep2.sh and sweep6.sh (run those first), the order-aware judge (e), fluency.py and scrambled.py.
# Rule written before the run: RESULTS.md, "Thirteenth tuning round".
# bash recipes/smollm2-135m/sweep13.sh   (from the repository root; ~110 min of 2-core CPU)
set -euo pipefail
export HF_HUB_OFFLINE=1 OMP_NUM_THREADS=2
PMI=${PMI:-pmi-reward}
PY=${PYTHON:-python}
REWARD=outputs/scorers/reward-minilm-scr-s0
ORDER_JUDGE=outputs/scorers/judge-mpnet-en-scr
# each scorer's own command plus one scrambled negative, unless already built (sweep11.sh, RESULTS.md)
for spec in "$REWARD=reward-minilm" "$ORDER_JUDGE=judge-mpnet-study"; do
    [ -f "${spec%%=*}/metadata.json" ] || $PMI train --config scorer/minilm \
        --config "recipes/smollm2-135m/scorers/${spec#*=}.yaml" --k_scrambled 1 --output_dir "${spec%%=*}"
done
bash recipes/smollm2-135m/dpo_seeds.sh dpo-h 4.0e-4 "$REWARD" --fluency_penalty -10 --fluency_max_nll 2.66
$PMI evaluate-policy --config recipes/smollm2-135m/tune/evaluate.yaml \
    --from_samples outputs/eval/tune/dpo-h/samples.jsonl --judges mpnet-en=outputs/scorers/judge-mpnet-en \
    mpnet-en-scr="$ORDER_JUDGE" --kl false --log_file "" --output_dir outputs/eval/tune/dpo-h-rejudge-scr
$PY recipes/smollm2-135m/seeds.py outputs/eval/tune/dpo-h-rejudge-scr
$PY recipes/smollm2-135m/fluency.py outputs/eval/tune/dpo-h/samples.jsonl \
    --policies base dpo-h-s0 dpo-h-s1 dpo-h-s2 "human reference"
$PY recipes/smollm2-135m/scrambled.py outputs/eval/tune/dpo-h/samples.jsonl \
    --policies base dpo-h-s0 dpo-h-s1 dpo-h-s2 "human reference" \
    --scorers reward=outputs/scorers/reward-minilm-s0 reward-scrambled="$REWARD" \
    smollm2-en=outputs/scorers/judge-smollm2-en minilm-en=outputs/scorers/judge-minilm-en \
    mpnet-en=outputs/scorers/judge-mpnet-en mpnet-en-scr="$ORDER_JUDGE"

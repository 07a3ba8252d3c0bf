#!/usr/bin/env bash
# The twelfth tuning round of recipes/smollm2-135m (issue 10; 2026-11-27): trial dpo-g, the eleventh round's dpo-f
# (iterative DPO on the policy's own samples, the scramble-aware reward, cut replies kept and penalised by 10 nats,
# at most 8 rounds) at twice its learning rate, 4e-4, so that the policy moves further than dpo-f's 0.5-1.2 nats per
# reply. Seeds 0-2 on the tuning prompts, then one evaluation of the three on the TUNING contexts (3400-3699) with the
# panel of sweep2.sh and sweep6.sh (run those first), the order-aware judge (e) on the same samples, and scrambled.py.
# Rule written before the run: RESULTS.md, "Twelfth tuning round".
# bash recipes/smollm2-135m/sweep12.sh   (from the repository root; ~110 min of 2-core CPU)
source recipes/smollm2-135m/scramble_scorers.sh
bash recipes/smollm2-135m/dpo_seeds.sh dpo-g 4.0e-4 "$REWARD"
$PMI evaluate-policy --config recipes/smollm2-135m/tune/evaluate.yaml \
    --from_samples outputs/eval/tune/dpo-g/samples.jsonl --judges mpnet-en=outputs/scorers/judge-mpnet-en \
    mpnet-en-scr="$ORDER_JUDGE" --kl false --log_file "" --output_dir outputs/eval/tune/dpo-g-rejudge-scr
$PY recipes/smollm2-135m/seeds.py outputs/eval/tune/dpo-g-rejudge-scr
$PY recipes/smollm2-135m/scrambled.py outputs/eval/tune/dpo-g/samples.jsonl \
    --policies base dpo-g-s0 dpo-g-s1 dpo-g-s2 "human reference" \
    --scorers reward=outputs/scorers/reward-minilm-s0 reward-scrambled="$REWARD" \
    smollm2-en=outputs/scorers/judge-smollm2-en minilm-en=outputs/scorers/judge-minilm-en \
    mpnet-en=outputs/scorers/judge-mpnet-en mpnet-en-scr="$ORDER_JUDGE"

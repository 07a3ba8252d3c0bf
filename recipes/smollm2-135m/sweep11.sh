#!/usr/bin/env bash
# The eleventh tuning round of recipes/smollm2-135m (issue 10; 2026-11-27): trial dpo-f, the tenth round's dpo-e
# (iterative DPO at 2e-4, cut replies kept and penalised by 10 nats, at most 8 rounds) with two changes: each round
# samples the policy trained so far (`--sample_from policy`), and the reward is the scramble-aware one (the reward's
# own command plus `--k_scrambled 1`), so that a policy drifting into word salad is scored on its own replies by a
# reward that pays for word order. Seeds 0-2 on the tuning prompts, then one evaluation of the three on the TUNING
# contexts (3400-3699) with the panel of sweep2.sh and sweep6.sh (run those first), and scrambled.py on its samples.
# Rule written before the run: RESULTS.md, "Eleventh tuning round".
# bash recipes/smollm2-135m/sweep11.sh   (from the repository root; ~105 min of 2-core CPU)
set -euo pipefail
export HF_HUB_OFFLINE=1 OMP_NUM_THREADS=2
PMI=${PMI:-pmi-reward}
REWARD=outputs/scorers/reward-minilm-scr-s0
if [ ! -f "$REWARD/metadata.json" ]; then
    $PMI train --config scorer/minilm --config recipes/smollm2-135m/scorers/reward-minilm.yaml --k_scrambled 1 \
        --output_dir "$REWARD"
fi
bash recipes/smollm2-135m/dpo_seeds.sh dpo-f 2.0e-4 "$REWARD"
${PYTHON:-python} recipes/smollm2-135m/scrambled.py outputs/eval/tune/dpo-f/samples.jsonl \
    --policies base dpo-f-s0 dpo-f-s1 dpo-f-s2 "human reference" \
    --scorers reward=outputs/scorers/reward-minilm-s0 reward-scrambled="$REWARD" \
    smollm2-en=outputs/scorers/judge-smollm2-en minilm-en=outputs/scorers/judge-minilm-en \
    mpnet-en=outputs/scorers/judge-mpnet-en

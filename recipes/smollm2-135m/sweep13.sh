#!/usr/bin/env bash
# The thirteenth tuning round of recipes/smollm2-135m (issue 10; 2026-11-27): trial dpo-h, the twelfth round's dpo-g
# (iterative DPO on the policy's own samples, the scramble-aware reward, cut replies penalised by 10 nats, lr 4e-4,
# at most 8 rounds) with the fluency penalty: a sample the starting model reads at more than 2.66 nats a token (its
# own replies' 95th percentile on the tuning contexts) is penalised by 10 nats, so it becomes a rejected reply.
# Seeds 0-2 on the tuning prompts, then one evaluation of the three on the TUNING contexts (3400-3699) with the
# panel of sweep2.sh and sweep6.sh (run those first), the order-aware judge (e), fluency.py and scrambled.py.
# Rule written before the run: RESULTS.md, "Thirteenth tuning round".
# bash recipes/smollm2-135m/sweep13.sh   (from the repository root; ~110 min of 2-core CPU)
source recipes/smollm2-135m/scramble_scorers.sh
bash recipes/smollm2-135m/dpo_seeds.sh dpo-h 4.0e-4 "$REWARD" --fluency_penalty -10 --fluency_max_nll 2.66
bash recipes/smollm2-135m/dpo_checks.sh dpo-h

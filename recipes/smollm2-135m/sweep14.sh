#!/usr/bin/env bash
# The fourteenth tuning round of recipes/smollm2-135m (issue 10; rule and script written 2026-11-27, before any run):
# trial dpo-i, the thirteenth round's dpo-h (iterative DPO on the policy's own samples, the scramble-aware reward, cut
# replies and replies the starting model reads at more than 2.66 nats a token penalised by 10 nats, lr 4e-4, at most
# 8 rounds) with the NLL of each chosen reply added to DPO's loss (TRL's loss_type [sigmoid, sft], weights 1 and 1),
# so that the chosen replies' likelihood is held up while the rejected ones' falls.
# Seeds 0-2 on the tuning prompts, then one evaluation of the three on the TUNING contexts (3400-3699) with the
# panel of sweep2.sh and sweep6.sh (run those first), the order-aware judge (e), fluency.py and scrambled.py.
# Rule written before the run: RESULTS.md, "Fourteenth tuning round".
# bash recipes/smollm2-135m/sweep14.sh   (from the repository root; ~110 min of 2-core CPU)
source recipes/smollm2-135m/scramble_scorers.sh
bash recipes/smollm2-135m/dpo_seeds.sh dpo-i 4.0e-4 "$REWARD" --fluency_penalty -10 --fluency_max_nll 2.66 \
    --loss_type sigmoid sft
bash recipes/smollm2-135m/dpo_checks.sh dpo-i

#!/usr/bin/env bash
# The fifteenth tuning round of recipes/smollm2-135m (issue 10; rule and script written 2026-11-27, before any run):
# trial dpo-j, the eleventh round's dpo-f (iterative DPO on the policy's own samples, the scramble-aware reward, cut
# replies penalised by 10 nats, lr 2e-4) in bfloat16 on this CPU (AVX512-BF16: a round costs about half the CPU time)
# with up to 16 rounds under the same 3,400 CPU-s, and the fluency penalty (read in bfloat16) as a guard: does the
# slower learning rate, given more rounds of fresh samples, move the policy further than dpo-f without the drift of
# the faster trials?
# Seeds 0-2 on the tuning prompts (a seed already trained, with its run_summary.json, is kept), then one evaluation of
# the three on the TUNING contexts (3400-3699) with the panel of sweep2.sh and sweep6.sh (run those first), the
# order-aware judge (e), fluency.py and scrambled.py. Rule written before the run: RESULTS.md, "Fifteenth tuning round".
# bash recipes/smollm2-135m/sweep15.sh   (from the repository root; ~105 min of 2-core CPU)
source recipes/smollm2-135m/scramble_scorers.sh
bash recipes/smollm2-135m/dpo_seeds.sh dpo-j 2.0e-4 "$REWARD" --dtype bfloat16 --bf16 true --rounds 16 \
    --fluency_penalty -10 --fluency_dtype bfloat16
bash recipes/smollm2-135m/dpo_checks.sh dpo-j

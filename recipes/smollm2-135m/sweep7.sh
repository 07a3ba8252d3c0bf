#!/usr/bin/env bash
# The seventh tuning round of recipes/smollm2-135m (issue 10; 2026-11-26): iterative DPO (pmi-reward dpo) on the
# reward's best-versus-worst pairs of the base's samples, RFT trial h's settings with DPO in place of SFT, on the
# TUNING contexts (3400-3699) only, with the reward and judges of sweep2.sh and sweep6.sh (run those first). Rule
# written before the run: RESULTS.md, "Seventh tuning round".
# bash recipes/smollm2-135m/sweep7.sh   (from the repository root; ~45 min of 2-core CPU)
set -euo pipefail
export HF_HUB_OFFLINE=1 OMP_NUM_THREADS=2
PMI=${PMI:-pmi-reward}
$PMI dpo --config recipes/smollm2-135m/tune/dpo.yaml --output_dir outputs/policies/tune/dpo-a
$PMI evaluate-policy --config recipes/smollm2-135m/tune/evaluate.yaml --tuned outputs/policies/tune/dpo-a \
    --output_dir outputs/eval/tune/dpo-a

#!/usr/bin/env bash
# The eighth tuning round of recipes/smollm2-135m (issue 10; 2026-11-26): iterative DPO that moves the policy further
# than trial dpo-a (which left half its replies the base's word for word): dpo-b, dpo-a's settings at 5x the learning
# rate (the same base samples, only the fit stronger); dpo-c, the same on the current policy's own samples (online
# iterative DPO; the reference stays the starting model). On the TUNING contexts (3400-3699) only, with the reward and
# judges of sweep2.sh and sweep6.sh (run those first). Rule written before the run: RESULTS.md, "Eighth tuning round".
# bash recipes/smollm2-135m/sweep8.sh   (from the repository root; ~80 min of 2-core CPU)
set -euo pipefail
export HF_HUB_OFFLINE=1 OMP_NUM_THREADS=2
PMI=${PMI:-pmi-reward}
for trial in b c; do
    case $trial in
        b) flags=(--learning_rate 5.0e-4) ;;
        c) flags=(--learning_rate 5.0e-4 --sample_from policy) ;;
    esac
    $PMI dpo --config recipes/smollm2-135m/tune/dpo.yaml "${flags[@]}" --output_dir outputs/policies/tune/dpo-$trial
    $PMI evaluate-policy --config recipes/smollm2-135m/tune/evaluate.yaml --tuned outputs/policies/tune/dpo-$trial \
        --output_dir outputs/eval/tune/dpo-$trial
done

#!/usr/bin/env bash
# The seventeenth tuning round of recipes/smollm2-135m (issue 10; rule and script written 2026-11-27, eighteenth
# session, before any run): no training. The protocol every later trial is judged by, tune/evaluate-all.yaml (all 297
# tuning contexts, one reply per policy, the base drawn 4 times per context), read on what it must show: a policy
# that IS the base (a copy of its weights under another name, one reply per context: what a trial that learned
# nothing reads) and the reward's best-of-4 of the base (what a policy can reach at KL <= log 4 - 3/4 nats).
# Rule written before the run: RESULTS.md, "Seventeenth tuning round".
# bash recipes/smollm2-135m/sweep17.sh   (from the repository root; ~30 min of 2-core CPU)
set -euo pipefail
export HF_HUB_OFFLINE=1 OMP_NUM_THREADS=2
command -v pmi-reward > /dev/null || export PATH="$PWD/.venv/bin:$PATH"  # the Makefile's venv, when none is active
OUT=outputs/eval/tune/protocol17
COPY=outputs/policies/null/base-copy
mkdir -p "$(dirname "$COPY")"
[ -e "$COPY" ] || ln -s "$(python -c 'from pmi_reward.scoring.models import resolve_model as r; print(r("smollm2-135m-instruct"))')" "$COPY"
pmi-reward evaluate-policy --config recipes/smollm2-135m/tune/evaluate-all.yaml \
    --tuned "$COPY" --best_of_n 4 --kl false --log_file "" --output_dir "$OUT"

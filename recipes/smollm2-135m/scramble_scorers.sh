# Sourced by the DPO tuning rounds from the twelfth on (sweep12-15.sh, dpo_checks.sh): the environment, and the two
# scramble-aware scorers, each its own command plus one scrambled negative, built unless already there (sweep11.sh,
# RESULTS.md): REWARD, the reward the policies train on, and ORDER_JUDGE, the order-aware judge (e).
set -euo pipefail
export HF_HUB_OFFLINE=1 OMP_NUM_THREADS=2
command -v pmi-reward > /dev/null || export PATH="$PWD/.venv/bin:$PATH"  # the Makefile's venv, when none is active
PMI=${PMI:-pmi-reward}
PY=${PYTHON:-python}
REWARD=outputs/scorers/reward-minilm-scr-s0
ORDER_JUDGE=outputs/scorers/judge-mpnet-en-scr
for spec in "$REWARD=reward-minilm" "$ORDER_JUDGE=judge-mpnet-study"; do
    [ -f "${spec%%=*}/metadata.json" ] || $PMI train --config scorer/minilm \
        --config "recipes/smollm2-135m/scorers/${spec#*=}.yaml" --k_scrambled 1 --output_dir "${spec%%=*}"
done

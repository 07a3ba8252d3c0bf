#!/usr/bin/env bash
# The checks a CUDA machine allows and CI (no GPU) cannot, each on the default device a user's GPU gives:
#   1. scoring on the GPU against the CPU: pairs/s in float32 and bfloat16, and how far the GPU's scores are from
#      the CPU's float32 ones (benchmarks/fast_path.py --device cuda);
#   2. training a scorer with its encoder on the GPU: frozen (embedding there), then a short full fine-tune
#      (bf16 autocast, the GPU's default; the head trains on the CPU), then the same fine-tune stopped after its
#      second round and resumed from its checkpoint, its rounds set against the uninterrupted run's;
#   3. the reward called the way TRL calls it (chat messages, an empty reply, a non-string reply);
#   4. the unit tests with CUDA visible (tiny models: most pin the CPU; PPO's accelerate and the CUDA cases of
#      tests/test_trainable.py take the GPU).
#
#   benchmarks/gpu_check.sh SCORER_DIR PAIRS_DIR OUT_DIR
#
# PAIRS_DIR holds train.csv, val.csv and test.csv (e.g. ../shared/data/pmiscore/datasets/empirical/en). Python is
# $PYTHON, else the repository's .venv (make setup), else python3. Tokenizers run on one thread and the Hub stays
# offline, as under the Makefile, unless the environment says otherwise. Each step prints its exit status and the
# seconds since the start, and one failing step does not stop the others; the script exits 1 if any failed.
set -u
if [ $# -ne 3 ]; then
    sed -n 's/^#   \(benchmarks\/gpu_check\.sh .*\)/usage: \1/p' "$0" >&2  # the header's usage line, by its text: a line number drifts
    exit 2
fi
scorer=$(realpath "$1") pairs=$(realpath "$2") out=$(realpath -m "$3")
cd "$(dirname "$0")/.." || exit 2
py=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
export TOKENIZERS_PARALLELISM=${TOKENIZERS_PARALLELISM:-false} HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1}
work=$(mktemp -d)  # embedding caches and trained scorers; OUT_DIR gets the logs
mkdir -p "$out"
start=$(date +%s) failed=0
step() {
    echo "== $1: exit $2, $(($(date +%s) - start)) s"
    [ "$2" -eq 0 ] || failed=1
}

"$py" - >"$out/versions.txt" 2>&1 <<'EOF'
import importlib.metadata as md
import os

import torch

gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
print("torch", torch.__version__, gpu, "cpus", os.cpu_count())
for name in ("transformers", "trl", "peft", "accelerate", "datasets", "tokenizers", "huggingface_hub", "onnxruntime"):
    try:
        print(name, md.version(name))
    except md.PackageNotFoundError:
        print(name, "not installed")
print("TOKENIZERS_PARALLELISM", os.environ.get("TOKENIZERS_PARALLELISM"))
EOF
step "versions" $?
cat "$out/versions.txt"

timeout 1800 "$py" benchmarks/fast_path.py --scorer "$scorer" --input "$pairs/test.csv" --device cuda \
    --quantize '' --dtypes bfloat16 --pairs 1000 --encode_batch_size 256 --threads "$(nproc)" \
    --cache_dir "$work/embeddings" >"$out/fast_path.json" 2>"$out/fast_path.err"
step "scoring, GPU against CPU" $?
tail -c 2500 "$out/fast_path.json"

train=("$py" -m pmi_reward.cli.main train --config scorer/minilm --train_file "$pairs/train.csv"
    --val_file "$pairs/val.csv" --test_file "$pairs/test.csv" --cache_dir "$work/train-embeddings")
timeout 1800 "${train[@]}" --output_dir "$work/scorer-frozen" >"$out/train.log" 2>&1
step "training, frozen encoder" $?
timeout 3600 "${train[@]}" --output_dir "$work/scorer-full" --train_encoder full --warmup_rounds 1 --epochs 3 \
    --patience 3 >>"$out/train.log" 2>&1
step "training, full fine-tune" $?
tune=(--train_encoder full --warmup_rounds 1 --patience 3 --checkpoint_dir "$work/checkpoint")
timeout 3600 "${train[@]}" --output_dir "$work/scorer-stopped" "${tune[@]}" --epochs 2 >>"$out/train.log" 2>&1 &&
    timeout 3600 "${train[@]}" --output_dir "$work/scorer-resumed" "${tune[@]}" --epochs 3 >>"$out/train.log" 2>&1 &&
    "$py" - "$work/scorer-full" "$work/scorer-resumed" >"$out/resume.log" 2>&1 <<'EOF'
import json
import sys

# A resumed run repeats the uninterrupted one exactly on a CPU (tests/test_checkpoint.py). On a GPU two fresh runs
# already differ (its kernels are not bitwise deterministic; on an H100 by 0.0003 in validation AUC and 0.003 in
# training loss by round 2), so the check asks for each round's validation AUC within 0.005 of the uninterrupted
# run's and prints the gaps: a resume that lost the encoder's weights or the head would fall back to round 1's AUC.
whole, resumed = (json.load(open(f"{d}/train_history.json")) for d in sys.argv[1:])
assert [r["epoch"] for r in whole] == [r["epoch"] for r in resumed], (whole, resumed)
gaps = {k: max(abs(a[k] - b[k]) for a, b in zip(whole, resumed) if a[k] is not None) for k in ("loss", "val_auc")}
for name, rounds in (("uninterrupted", whole), ("resumed", resumed)):
    print(name, [(r["epoch"], r["loss"], r["val_auc"]) for r in rounds])
print("largest gaps", gaps)
sys.exit(0 if gaps["val_auc"] <= 0.005 else 1)
EOF
step "training, full fine-tune stopped after round 2 and resumed from its checkpoint" $?
cat "$out/resume.log" 2>/dev/null
grep -aE "\"(best_val_auc|epochs_run|seconds|test_auc|encoded_texts)\"|Error" "$out/train.log"

timeout 600 "$py" - "$scorer" >"$out/reward.log" 2>&1 <<'EOF'
import sys

from pmi_reward.rewards.reward import PMIReward

reward = PMIReward.from_pretrained(sys.argv[1])
prompts = [[{"role": "user", "content": "I just got back from a hiking trip in the Alps."}]] * 4
replies = ["Which trail did you take? Was the weather kind to you?", "That's interesting.", "", 42]
scores = reward(prompts=prompts, completions=[[{"role": "assistant", "content": r}] for r in replies])
print(reward.scorer.encoder.device, dict(zip(map(repr, replies), scores, strict=True)))
EOF
step "reward, TRL's call" $?
cat "$out/reward.log"

timeout 3600 "$py" -m pytest -q -m "not integration" -p no:cacheprovider --junitxml="$out/junit.xml" \
    >"$out/pytest.log" 2>&1
step "unit tests, CUDA visible" $?
tail -40 "$out/pytest.log"
rm -rf "$work"
exit "$failed"

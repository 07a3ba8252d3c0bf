#!/usr/bin/env bash
# The policy side on a CUDA machine (CI has no GPU): every command that trains, samples or judges a chat policy,
# run as a user runs it there (the recipe's config, --use_cpu false, bf16 autocast), a few steps each:
#   grpo, rloo (TRL), ppo (ours), rft and dpo rounds (sampling + TRL's SFT/DPO; dpo with final/dpo-d.yaml's
#   settings), evaluate-policy (sampling, KL, a trained judge and the chat LM's own PMI as a judge), rerank
#   (best-of-n); then one dpo round with the same settings on that machine's CPU, for the time it takes there.
# Each run's summary says the device its policy trained or was sampled on (`device`); the step fails if it is not
# the GPU.
#
#   benchmarks/gpu_policy_check.sh SCORER_DIR JUDGE_DIR DIALOGUES OUT_DIR
#
# SCORER_DIR: the reward scorer (e.g. outputs/scorers/reward-minilm-s0); JUDGE_DIR: a judge scorer (e.g.
# outputs/scorers/judge-minilm-en); DIALOGUES: `chitchat` or a JSONL of {"id", "turns"} dialogues, at least 260
# (prompts from the first 200, evaluation contexts from the next 60: a device check, not the recipes' protocol).
# The policy is $POLICY (default smollm2-135m-instruct); the trainers' device flags $GPU_FLAGS (default "--use_cpu
# false --bf16 true"); each step stops after $STEP_TIMEOUT seconds (default 900); CPU_STEP=0 leaves out the last
# step (the same dpo round on the machine's CPU, for its time: the slowest step, and it takes every CPU core).
# Python is $PYTHON, else the repository's .venv, else python3. Each step prints its exit status and the seconds
# it took; one failing step does not stop the others; the script exits 1 if any failed.
set -u
if [ $# -ne 4 ]; then
    sed -n 's/^#   \(benchmarks\/gpu_policy_check\.sh .*\)/usage: \1/p' "$0" >&2  # the header's usage line, by its text: a line number drifts
    exit 2
fi
scorer=$(realpath "$1") judge=$(realpath "$2") dialogues=$3 out=$(realpath -m "$4")
[ "$dialogues" = chitchat ] || dialogues=$(realpath "$dialogues")
cd "$(dirname "$0")/.." || exit 2
py=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
export TOKENIZERS_PARALLELISM=${TOKENIZERS_PARALLELISM:-false} HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1}
policy=${POLICY:-smollm2-135m-instruct}
work=$(mktemp -d)
mkdir -p "$out"
failed=0
run() {  # run NAME DEVICE COMMAND...: the command, its exit status and seconds, and the device its summary names
    local name=$1 want=$2 t0 rc summary
    shift 2
    t0=$(date +%s%N)
    timeout "${STEP_TIMEOUT:-900}" "$@" >"$out/$name.log" 2>&1
    rc=$?
    summary=$(ls "$work/$name/run_summary.json" "$work/$name/results.json" 2>/dev/null | head -1)
    local device=-
    [ -n "$summary" ] && device=$("$py" -c "import json,sys; print(json.load(open(sys.argv[1])).get('device'))" "$summary")
    if [ "$rc" -eq 0 ] && [ "$want" != - ] && [[ $device != *"$want"* ]]; then
        rc=3  # ran, but not on the device asked for
    fi
    printf '== %-10s exit %d, %5d s, device %s\n' "$name" "$rc" $((($(date +%s%N) - t0) / 1000000000)) "$device"
    [ "$rc" -eq 0 ] || { failed=1; tail -5 "$out/$name.log"; }
}

"$py" -c "import torch, transformers, trl, peft; print('torch', torch.__version__, torch.cuda.get_device_name(0) \
if torch.cuda.is_available() else 'no GPU', '| transformers', transformers.__version__, '| trl', trl.__version__, \
'| peft', peft.__version__)" | tee "$out/versions.txt"

pmi=("$py" -m pmi_reward.cli.main)
prompts=(--model_name_or_path "$policy" --dialogues "$dialogues" --first_dialogue 0 --max_dialogues 200
    --scorer "$scorer")
read -ra gpu <<<"${GPU_FLAGS:---use_cpu false --bf16 true}"  # a dry run without a GPU: --bf16 false
tune=recipes/smollm2-135m/tune
run grpo cuda "${pmi[@]}" grpo --config $tune/grpo.yaml "${prompts[@]}" "${gpu[@]}" --max_steps 3 \
    --mask_truncated_completions false --output_dir "$work/grpo"
run rloo cuda "${pmi[@]}" rloo --config $tune/rloo.yaml "${prompts[@]}" "${gpu[@]}" --max_steps 2 \
    --mask_truncated_completions false --output_dir "$work/rloo"
run ppo cuda "${pmi[@]}" ppo --config $tune/ppo.yaml "${prompts[@]}" --use_cpu false --steps 2 \
    --mask_truncated_completions false --output_dir "$work/ppo"
run rft cuda "${pmi[@]}" rft --config $tune/rft.yaml "${prompts[@]}" "${gpu[@]}" --rounds 1 --prompts_per_round 32 \
    --drop_truncated false --output_dir "$work/rft"
run dpo cuda "${pmi[@]}" dpo --config recipes/smollm2-135m/final/dpo-d.yaml "${prompts[@]}" "${gpu[@]}" --rounds 2 \
    --output_dir "$work/dpo"
grep -h '"round"' "$out/dpo.log" | cut -c1-200
run evaluate cuda "${pmi[@]}" evaluate-policy --config $tune/evaluate.yaml --base_model "$policy" --tuned "$work/dpo" \
    --judges "minilm-en=$judge" "lm=lm:$policy" --judge_val_auc lm=0.5 --reward_scorer "$scorer" \
    --dialogues "$dialogues" --first_dialogue 200 --max_dialogues 60 --max_prompts 30 --log_file "$work/trials.jsonl" \
    --output_dir "$work/evaluate"
cp "$work/evaluate/results.md" "$out/evaluate-results.md" 2>/dev/null
run rerank - "${pmi[@]}" rerank --scorer "$scorer" --model "$policy" --n 8 \
    --context "I just got back from a hiking trip in the Alps." "Oh nice, how long were you there?"
[ "${CPU_STEP:-1}" = 0 ] || run dpo-cpu cpu "${pmi[@]}" dpo --config recipes/smollm2-135m/final/dpo-d.yaml "${prompts[@]}" --rounds 1 \
    --output_dir "$work/dpo-cpu"
grep -sh '"round"' "$out/dpo-cpu.log" | cut -c1-200
rm -rf "$work"
exit "$failed"

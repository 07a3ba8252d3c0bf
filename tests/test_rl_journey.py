"""The RL user journey's rough edges: resuming a run, a prompt set smaller than one step, the tuned policy's start
against evaluate-policy's base, a folder written by two runs, rerank's system prompt, error hints, default folders."""

import json
import os
import time

import pytest
from conftest import tiny_rl_settings
from trl import DPOConfig, GRPOConfig, GRPOTrainer, ModelConfig, SFTConfig

from pmi_reward.data.conversation import DEFAULT_SYSTEM_PROMPT
from pmi_reward.data.records import DataError
from pmi_reward.policy import trainers
from pmi_reward.policy.trainers import ScriptArguments, train_with_trl

TINY = tiny_rl_settings()


def _prompt_file(tmp_path, n: int) -> str:
    path = tmp_path / "prompts.jsonl"
    rows = [{"prompt": [{"role": "user", "content": f"I love topic {i}."}]} for i in range(n)]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    return str(path)


def _counting(calls: list):
    """A second reward function that counts the training steps (one call per generation batch)."""

    def counter(prompts, completions, **kwargs):
        calls.append(len(completions))
        return [0.0] * len(completions)

    return counter


def test_grpo_resumes_from_its_checkpoint_and_records_its_start(tmp_path, tiny_policy, smol_tokenizer, tiny_reward):
    """--resume_from_checkpoint reached Trainer.train(): a run killed after step 1 of 2 runs only step 2 again (it
    had started over from step 0); the run summary names the model it started from."""
    out = tmp_path / "out"
    script = ScriptArguments(prompt_file=_prompt_file(tmp_path, 4), scorer="unused")
    start = str(tmp_path / "my-sft-model")

    def run(calls: list, **extra):
        model = tiny_policy()
        model.name_or_path = model.config._name_or_path = start  # as load_policy names a folder
        args = GRPOConfig(output_dir=str(out), max_steps=2, save_strategy="steps", save_steps=1, **TINY, **extra)
        return train_with_trl(
            GRPOTrainer, script, args, ModelConfig(), model, smol_tokenizer, [tiny_reward, _counting(calls)]
        )

    first: list = []
    run(first)
    assert len(first) == 2 and (out / "checkpoint-1").is_dir()
    for f in (out / "checkpoint-2").iterdir():  # "killed" after step 1
        f.unlink()
    (out / "checkpoint-2").rmdir()
    again: list = []
    summary = run(again, resume_from_checkpoint=str(out / "checkpoint-1"))
    assert len(again) == 1 and summary["steps"] == 2
    saved = json.loads((out / "run_summary.json").read_text())
    assert saved["start_model"] == start


def test_resume_true_means_the_last_checkpoint_and_a_bad_one_is_refused_before_loading(tmp_path):
    """The flag arrives from the command line as a string: "true" is transformers' True (the last checkpoint in
    output_dir), "false" none; a folder that is not a checkpoint, or "true" with none there, is refused up front."""
    from pmi_reward.policy.trainers import resume_argument

    (tmp_path / "checkpoint-3").mkdir()
    (tmp_path / "checkpoint-3" / "trainer_state.json").write_text("{}")

    def config(value):
        return GRPOConfig(output_dir=str(tmp_path), resume_from_checkpoint=value, **TINY)

    last = str(tmp_path / "checkpoint-3")
    assert resume_argument(config("true")) == last and resume_argument(config(" FALSE ")) is None
    assert resume_argument(config(last)) == last
    # a checkpoint a kill left without trainer_state.json (written last): true passes it over; named, it is refused
    (tmp_path / "checkpoint-4").mkdir()
    assert resume_argument(config("true")) == last
    with pytest.raises(ValueError, match="checkpoint-4: not a training checkpoint"):
        resume_argument(config(str(tmp_path / "checkpoint-4")))
    with pytest.raises(ValueError, match="not a training checkpoint"):
        resume_argument(config(str(tmp_path / "nowhere")))
    with pytest.raises(ValueError, match="no checkpoint-N folder"):
        resume_argument(GRPOConfig(output_dir=str(tmp_path / "empty"), resume_from_checkpoint="true", **TINY))


@pytest.mark.parametrize("command", ["rft", "dpo"])
def test_rft_and_dpo_refuse_to_resume_in_one_line(command, tmp_path, monkeypatch, capsys):
    """Their rounds build a new trainer each: nothing to resume; refused before the policy loads (exit 2), not
    ignored."""
    from pmi_reward.cli.main import main
    from pmi_reward.policy import rft

    monkeypatch.setattr(rft, "policy_from", lambda *a, **k: pytest.fail("the policy loaded before the check"))
    code = main([command, "--resume_from_checkpoint", str(tmp_path), "--output_dir", str(tmp_path), "--use_cpu"])
    ours = [line for line in capsys.readouterr().err.splitlines() if line.startswith("pmi-reward")]
    assert code == 2 and len(ours) == 1 and f"pmi-reward {command}: {command} rounds cannot resume" in ours[0]


def test_fewer_prompts_than_one_step_takes_are_refused_before_the_policy_loads(tmp_path, monkeypatch):
    monkeypatch.setattr(trainers, "policy_from", lambda *a, **k: pytest.fail("the policy loaded before the check"))
    script = ScriptArguments(prompt_file=_prompt_file(tmp_path, 2), scorer="unused")
    args = GRPOConfig(output_dir=str(tmp_path / "out"), max_steps=1, **{**TINY, "per_device_train_batch_size": 12})
    with pytest.raises(DataError, match="2 prompts, but one step takes 3 distinct prompts"):
        train_with_trl(GRPOTrainer, script, args, ModelConfig(), rewards=[lambda **k: None])


def test_a_run_of_zero_steps_saves_no_tuned_policy(tmp_path, monkeypatch, tiny_policy, smol_tokenizer, tiny_reward):
    """The backstop behind the count check (a caller's own sampler settings): 0 steps trained is an error, and the
    starting model is not saved as the tuned policy."""
    monkeypatch.setattr(trainers, "check_generation_batch", lambda *a: None)
    out = tmp_path / "out"
    script = ScriptArguments(prompt_file=_prompt_file(tmp_path, 2), scorer="unused")
    args = GRPOConfig(
        output_dir=str(out), max_steps=1, save_strategy="no", **{**TINY, "per_device_train_batch_size": 12}
    )
    with pytest.raises(DataError, match="training ran 0 steps"):
        train_with_trl(GRPOTrainer, script, args, ModelConfig(), tiny_policy(), smol_tokenizer, [tiny_reward])
    assert not (out / "model.safetensors").exists() and not (out / "run_summary.json").exists()


def test_evaluate_policy_warns_when_a_tuned_policy_started_elsewhere(tmp_path):
    """The tuned folder's recorded start (run_summary's start_model, else its adapter's base; a cache copy of a
    shipped model counts as the shipped model) against --base_model."""
    from pmi_reward.policy.evaluate import start_mismatches
    from pmi_reward.scoring.models import cache_root

    lora, full, bare = tmp_path / "lora", tmp_path / "full", tmp_path / "bare"
    for d in (lora, full, bare):
        d.mkdir()
    shipped_copy = str(cache_root() / "models" / "smollm2-135m-instruct")
    (lora / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": shipped_copy}))
    (full / "run_summary.json").write_text(json.dumps({"start_model": str(tmp_path / "my-sft")}))
    assert start_mismatches([str(lora), str(bare)], "smollm2-135m-instruct") == []
    assert start_mismatches([str(full)], str(tmp_path / "my-sft")) == []
    (warning,) = start_mismatches([str(lora), str(full)], "smollm2-135m-instruct")
    assert warning.startswith(f"tuned policy full started from {tmp_path / 'my-sft'}, not from the base")


def test_the_start_warning_reaches_stderr_and_results_md(
    tmp_path, monkeypatch, tiny_policy, smol_tokenizer, tiny_scorer, capsys
):
    from pmi_reward.policy import evaluate
    from pmi_reward.policy.panel import Judge
    from pmi_reward.policy.sampling import SamplingSettings

    tuned = tmp_path / "tuned"
    tuned.mkdir()
    (tuned / "run_summary.json").write_text(json.dumps({"start_model": str(tmp_path / "my-sft")}))
    monkeypatch.setattr(evaluate, "_check_options", lambda *a: {})  # no judge folders to check
    monkeypatch.setattr(evaluate, "load_policy", lambda name: (tiny_policy(0), smol_tokenizer))
    judge = Judge("j", "x", tiny_scorer, {"encoder": "tiny"})
    monkeypatch.setattr(evaluate, "load_judges", lambda *a: ([judge], None, None))
    prompts = evaluate.EvalPromptArguments(prompt_file=_prompt_file(tmp_path, 2), max_prompts=None)
    args = evaluate.EvalArguments(tuned=[str(tuned)], samples=1, output_dir=str(tmp_path / "eval"), kl=False)
    evaluate.run_evaluation(prompts, args, SamplingSettings(max_new_tokens=2, seed=1))
    assert "WARNING: tuned policy tuned started from" in capsys.readouterr().err
    assert "WARNING: tuned policy tuned started from" in (tmp_path / "eval" / "results.md").read_text()


def test_a_folder_with_an_adapter_and_full_weights_is_refused_naming_the_newer(tmp_path, tiny_policy, smol_tokenizer):
    from peft import LoraConfig, get_peft_model

    from pmi_reward.policy.loading import load_policy

    folder = tmp_path / "policy"
    base = tiny_policy()
    base.save_pretrained(tmp_path / "base")
    smol_tokenizer.save_pretrained(tmp_path / "base")
    base.name_or_path = base.config._name_or_path = str(tmp_path / "base")  # the base its adapter records
    get_peft_model(base, LoraConfig(r=2, target_modules=["q_proj"])).save_pretrained(folder)  # the first run: LoRA
    old = time.time() - 60
    for f in folder.iterdir():
        os.utime(f, (old, old))
    tiny_policy(1).save_pretrained(folder)  # the second run: a full fine-tune into the same folder
    smol_tokenizer.save_pretrained(folder)
    with pytest.raises(ValueError, match="holds both a LoRA adapter .* and full weights .*the full weights newer"):
        load_policy(str(folder))


def test_rerank_samples_with_the_policy_commands_system_prompt(smol_tokenizer, monkeypatch):
    """Its default system prompt is the policy commands'; and its prompts are fitted as theirs are: a template with
    no system role is named with the ``--system_prompt ''`` way out (was jinja's raw TemplateError)."""
    import copy

    from test_policy_prompts import GEMMA

    from pmi_reward.cli import rerank
    from pmi_reward.policy import loading
    from pmi_reward.policy.sampling import SamplingSettings

    assert rerank.RerankArguments().system_prompt == DEFAULT_SYSTEM_PROMPT
    gemma = copy.deepcopy(smol_tokenizer)
    gemma.chat_template = GEMMA
    monkeypatch.setattr(loading, "load_policy", lambda name, device=None: (None, gemma))
    seen = []
    monkeypatch.setattr(rerank, "sample_replies", lambda m, t, prompts, n, s, d: seen.extend(prompts) or [["ok"]])
    rows = [{"context": "Hi there.", "candidates": []}]
    with pytest.raises(DataError, match="System role not supported.*--system_prompt ''"):
        rerank._sample_missing(rerank.RerankArguments(model="m"), SamplingSettings(), rows)
    rerank._sample_missing(rerank.RerankArguments(model="m", system_prompt=""), SamplingSettings(), rows)
    assert seen == [[{"role": "user", "content": "Hi there."}]] and rows[0]["candidates"] == ["ok"]


def test_a_policy_without_a_chat_template_is_named_as_such(smol_tokenizer):
    """--system_prompt '' cannot fix a base model's missing template: the error says what is missing instead."""
    import copy

    from pmi_reward.policy.prompts import fit_prompts

    tok = copy.deepcopy(smol_tokenizer)
    tok.chat_template = None
    for prompt in (
        [{"role": "system", "content": "Be nice."}, {"role": "user", "content": "Hi."}],
        [{"role": "user", "content": "Hi."}],
    ):
        with pytest.raises(DataError, match="no chat template \\(a base model\\?\\)") as err:
            fit_prompts([prompt], tok)
        assert "--system_prompt" not in str(err.value)


def test_a_killed_lora_runs_checkpoints_are_named(tmp_path):
    from pmi_reward.policy.loading import load_policy

    for n in (2, 10):
        (tmp_path / f"checkpoint-{n}").mkdir()
        (tmp_path / f"checkpoint-{n}" / "adapter_config.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match="its checkpoints: checkpoint-2, checkpoint-10"):
        load_policy(str(tmp_path))


def test_commands_without_output_dir_write_under_outputs_policies():
    from pmi_reward.cli.grpo import GRPOConfig as Grpo
    from pmi_reward.cli.rloo import RLOOConfig as Rloo
    from pmi_reward.policy.rft import RFTDPOConfig, RFTSFTConfig

    got = {
        n: c(use_cpu=True).output_dir
        for n, c in (("grpo", Grpo), ("rloo", Rloo), ("rft", RFTSFTConfig), ("dpo", RFTDPOConfig))
    }
    assert got == {n: f"outputs/policies/{n}" for n in got}
    assert RFTSFTConfig(use_cpu=True, output_dir="mine").output_dir == "mine"
    assert isinstance(RFTSFTConfig(use_cpu=True), SFTConfig) and isinstance(RFTDPOConfig(use_cpu=True), DPOConfig)


def test_a_hub_ids_last_part_is_not_read_as_a_shipped_model():
    """``HuggingFaceTB/SmolLM2-135M`` (the base model) was counted as the shipped Instruct by its last part: no
    mismatch warning against it, and an adapter recording it as its base loaded the Instruct's weights."""
    from pmi_reward.policy.evaluate import _start_identity
    from pmi_reward.scoring.models import cache_root, shipped_copy

    assert _start_identity("HuggingFaceTB/SmolLM2-135M") != "smollm2-135m-instruct"
    assert shipped_copy("HuggingFaceTB/SmolLM2-135M") is None and shipped_copy("smollm2-135m") is None
    assert _start_identity(str(cache_root() / "models" / "smollm2-135m-instruct")) == "smollm2-135m-instruct"
    assert shipped_copy("/home/someone/.cache/pmi_reward/models/minilm") == "minilm"  # another machine's cache
    assert shipped_copy(".cache/models/smollm2-135m-instruct") == "smollm2-135m-instruct"  # a relative cache

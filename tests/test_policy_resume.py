"""grpo/rloo resumed with --resume_from_checkpoint (what a requeued job does): a checkpoint that ended its run trains
no further step and saves the policy the run saved uninterrupted; a fresh run never lands in another run's
checkpoints, a resume with other settings names them, and `true` takes the newest complete checkpoint; the CPU
budget and the time figures go on from the checkpoint, and the summary says the step it resumed from."""

import json

import pytest
import torch
from conftest import tiny_rl_settings
from safetensors.torch import load_file
from trl import GRPOConfig, GRPOTrainer, ModelConfig

from pmi_reward.policy import trainers
from pmi_reward.policy.trainers import ScriptArguments, train_with_trl

# a constant rate, as every shipped grpo/rloo config: a step past the end changes the weights
TINY = tiny_rl_settings(learning_rate=1e-2, lr_scheduler_type="constant")


class Stop(Exception):
    """Raised where the run would load the policy: the checks before it have passed."""


def _prompt_file(tmp_path, n: int = 8) -> str:
    path = tmp_path / "prompts.jsonl"
    rows = [{"prompt": [{"role": "user", "content": f"I love topic {i}."}]} for i in range(n)]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    return str(path)


def _counting(calls: list, interrupt_at: int | None = None, clock: list | None = None):
    """A reward function that counts the training steps (one call per generation batch); ``interrupt_at``: the
    call that raises KeyboardInterrupt (a kill during that step); ``clock``: a fake CPU clock it advances 10 s."""

    def counter(prompts, completions, **kwargs):
        calls.append(len(completions))
        if interrupt_at is not None and len(calls) == interrupt_at:
            raise KeyboardInterrupt("killed during this step")
        if clock is not None:
            clock[0] += 10.0
        return [float(len(c[0]["content"])) for c in completions]

    return counter


def _weights(folder) -> dict[str, torch.Tensor]:
    name = "adapter_model.safetensors" if (folder / "adapter_model.safetensors").exists() else "model.safetensors"
    return load_file(str(folder / name))


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_a_resume_from_the_checkpoint_at_max_steps_trains_nothing_and_saves_the_uninterrupted_policy(
    lora, tmp_path, tiny_policy, smol_tokenizer, capsys
):
    """A run killed after its last checkpoint (checkpoint-N, N = max_steps) but before its final save, resumed
    with `true`: transformers checks max_steps only after a step, so it trained step N+1 (a full step at a constant
    learning rate) and saved that as the tuned policy, steps N+1. Now no step trains (no reward call, no
    checkpoint-(N+1)) and the saved policy is bit for bit the one the uninterrupted run saved."""
    out = tmp_path / "out"
    script = ScriptArguments(prompt_file=_prompt_file(tmp_path), scorer="unused")
    model_args = (
        ModelConfig(use_peft=True, lora_r=4, lora_target_modules=["q_proj", "v_proj"]) if lora else ModelConfig()
    )

    def run(calls: list, **extra):
        args = GRPOConfig(output_dir=str(out), max_steps=2, save_strategy="steps", save_steps=1, **TINY, **extra)
        return train_with_trl(GRPOTrainer, script, args, model_args, tiny_policy(), smol_tokenizer, [_counting(calls)])

    first: list = []
    run(first)
    uninterrupted = _weights(out)
    assert len(first) == 2 and (out / "checkpoint-2" / "trainer_state.json").is_file()
    for name in ("model.safetensors", "adapter_model.safetensors", "run_summary.json"):  # the kill
        (out / name).unlink(missing_ok=True)
    capsys.readouterr()
    again: list = []
    summary = run(again, resume_from_checkpoint="true")
    assert again == [] and summary["steps"] == 2 and summary["resumed_from_step"] == 2
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-1", "checkpoint-2"]
    saved = _weights(out)
    assert saved.keys() == uninterrupted.keys()
    assert all(torch.equal(saved[k], uninterrupted[k]) for k in saved)
    assert json.loads((out / "run_summary.json").read_text())["steps"] == 2
    assert "checkpoint-2 ended its run (step 2 of max_steps 2)" in capsys.readouterr().err


def test_a_fresh_run_into_a_folder_holding_checkpoints_is_refused_in_one_line(tmp_path, capsys, stop_at_policy):
    """A second run into the same --output_dir (the default outputs/policies/<command> for every run) overwrote the
    first's same-numbered checkpoints and left its higher ones, which a later `true` resumed as its own: refused
    before anything loads, naming both ways out."""
    from pmi_reward.cli.main import main

    out = tmp_path / "out"
    (out / "checkpoint-3").mkdir(parents=True)
    code = main(["grpo", "--output_dir", str(out), "--use_cpu", "true", "--bf16", "false"])
    ours = [line for line in capsys.readouterr().err.splitlines() if line.startswith("pmi-reward")]
    assert code == 2 and len(ours) == 1, ours
    assert (
        f"output_dir {out} holds checkpoints of an earlier run (checkpoint-3): pass --resume_from_checkpoint "
        in (ours[0])
    )
    assert "true to continue it, or another --output_dir" in ours[0] and stop_at_policy == []
    # a folder without checkpoints (a run with save_strategy "no", as the shipped configs) is written into, as before
    with pytest.raises(Stop):
        main(["grpo", "--output_dir", str(tmp_path / "other"), "--use_cpu", "true", "--bf16", "false"])


@pytest.fixture
def stop_at_policy(monkeypatch):
    """The run stops where the policy would load (the checks before it passed); records that it got there. The
    prompts are four, whatever the arguments name."""
    import datasets

    reached: list[str] = []
    prompts = [[{"role": "user", "content": f"I love {t}."}] for t in "abcd"]
    monkeypatch.setattr(trainers, "build_prompts", lambda args: datasets.Dataset.from_dict({"prompt": prompts}))

    def policy_from(*args, **kwargs):
        reached.append("policy")
        raise Stop

    monkeypatch.setattr(trainers, "policy_from", policy_from)
    return reached


def _checkpoint(folder, step: int, complete: bool = True):
    path = folder / f"checkpoint-{step}"
    path.mkdir(parents=True)
    if complete:
        (path / "trainer_state.json").write_text(json.dumps({"global_step": step, "max_steps": 10}))
    return path


def test_a_resume_with_other_settings_is_said_naming_them(tmp_path, stop_at_policy, capsys):
    """A fresh start records its settings in run_args.json; a resume whose settings differ (here the seed and the
    learning rate) is warned of, naming the fields (not refused: a requeue on another machine or a longer run are
    legitimate), and one that changes only where it writes, logs or saves is silent. True means the newest COMPLETE
    checkpoint, said on stderr."""
    out = tmp_path / "out"
    script = ScriptArguments(prompt_file=_prompt_file(tmp_path), scorer="unused")

    def run(**extra):
        args = GRPOConfig(**{"output_dir": str(out), "max_steps": 10, "seed": 1, **TINY, **extra})
        return train_with_trl(GRPOTrainer, script, args, ModelConfig())

    with pytest.raises(Stop):
        run()
    recorded = json.loads((out / "run_args.json").read_text())
    assert recorded["trainer"]["seed"] == 1 and recorded["script"]["prompt_file"] == script.prompt_file
    assert "output_dir" not in recorded["trainer"] and "resume_from_checkpoint" not in recorded["trainer"]
    _checkpoint(out, 2)
    _checkpoint(out, 4)
    _checkpoint(out, 5, complete=False)  # a kill cut its save short
    with pytest.raises(ValueError, match="holds checkpoints of an earlier run"):
        run()
    with pytest.raises(Stop):  # another seed and learning rate: said, naming them, not refused
        run(resume_from_checkpoint="true", seed=2, learning_rate=5e-2)
    message = capsys.readouterr().err
    assert f"--resume_from_checkpoint {out / 'checkpoint-4'}: its run had other settings (" in message
    assert "trainer.learning_rate (saved: 0.01, this run: 0.05)" in message
    assert "trainer.seed (saved: 1, this run: 2)" in message
    with pytest.raises(Stop):  # where it writes, logs and saves may change without a word (the settings now: these)
        run(resume_from_checkpoint="true", seed=2, learning_rate=5e-2, logging_steps=5, save_steps=7, report_to=[])
    err = capsys.readouterr().err
    assert f"resuming from {out / 'checkpoint-4'} (checkpoint-5 skipped: no trainer_state.json" in err
    assert "other settings" not in err


def test_the_cpu_budget_and_the_clock_go_on_from_the_checkpoint(tmp_path, tiny_policy, smol_tokenizer, monkeypatch):
    """--cpu_budget_seconds counted from zero again in a resumed process: an interrupted-and-resumed 'equal-cost'
    run trained more steps than uninterrupted, its summary reported a cost within budget and did not say it had
    resumed. The CPU clock here is a fake one that each step advances 10 s: budget 25 stops the run at step 3."""
    clock = [0.0]
    monkeypatch.setattr(trainers, "cpu_seconds", lambda: clock[0])
    out = tmp_path / "out"
    script = ScriptArguments(prompt_file=_prompt_file(tmp_path, 40), scorer="unused", cpu_budget_seconds=25.0)

    def run(calls: list, interrupt_at: int | None = None, **extra):
        args = GRPOConfig(output_dir=str(out), max_steps=8, save_strategy="steps", save_steps=1, **TINY, **extra)
        reward = _counting(calls, interrupt_at, clock)
        return train_with_trl(GRPOTrainer, script, args, ModelConfig(), tiny_policy(), smol_tokenizer, [reward])

    first: list = []
    with pytest.raises(KeyboardInterrupt):  # killed during step 3, after checkpoint-2
        run(first, interrupt_at=3)
    clock[0] = 0.0  # a new process: its own CPU clock starts again
    again: list = []
    summary = run(again, resume_from_checkpoint="true")
    assert len(again) == 1 and summary["steps"] == 3 and summary["stopped_by_cpu_budget"]
    assert summary["train_cpu_seconds"] == 30.0 and summary["resumed_from_step"] == 2
    assert json.loads((out / "run_summary.json").read_text())["resumed_from_step"] == 2
    state = json.loads((out / "checkpoint-2" / "trainer_state.json").read_text())  # where the 20 s came from
    assert state["stateful_callbacks"]["pmi_reward_clock"]["cpu_seconds"] == 20.0
    # checkpoint-3 ended the run by its budget: resumed again, it trains nothing and reports the run's figures
    clock[0] = 0.0
    third: list = []
    summary = run(third, resume_from_checkpoint="true")
    assert third == [] and summary["steps"] == 3 and summary["stopped_by_cpu_budget"]
    assert summary["train_cpu_seconds"] == 30.0 and summary["resumed_from_step"] == 3


def test_true_takes_the_newest_complete_checkpoint(tmp_path):
    """A kill during a save leaves checkpoint-N without trainer_state.json (written last): `true` refused it, so a
    requeue loop failed every time until someone stepped in; it now takes the newest complete one, and the note
    names the one passed over. A checkpoint named outright must still be complete."""
    from pmi_reward.policy.trainers import resume_argument

    _checkpoint(tmp_path, 2)
    _checkpoint(tmp_path, 10)  # by step, not by name: checkpoint-10 is newer than checkpoint-9
    _checkpoint(tmp_path, 9)
    _checkpoint(tmp_path, 11, complete=False)
    config = GRPOConfig(output_dir=str(tmp_path), resume_from_checkpoint="true", **TINY)
    picked = resume_argument(config)
    assert picked == str(tmp_path / "checkpoint-10")
    assert trainers.resume_note(picked).endswith(
        "checkpoint-10 (checkpoint-11 skipped: no trainer_state.json, a save cut short)"
    )
    named = GRPOConfig(output_dir=str(tmp_path), resume_from_checkpoint=str(tmp_path / "checkpoint-11"), **TINY)
    with pytest.raises(ValueError, match="checkpoint-11: not a training checkpoint"):
        resume_argument(named)
    for step in (2, 9, 10):
        (tmp_path / f"checkpoint-{step}" / "trainer_state.json").unlink()
    with pytest.raises(
        ValueError, match=r"no checkpoint-N folder with trainer_state.json \(a complete one\) .* \(only checkpoint-2, "
    ):
        resume_argument(config)

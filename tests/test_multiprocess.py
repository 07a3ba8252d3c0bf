"""Launches of several processes (accelerate launch, torchrun): the commands without a multi-process path refuse
them before anything loads; grpo/rloo write one run summary that counts the processes; PPO records its starting
model through DDP's wrapper; the GPU launch config leaves bf16 to the training config."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from pmi_reward.cli.main import main

ROOT = Path(__file__).resolve().parents[1]

# each command without a multi-process path, and what it would load first (a refusal must come before it)
SINGLE_PROCESS = {
    "train": ("pmi_reward.cli.train", "train_scorer"),
    "score": ("pmi_reward.scoring.scorer.PMIScorer", "from_pretrained"),
    "evaluate": ("pmi_reward.scoring.scorer.PMIScorer", "from_pretrained"),
    "rerank": ("pmi_reward.scoring.scorer.PMIScorer", "from_pretrained"),
    "serve": ("pmi_reward.scoring.scorer.PMIScorer", "from_pretrained"),
    "demo": ("pmi_reward.cli.demo", "run_demo"),
    "evaluate-policy": ("pmi_reward.cli.evaluate_policy", "run_evaluation"),
    "rft": ("pmi_reward.policy.rft", "train_rft"),
    "dpo": ("pmi_reward.policy.rft", "train_rft"),
}
LAUNCH_VARIABLES = ("WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE")


@pytest.fixture
def no_launcher(monkeypatch):
    """This process as one started without a launcher, whatever the test run's own environment says."""
    for name in LAUNCH_VARIABLES:
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize("command", list(SINGLE_PROCESS))
def test_a_command_without_a_multi_process_path_refuses_a_launch_of_several(command, no_launcher, monkeypatch, capsys):
    """Under accelerate launch each process ran the whole command: rft/dpo's round log and evaluate-policy's trials
    log got every row twice, `train` trained two identical scorers into one folder, and an rft/dpo CPU budget
    crossed in different rounds left one rank in a collective its peer had left (rc 1, a gloo traceback)."""
    target, name = SINGLE_PROCESS[command]
    monkeypatch.setattr(f"{target}.{name}", lambda *a, **k: pytest.fail(f"{command} loaded before the refusal"))
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert main([command]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err  # one line, no traceback
    assert err.startswith(f"pmi-reward {command}: {command} runs on one process, but WORLD_SIZE=2 says a launcher")
    assert "grpo, rloo and ppo run on several processes" in err


@pytest.mark.parametrize(("command", "entry"), [("grpo", "trl_main"), ("rloo", "trl_main"), ("ppo", "ppo_main")])
def test_the_multi_process_trainers_run_under_a_launcher(command, entry, no_launcher, monkeypatch):
    """grpo, rloo and ppo have a multi-process path (disjoint prompts per rank, one writer): not refused."""
    calls = []
    monkeypatch.setattr(f"pmi_reward.cli.{command}.{entry}", lambda *a, **k: calls.append(a) or {})
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert main([command]) == 0 and len(calls) == 1


def test_the_process_count_is_read_as_accelerate_reads_it(no_launcher, monkeypatch):
    """torchrun's WORLD_SIZE first, then MPI's variables (accelerate's own MULTI_CPU launch goes through mpirun); a
    value that is no integer is skipped, and one process is no launch of several."""
    from pmi_reward.cli.processes import launched_processes, single_process

    assert launched_processes() == (1, None)
    monkeypatch.setenv("WORLD_SIZE", "1")
    single_process("rft")  # one process: runs
    monkeypatch.setenv("WORLD_SIZE", "two")
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "4")
    assert launched_processes() == (4, "OMPI_COMM_WORLD_SIZE")
    with pytest.raises(SystemExit, match=r"^rft runs on one process, but OMPI_COMM_WORLD_SIZE=4 says"):
        single_process("rft")


def test_the_cpu_budget_help_says_rft_and_dpo_run_on_one_process(capsys):
    """The help claimed that under accelerate every process of rft/dpo stops with the first: they had no such
    agreement (each rank read its own clock), and they now refuse a launch of several."""
    from pmi_reward.policy.trainers import ScriptArguments

    text = " ".join(ScriptArguments.__dataclass_fields__["cpu_budget_seconds"].metadata["help"].split())
    assert "rft/dpo (one process only)" in text
    assert text.index("stopping with the first") < text.index("rft/dpo")


@pytest.fixture
def dialogue_file(tmp_path, topic_dialogues):
    path = tmp_path / "dialogues.jsonl"
    path.write_text("\n".join(json.dumps({"id": d.id, "turns": list(d.turns)}) for d in topic_dialogues[:8]))
    return str(path)


@pytest.mark.parametrize("main_process", [True, False])
def test_grpo_and_rloo_write_one_run_summary_that_counts_the_processes(
    main_process, tmp_path, dialogue_file, tiny_policy, smol_tokenizer, tiny_reward, capsys
):
    """Every rank wrote and printed run_summary.json (the file held whichever rank wrote last, with its own CPU
    seconds), and nothing in it said how many processes trained: now the main process alone writes it, as PPO's,
    and it records ``processes``. The trainer is a stand-in whose accelerator is one of two processes."""
    from trl import GRPOConfig, ModelConfig

    from pmi_reward.policy.trainers import ScriptArguments, train_with_trl

    model = tiny_policy()

    class TwoProcessTrainer:  # what train_with_trl reads of TRL's trainer, on one rank of two
        def __init__(self, **kwargs):
            self.model = kwargs["model"]
            self.accelerator = SimpleNamespace(num_processes=2, is_main_process=main_process)
            self.state = SimpleNamespace(global_step=2, log_history=[{"reward": 0.5, "step_time": 0.1}])

        def train(self, resume_from_checkpoint=None):
            pass

        def save_model(self, output_dir):
            pass

    out = tmp_path / "out"
    script = ScriptArguments(dialogues=dialogue_file, first_dialogue=0, max_dialogues=None, scorer="unused")
    args = GRPOConfig(output_dir=str(out), use_cpu=True, bf16=False, per_device_train_batch_size=4, num_generations=4)
    summary = train_with_trl(
        TwoProcessTrainer, script, args, ModelConfig(), model=model, tokenizer=smol_tokenizer, rewards=[tiny_reward]
    )
    printed = capsys.readouterr().out
    if not main_process:
        assert not (out / "run_summary.json").exists() and '"trainer"' not in printed
    else:
        saved = json.loads((out / "run_summary.json").read_text())
        assert saved["processes"] == 2 and saved["steps"] == 2 and json.loads(printed)["processes"] == 2
    assert summary["processes"] == 2  # every process returns it


@pytest.fixture
def one_process_group(tmp_path):
    """A gloo process group of one (this process), so that a real DistributedDataParallel can wrap a model."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'group'}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("use_peft", [True, False])
def test_ppo_records_its_start_model_when_ddp_wraps_the_policy(
    use_peft, one_process_group, tmp_path, dialogue_file, tiny_policy, smol_tokenizer, tiny_reward, monkeypatch
):
    """Under several processes accelerate wraps the policy in DDP, which does not forward its ``lm``: the summary's
    start_model read null, and evaluate-policy's warning about another base model went silent for full fine-tuning.
    Here accelerate's prepare wraps the policy as it does on several processes."""
    from accelerate import Accelerator
    from torch.nn.parallel import DistributedDataParallel
    from trl import ModelConfig

    from pmi_reward.policy import ppo
    from pmi_reward.policy.ppo import PPOConfig, train_ppo
    from pmi_reward.policy.trainers import ScriptArguments

    wrapped = []

    class DDPAccelerator(Accelerator):
        def prepare(self, model, optimizer):
            wrapped.append(DistributedDataParallel(model))
            return wrapped[-1], optimizer

    monkeypatch.setattr(ppo, "Accelerator", DDPAccelerator)
    start = str(tmp_path / "start-model")  # the folder load_policy names a policy by
    model = tiny_policy()
    model.config._name_or_path = model.name_or_path = start  # as from_pretrained sets them (peft reads the second)
    model.config.save_pretrained(start)  # (peft's save reads the base's config there)
    script = ScriptArguments(dialogues=dialogue_file, first_dialogue=0, max_dialogues=None, scorer="unused")
    out = tmp_path / "ppo"
    cfg = PPOConfig(output_dir=str(out), steps=1, rollout_batch_size=2, mini_batch_size=2, max_new_tokens=3)
    model_args = ModelConfig(use_peft=use_peft, lora_r=4, lora_target_modules=["q_proj", "v_proj"])
    summary = train_ppo(cfg, script, model_args, model=model, tokenizer=smol_tokenizer, reward=tiny_reward)
    assert len(wrapped) == 1 and summary["processes"] == 1
    assert summary["start_model"] == start
    assert json.loads((out / "run_summary.json").read_text())["start_model"] == start
    assert torch.distributed.is_initialized()  # the wrapper ran on the group, not beside it


def _launch_env(config: Path, *flags: str) -> dict[str, str]:
    """The ACCELERATE_* variables ``accelerate launch --config_file CONFIG FLAGS`` exports to its processes."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_multi_gpu_env

    args = launch_command_parser().parse_args(["--config_file", str(config), *flags, "train.py"])
    args, _, _ = _validate_launch_command(args)
    return {k: v for k, v in prepare_multi_gpu_env(args).items() if k.startswith("ACCELERATE_")}


@pytest.mark.parametrize("config", sorted((ROOT / "recipes/accelerate_configs").glob("*.yaml")), ids=lambda p: p.name)
def test_a_launch_config_leaves_bf16_to_the_training_config(config, monkeypatch, tmp_path):
    """ddp.yaml set mixed_precision bf16: accelerate launch exported it, and transformers took it whenever the
    training config said bf16 false (the recipes' config_cpu.yaml), so `--bf16 false` was a dead option there and
    PPO autocast too. A launch config now leaves it to the training config; `--mixed_precision bf16` on the launch
    line (README's way for PPO) still turns it on."""
    from pmi_reward.cli.grpo import GRPOConfig

    def precision(env: dict[str, str]) -> str:
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        return GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to=[]).mixed_precision

    env = _launch_env(config)
    assert env["ACCELERATE_MIXED_PRECISION"] == "no"
    assert precision(env) == "no"
    assert precision(_launch_env(config, "--mixed_precision", "bf16")) == "bf16"

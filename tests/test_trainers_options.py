"""The TRL command path's options (``pmi-reward grpo``/``rloo``, ``train_with_trl``) up to the policy's load: the
length-neutral baseline fitted once, by the main process, on the trainer's own prompts; ``top_p`` checked when read;
a bare command on a CPU-only machine. No training: a stand-in stops where the models would load or train."""

import json

import datasets
import pytest
import torch
from trl import GRPOConfig, ModelConfig

from pmi_reward.cli.main import main
from pmi_reward.policy import trainers
from pmi_reward.policy.trainers import ScriptArguments, train_with_trl


class Stop(Exception):
    """Raised by a stand-in where the run would load a model or train."""


def _prompts(tag: str) -> datasets.Dataset:
    prompts = [[{"role": "user", "content": f"{tag}: I love {t}."}] for t in "abcd"]
    return datasets.Dataset.from_dict({"prompt": prompts, "reference": [f"{tag} reply {t}" for t in "wxyz"]})


@pytest.fixture
def fits(monkeypatch, tiny_scorer):
    """The prompts each baseline fit reads (the fitting reward is named "fit"); the scorer is the tiny one."""
    monkeypatch.setattr(
        trainers.PMIReward, "from_pretrained", lambda *a, **k: trainers.PMIReward(tiny_scorer, k["options"])
    )
    read: list[list] = []
    call = trainers.PMIReward.__call__

    def spy(self, prompts, completions, **kwargs):
        if self.options.name == "fit":
            read.append(list(prompts))
        return call(self, prompts, completions, **kwargs)

    monkeypatch.setattr(trainers.PMIReward, "__call__", spy)
    return read


def test_the_length_baseline_is_fitted_on_the_prompts_the_trainer_gets(
    fits, tmp_path, tiny_policy, smol_tokenizer, monkeypatch
):
    """build_rewards built and fitted the prompts a second time: twice the work, and a prompt file changed in
    between (or another draw) fitted the baseline on other prompts than those trained on."""
    built: list[str] = []
    monkeypatch.setattr(trainers, "build_prompts", lambda args: built.append("read") or _prompts(f"read {len(built)}"))
    given = {}

    class Trainer:  # stops where TRL's trainer would start
        def __init__(self, train_dataset, reward_funcs, **kwargs):
            given.update(prompts=list(train_dataset["prompt"]), reward=reward_funcs[0])
            raise Stop

    args = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to=[])
    script = ScriptArguments(length_neutral=True)
    with pytest.raises(Stop):
        train_with_trl(Trainer, script, args, ModelConfig(), model=tiny_policy(), tokenizer=smol_tokenizer)
    assert built == ["read"]
    assert fits == [given["prompts"]] and given["prompts"][0][0]["content"] == "read 1: I love a."
    assert given["reward"].options.length_baseline == str(tmp_path / "length_baseline.json")
    assert json.loads((tmp_path / "length_baseline.json").read_text())["source"]["replies"] == 4


def _distributed(monkeypatch, rank: int, events: list[str], on_barrier=None) -> None:
    """This process as ``rank`` of a distributed run, its barriers recorded (``on_barrier``: what the other
    processes have done by the time the barrier lets this one through)."""

    def barrier(*args, **kwargs):
        events.append("barrier")
        if on_barrier is not None:
            on_barrier()

    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_rank", lambda *a: rank)
    monkeypatch.setattr(torch.distributed, "barrier", barrier)


def test_under_ddp_the_main_process_alone_fits_and_writes_the_length_baseline(fits, tmp_path, monkeypatch):
    """Every rank fitted the baseline and wrote the same length_baseline.json, each then reading whichever write
    landed last. Now rank 0 fits and writes it, then lets the others in; they wait, fit nothing, and read its file."""
    args = ScriptArguments(length_neutral=True)
    path = tmp_path / "length_baseline.json"
    monkeypatch.setattr(trainers, "build_prompts", lambda args: _prompts("built"))
    events: list[str] = []
    _distributed(monkeypatch, 0, events, on_barrier=lambda: events.append(f"file there: {path.is_file()}"))
    main = trainers.build_rewards(args, output_dir=str(tmp_path))[0]
    assert len(fits) == 1 and events == ["barrier", "file there: True"]
    written = path.read_text()

    path.unlink()
    other = tmp_path / "main-wrote.json"
    other.write_text(written)
    events.clear()
    _distributed(monkeypatch, 1, events, on_barrier=lambda: path.write_text(other.read_text()))
    rank1 = trainers.build_rewards(args, output_dir=str(tmp_path))[0]
    assert len(fits) == 1 and events == ["barrier"]  # waited for the main process, fitted nothing
    assert rank1.length_baseline == main.length_baseline and path.read_text() == written

    path.unlink()  # rank 2, the first of a second node (LOCAL_RANK 0), whose disk need not be the first node's
    events.clear()
    monkeypatch.setenv("LOCAL_RANK", "0")
    _distributed(monkeypatch, 2, events, on_barrier=lambda: events.append(f"file there: {path.is_file()}"))
    node = trainers.build_rewards(args, output_dir=str(tmp_path))[0]
    assert len(fits) == 2 and events == ["barrier", "file there: True"] and node.length_baseline == main.length_baseline
    monkeypatch.delenv("LOCAL_RANK")

    events.clear()
    monkeypatch.setattr(trainers, "fit_prompt_length_baseline", lambda *a, **k: (_ for _ in ()).throw(Stop()))
    _distributed(monkeypatch, 0, events)
    with pytest.raises(Stop):  # a main process that fails still lets the others in (to fail, not to wait)
        trainers.build_rewards(args, output_dir=str(tmp_path))
    assert events == ["barrier"]


def test_a_single_process_fits_the_length_baseline_with_no_barrier(fits, tmp_path, monkeypatch):
    """One process (no process group): it fits and writes as before, and waits for nobody."""
    monkeypatch.setattr(torch.distributed, "barrier", lambda *a, **k: pytest.fail("a barrier in a single process"))
    monkeypatch.setattr(trainers, "build_prompts", lambda args: _prompts("built"))
    reward = trainers.build_rewards(ScriptArguments(length_neutral=True), output_dir=str(tmp_path))[0]
    assert len(fits) == 1 and fits[0][0][0]["content"] == "built: I love a."  # no dataset given: built from args
    assert reward.options.length_baseline == str(tmp_path / "length_baseline.json")


@pytest.fixture
def stop_at_the_policy(monkeypatch):
    """build_prompts gives four prompts; policy_from records how it was called and stops the run there."""
    calls: list[dict] = []

    def policy_from(model_args, bf16=None, device=None):
        calls.append({"bf16": bf16, "device": device})
        raise Stop

    monkeypatch.setattr(trainers, "build_prompts", lambda args: _prompts("p"))
    monkeypatch.setattr(trainers, "policy_from", policy_from)
    return calls


@pytest.mark.parametrize("command", ["grpo", "rloo"])
@pytest.mark.parametrize("top_p", ["1.5", "0", "-0.1"])
def test_top_p_outside_0_1_is_refused_when_read(command, top_p, stop_at_the_policy, tmp_path, capsys):
    """TRL's top_p outside (0, 1] went unchecked until generate() (a negative one failed once the models had
    loaded; one above 1 read as 1, 0 as the likeliest token alone): one line naming --top_p and exit code 2."""
    flags = ["--use_cpu", "true", "--bf16", "false", "--output_dir", str(tmp_path)]
    assert main([command, *flags, "--top_p", top_p]) == 2
    assert f"--top_p must be in (0, 1] (1: every token), got {float(top_p)}; unlike" in capsys.readouterr().err
    assert stop_at_the_policy == []
    with pytest.raises(Stop):  # an allowed value reaches the policy's load
        main([command, *flags, "--top_p", "1"])


def test_train_with_trl_refuses_a_bad_top_p_before_anything_loads(stop_at_the_policy, tmp_path):
    """A caller's own TRL config is checked too, before the prompts or the policy load."""
    args = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to=[], top_p=1.5)
    with pytest.raises(ValueError, match=r"--top_p must be in \(0, 1\]"):
        train_with_trl(object, ScriptArguments(), args, ModelConfig())
    assert stop_at_the_policy == []


@pytest.mark.parametrize("command", ["grpo", "rloo"])
def test_a_bare_command_on_a_cpu_only_machine_trains_in_float32(
    command, cpu_only, stop_at_the_policy, tmp_path, capsys
):
    """TRL turns an unset bf16 on, and transformers then refused it on a CPU-only machine ("Your setup doesn't
    support bf16/gpu"): a bare `pmi-reward grpo` failed at parse. bf16 left unset is now off there: float32 on the
    CPU, as the README advises; --bf16 true there is refused naming the flags to pass."""
    with pytest.raises(Stop):
        main([command, "--output_dir", str(tmp_path)])
    assert [call["bf16"] for call in stop_at_the_policy] == [False]  # (the device: a GPU computing float32, if any)
    assert main([command, "--output_dir", str(tmp_path), "--bf16", "true"]) == 2
    err = capsys.readouterr().err
    assert "--bf16 true: no GPU here computes bfloat16; pass --bf16 false" in err and "--use_cpu true" in err
    with pytest.raises(Stop):  # --use_cpu true keeps TRL's default (bf16 autocast on the CPU), as before
        main([command, "--output_dir", str(tmp_path), "--use_cpu", "true"])
    assert stop_at_the_policy[-1] == {"bf16": True, "device": "cpu"}


def test_an_unset_bf16_stays_on_where_a_gpu_computes_it(monkeypatch):
    """Where a GPU computes bfloat16, or with --use_cpu, an unset bf16 is left to TRL (which turns it on), as before."""
    from types import SimpleNamespace

    monkeypatch.setattr(trainers, "is_torch_bf16_gpu_available", lambda: True)
    for use_cpu in (False, True):
        config = SimpleNamespace(use_cpu=use_cpu, bf16=None, top_p=1.0)
        trainers.settle_trl_config(config)
        assert config.bf16 is None

"""Loading a policy: a base model, a fine-tuned folder, or a LoRA adapter merged onto its base."""

import pytest


def test_an_adapter_of_a_base_given_by_a_relative_path_loads_onto_that_base_anywhere(
    tiny_policy, smol_tokenizer, tmp_path, monkeypatch
):
    """A base loaded as ``base`` (relative) was recorded so by the adapter trained on it: loaded from another folder
    holding its own ``base``, the adapter merged onto that one. The base's path is made absolute when it loads."""
    import torch
    from peft import LoraConfig, get_peft_model

    from pmi_reward.policy.loading import load_policy

    for folder, seed in (("a", 0), ("b", 1)):
        tiny_policy(seed).save_pretrained(tmp_path / folder / "base")
        smol_tokenizer.save_pretrained(tmp_path / folder / "base")
    monkeypatch.chdir(tmp_path / "a")
    model, _ = load_policy("base", device="cpu")
    tuned = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj"], init_lora_weights=False))
    tuned.save_pretrained(tmp_path / "a" / "adapter")
    ids = torch.tensor([[1, 5, 9, 12]])
    with torch.no_grad():
        want = tuned.eval()(ids).logits
    monkeypatch.chdir(tmp_path / "b")
    loaded, _ = load_policy(str(tmp_path / "a" / "adapter"), device="cpu")
    with torch.no_grad():
        assert torch.allclose(loaded(ids).logits, want, atol=1e-4)


def test_a_shipped_name_keeps_its_name_beside_a_folder_of_that_name(tiny_policy, tmp_path, monkeypatch):
    """A shipped name loads the shipped model even where the working directory has a folder of that name; that
    folder's path must not become the model's name (an adapter would merge onto the folder, TRL's reference too)."""
    from pmi_reward.policy import loading

    monkeypatch.chdir(tmp_path)
    (tmp_path / "smollm2-135m-instruct").mkdir()  # an unrelated folder of the shipped name
    asked = []

    def load_causal_lm(name, *args, **kwargs):
        asked.append(name)
        model = tiny_policy(0)
        model.name_or_path = model.config._name_or_path = name  # as transformers names what it loads
        return model

    monkeypatch.setattr(loading, "load_causal_lm", load_causal_lm)
    model, _ = loading.load_policy("smollm2-135m-instruct", device="cpu")
    assert asked == ["smollm2-135m-instruct"]  # the shipped name is loaded, not the folder
    assert model.name_or_path == model.config._name_or_path == "smollm2-135m-instruct"  # and kept, not the folder's


def test_a_policy_folder_without_a_tokenizer_is_refused_by_name_and_an_adapter_takes_its_bases(
    tiny_policy, smol_tokenizer, tmp_path
):
    """A saved model folder without tokenizer files (``evaluate-policy --tuned DIR``, ``rerank --model DIR``) failed
    in transformers with a hint to install sentencepiece or tiktoken: it is refused naming the folder and the fix. An
    adapter folder without one still loads with its base's tokenizer."""
    from peft import LoraConfig, get_peft_model

    from pmi_reward.policy.loading import load_policy

    tiny_policy(0).save_pretrained(tmp_path / "bare")
    with pytest.raises(FileNotFoundError, match="no tokenizer files") as refused:
        load_policy(str(tmp_path / "bare"), device="cpu")
    assert str(tmp_path / "bare") in str(refused.value) and "tokenizer.save_pretrained" in str(refused.value)

    run = tmp_path / "killed-run"  # a run killed before its save: checkpoints, no model of its own
    tiny_policy(0).save_pretrained(run / "checkpoint-8")
    (run / "runs").mkdir()
    with pytest.raises(FileNotFoundError, match=r"no model in this policy folder \(no config\.json\).*checkpoint-8"):
        load_policy(str(run), device="cpu")

    tiny_policy(0).save_pretrained(tmp_path / "base")
    smol_tokenizer.save_pretrained(tmp_path / "base")
    adapter = get_peft_model(tiny_policy(0), LoraConfig(r=4, target_modules=["q_proj"]))
    adapter.peft_config["default"].base_model_name_or_path = str(tmp_path / "base")
    adapter.save_pretrained(tmp_path / "adapter")
    assert not (tmp_path / "adapter" / "tokenizer_config.json").exists()
    _, tokenizer = load_policy(str(tmp_path / "adapter"), device="cpu")
    assert tokenizer.get_vocab() == smol_tokenizer.get_vocab() and tokenizer.padding_side == "left"


@pytest.mark.parametrize(
    ("native", "device", "warns"),
    [
        # --use_cpu on a GPU machine
        ("cuda", "cpu", "this cpu has no fast bfloat16 (it takes AMX, or AVX512-BF16 on a non-Intel CPU)"),
        ("cuda", "cuda:0", None),
        ("cuda", None, None),  # load_policy's default: the GPU
        ("cpu", "cpu", None),  # an AMX CPU beside a GPU without bf16
        ("cpu", "cuda:0", "this cuda has no fast bfloat16, "),
        ("neither", "xla:0", None),  # not judged: a TPU computes bf16
    ],
)
def test_policy_from_judges_bf16_by_the_device_the_policy_runs_on(native, device, warns, gpu_machine, monkeypatch):
    """``check_bf16`` looked at the GPU whenever there was one: a ``--use_cpu true`` run in bf16 on a GPU machine
    whose CPU only emulates bf16 (~25x slower) got no warning, and one on an AMX CPU beside an old GPU got a wrong one.
    A machine with a GPU is stood in for; which device computes bf16 natively is ``native``."""
    import warnings

    from trl import ModelConfig

    from pmi_reward.policy import loading, trainers

    monkeypatch.setattr(loading, "native_bf16", lambda d: d.type == native)
    monkeypatch.setattr(trainers, "load_policy", lambda *args: ("model", "tokenizer"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainers.policy_from(
            ModelConfig(model_name_or_path="policy", dtype="bfloat16", use_peft=True), bf16=True, device=device
        )
    emulated = [str(w.message) for w in caught if "no fast bfloat16" in str(w.message)]
    if warns is None:
        assert emulated == []
    else:
        assert len(emulated) == 1 and warns in emulated[0]
        assert emulated[0].startswith("--dtype bfloat16 and --bf16 true")


def test_the_bf16_benchmark_times_training_steps_after_an_untimed_warm_up(tiny_policy, smol_tokenizer, monkeypatch):
    """``benchmarks/bf16_cpu.py`` timed the first training step, one-off set-up included (the AVX2 figure of record
    is ``--steps 1``): one forward+backward now runs before the clock starts, and each timed step is one pass."""
    from types import SimpleNamespace

    import torch

    from benchmarks import bf16_cpu

    model = tiny_policy(0)
    events = []  # training passes (with gradients; sampling runs without) and clock reads, in order
    model.register_forward_pre_hook(lambda module, args: events.append("step") if torch.is_grad_enabled() else None)
    clock = iter(range(100))
    monkeypatch.setattr(bf16_cpu, "time", SimpleNamespace(perf_counter=lambda: events.append("clock") or next(clock)))
    monkeypatch.setattr(bf16_cpu, "load_policy", lambda **kwargs: (model, smol_tokenizer))
    result = bf16_cpu._time("float32", batch=2, new_tokens=2, steps=2)
    assert events == ["clock", "clock", "step", "clock", "step", "step", "clock"]  # sampling, warm-up, 2 timed steps
    assert result == {"sample_s": 1, "train_s_per_step": 0.5}

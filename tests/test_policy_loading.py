"""Loading a policy: a base model, a fine-tuned folder, or a LoRA adapter merged onto its base."""


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

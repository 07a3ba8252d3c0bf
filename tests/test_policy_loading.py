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

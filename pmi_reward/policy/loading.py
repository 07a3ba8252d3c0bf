"""Loading a chat policy: a shipped name, a hub id, a saved model directory, or a LoRA adapter directory.

The one place that readies a causal LM for generation: the tokenizer pads on the left and has a pad token,
and the model's generation config knows it. Adapters (what ``pmi-reward grpo/rloo/ppo`` save with
``--use_peft``) are merged into their base model, so every policy is trained or evaluated as a plain
causal LM with the same sampling code.
"""

from __future__ import annotations

import json
from pathlib import Path

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ..scoring.models import load_causal_lm, load_tokenizer

__all__ = ["load_policy", "DEFAULT_POLICY"]

DEFAULT_POLICY = "smollm2-135m-instruct"


def load_policy(
    name_or_path: str | None = None, dtype: str | None = "float32", attn_implementation: str | None = None
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """(model, tokenizer with left padding) for a policy name or directory (default: SmolLM2-135M-Instruct).

    ``dtype`` None or ``"auto"`` loads float32.
    """
    name_or_path = name_or_path or DEFAULT_POLICY
    dtype = "float32" if dtype in (None, "auto") else dtype
    path = Path(name_or_path)
    adapter = path / "adapter_config.json"
    source = name_or_path
    if adapter.is_file():
        from peft import PeftModel

        source = json.loads(adapter.read_text())["base_model_name_or_path"]
        base = load_causal_lm(source, dtype, attn_implementation=attn_implementation)
        model = PeftModel.from_pretrained(base, str(path)).merge_and_unload()
    else:
        model = load_causal_lm(name_or_path, dtype, attn_implementation=attn_implementation)
    has_tokenizer = (path / "tokenizer_config.json").is_file()
    tokenizer = load_tokenizer(str(path) if has_tokenizer else source, padding_side="left")
    if model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer

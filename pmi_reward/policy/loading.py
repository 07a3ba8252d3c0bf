"""Loading a policy to evaluate: a shipped name, a hub id, a saved model directory, or a LoRA adapter directory.

Adapters (what ``grpo``/``rloo``/``ppo`` save with ``--use_peft``) are merged into their base model, so
every policy is evaluated as a plain causal LM with the same sampling code.
"""

from __future__ import annotations

import json
from pathlib import Path

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ..scoring.models import load_causal_lm, load_tokenizer

__all__ = ["load_policy_dir"]


def load_policy_dir(name_or_path: str) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """(model in eval mode, tokenizer with left padding) for a policy name or directory."""
    path = Path(name_or_path)
    adapter = path / "adapter_config.json"
    source = name_or_path
    if adapter.is_file():
        from peft import PeftModel

        source = json.loads(adapter.read_text())["base_model_name_or_path"]
        model = PeftModel.from_pretrained(load_causal_lm(source), str(path)).merge_and_unload()
    else:
        model = load_causal_lm(name_or_path)  # a shipped name, a hub id or a saved directory
    has_tokenizer = (path / "tokenizer_config.json").is_file()
    tokenizer = load_tokenizer(str(path) if has_tokenizer else source, padding_side="left")
    if model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model.eval(), tokenizer

"""Loading a chat policy: a shipped name, a hub id, a saved model directory, or a LoRA adapter directory.

The one place that readies a causal LM for generation: the tokenizer pads on the left and has a pad token,
and the model's generation config knows it. Adapters (what ``pmi-reward grpo/rloo/ppo`` save with
``--use_peft``) are merged into their base model, so every policy is trained or evaluated as a plain
causal LM with the same sampling code. The policy lands on the GPU where there is one (as the scorers do), so that
sampling, KL and the LM judges run there; ``check_bf16`` warns when bfloat16 is asked for where it is only emulated.
"""

from __future__ import annotations

import json
import time
import warnings
from pathlib import Path

from safetensors import SafetensorError
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ..scoring.encoder import default_device
from ..scoring.models import (
    check_not_scorer,
    damaged_weights_error,
    load_causal_lm,
    load_tokenizer,
    native_bf16,
    shipped_copy,
    shipped_name,
)

__all__ = ["load_policy", "check_bf16", "DEFAULT_POLICY"]

DEFAULT_POLICY = "smollm2-135m-instruct"
# what a folder's tokenizer is read from (``save_pretrained`` writes the first two, older formats the others)
TOKENIZER_FILES = ("tokenizer_config.json", "tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt")


_MODEL_CONFIGS = ("config.json", "adapter_config.json")  # what makes a folder a policy load_policy reads


def _step(name: str) -> tuple[int, str]:
    """A ``checkpoint-N`` folder's sort key: by N (checkpoint-10 after checkpoint-9), then by name."""
    tail = name.rpartition("-")[2]
    return (int(tail) if tail.isdigit() else -1, name)


def _has_tokenizer(folder: Path) -> bool:
    """Whether ``folder`` holds a tokenizer's files; without them transformers fails on the folder with a hint to
    install sentencepiece or tiktoken, which names neither the folder nor what it lacks."""
    return any((folder / name).is_file() for name in TOKENIZER_FILES)


# full weights as save_pretrained writes them (one file, shards with their index, or torch's older format)
WEIGHT_GLOBS = ("model.safetensors", "model-*.safetensors", "model.safetensors.index.json", "pytorch_model*.bin")


def _check_one_kind(path: Path) -> None:
    """Refuse a folder holding both a LoRA adapter and full weights: two runs wrote into it (a LoRA run, then a
    full fine-tune, or the other way round), each replacing only its own files, and the adapter was read first, so
    the newer full weights were never loaded. Which is newer is named, so the user knows which to remove."""
    adapter = sorted(p for p in path.glob("adapter_model*") if p.is_file()) or [path / "adapter_config.json"]
    weights = sorted({p for pattern in WEIGHT_GLOBS for p in path.glob(pattern) if p.is_file()})
    if not weights or not (path / "config.json").is_file():
        return

    def stamp(files: list[Path]) -> tuple[float, str]:
        newest = max(f.stat().st_mtime for f in files)
        return newest, time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(newest))

    (a_time, a_text), (w_time, w_text) = stamp(adapter), stamp(weights)
    newer = "the full weights" if w_time > a_time else "the adapter" if a_time > w_time else "neither"
    raise ValueError(
        f"{path}: holds both a LoRA adapter ({adapter[0].name}, {a_text}) and full weights ({weights[0].name} with "
        f"config.json, {w_text}); two runs wrote here, {newer} newer: remove the other run's files, or give each run "
        "its own --output_dir"
    )


def _adapter_base(adapter: Path) -> str:
    """The base model an adapter's ``adapter_config.json`` records (``base_model_name_or_path``), refused by name
    where the file is no JSON object or lacks it (a raw KeyError or JSON error named neither the file nor the fix)."""
    try:
        config = json.loads(adapter.read_text(encoding="utf-8"))
    except ValueError as err:  # not JSON (cut short), not UTF-8
        raise ValueError(f"{adapter}: not a readable adapter config ({err}); save the adapter again") from None
    source = config.get("base_model_name_or_path") if isinstance(config, dict) else None
    if not isinstance(source, str) or not source.strip():
        raise ValueError(
            f"{adapter}: no base_model_name_or_path (the model the adapter was trained on, which it is merged "
            'onto); add it, e.g. "base_model_name_or_path": "smollm2-135m-instruct"'
        )
    return source


def load_policy(
    name_or_path: str | None = None,
    dtype: str | None = "float32",
    attn_implementation: str | None = None,
    device: str | None = None,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """(model, tokenizer with left padding) for a policy name or directory (default: SmolLM2-135M-Instruct), on
    ``device`` (default: the GPU where there is one, else the CPU).

    ``dtype`` None or ``"auto"`` loads float32. A merged adapter is named by its own folder (absolute), so that an
    adapter trained on it records it as its base, not the first adapter's base (which dropped the first stage); a
    local folder is named by its absolute path (a relative one, recorded by an adapter, was read against another
    working directory); a shipped or Hub name keeps the name transformers loads it by (TRL builds reference models
    from it). An adapter whose
    recorded base is another machine's converted copy of a shipped model loads on this machine's. A pmi-reward
    scorer folder is refused as one (``check_not_scorer``), before the tokenizer check it would fail. A damaged
    weights file (the model's or the adapter's, cut short by a run killed while saving) raises
    ``DamagedWeightsError``, an ``OSError`` naming it.
    """
    name_or_path = name_or_path or DEFAULT_POLICY
    dtype = "float32" if dtype in (None, "auto") else dtype
    path = Path(name_or_path)
    adapter = path / "adapter_config.json"
    tokenizer = None
    if adapter.is_file():
        from peft import PeftModel

        _check_one_kind(path)
        source = _adapter_base(adapter)
        if not Path(source).exists() and (copy := shipped_copy(source)) is not None:
            source = copy  # a cache path of a shipped model, from a machine with another cache
        base, tokenizer = load_policy(source, dtype, attn_implementation, device="cpu")  # its base may be an adapter
        try:
            model = PeftModel.from_pretrained(base, str(path)).merge_and_unload()
        except SafetensorError as err:  # adapter_model.safetensors cut short (a run killed while saving it)
            raise damaged_weights_error(path, err) from err
        model.name_or_path = model.config._name_or_path = str(path.resolve())
    else:
        if shipped_name(name_or_path) is None:  # a scorer lacks a tokenizer: say what it is, not what it lacks
            check_not_scorer(name_or_path, "a chat model (a policy)", encoder_hint=False)
        if path.is_dir() and shipped_name(name_or_path) is None and not (path / "config.json").is_file():
            checkpoints = sorted(  # a LoRA run's checkpoints hold its adapter, a full run's its config
                (p.name for p in path.glob("checkpoint-*") if any((p / f).is_file() for f in _MODEL_CONFIGS)),
                key=_step,
            )
            hint = f"; its checkpoints: {', '.join(checkpoints)} (pass one of them)" if checkpoints else ""
            raise FileNotFoundError(f"{path}: no model in this policy folder (no config.json){hint}")
        if path.is_dir() and shipped_name(name_or_path) is None and not _has_tokenizer(path):
            raise FileNotFoundError(
                f"{path}: no tokenizer files in this policy folder (none of {', '.join(TOKENIZER_FILES)}): save "
                f"the tokenizer beside the model, tokenizer.save_pretrained({str(path)!r})"
            )
        model = load_causal_lm(name_or_path, dtype, attn_implementation=attn_implementation)
        # an adapter trained on it records this name as its base: absolute, not the cwd's (a shipped name loads the
        # shipped model even beside a folder of that name, and keeps its name)
        if path.is_dir() and shipped_name(name_or_path) is None:
            model.name_or_path = model.config._name_or_path = str(path.resolve())
    if (path / "tokenizer_config.json").is_file():  # its own, else its base's (an adapter) or its name's
        tokenizer = load_tokenizer(str(path), padding_side="left")
    elif tokenizer is None:
        tokenizer = load_tokenizer(name_or_path, padding_side="left")
    if model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model.to(default_device(device)), tokenizer


def check_bf16(dtype: str | None, autocast: bool = False, device: str | None = None) -> None:
    """Warn when bfloat16 weights or autocast are asked for on a device where bfloat16 is slower than float32
    (``native_bf16`` False): a CPU without AVX512-BF16 or AMX emulates it, training ~25x and sampling ~3x slower
    (``benchmarks/bf16_cpu.py``); an Intel Xeon with AVX512-BF16 and no AMX trained 1.5x slower. A CPU-seconds budget
    buys a fraction of the steps. ``device``: the one the policy runs on (``load_policy``'s
    default where None): a ``--use_cpu`` run on a machine with a GPU is judged by its CPU. Devices other than a CPU or
    a CUDA GPU are not judged."""
    if dtype != "bfloat16" and not autocast:
        return
    on = default_device(device)
    if on.type not in ("cpu", "cuda") or native_bf16(on):
        return
    asked = " and ".join(f for f, on in (("--dtype bfloat16", dtype == "bfloat16"), ("--bf16 true", autocast)) if on)
    lacks = " (it takes AMX, or AVX512-BF16 on a non-Intel CPU)" if on.type == "cpu" else ""
    warnings.warn(
        f"{asked}: this {on.type} has no fast bfloat16{lacks}, torch runs it slower than float32 "
        "(benchmarks/bf16_cpu.py); use --dtype float32 --bf16 false here",
        stacklevel=2,
    )

"""Per-round training checkpoints, so that a killed ``train_head`` run resumes where it stopped.

One safetensors file holds everything a round leaves behind: the head, the best head so far, AdamW's
moments, the torch RNG, and (as JSON metadata) the numpy RNG, the history and the run's fingerprint. It
is replaced atomically after every round, so a run killed at any moment leaves the previous round's
checkpoint intact, and a resumed run repeats the uninterrupted run exactly. No pickle anywhere.

The fingerprint (``fingerprint``) names everything that determines a run's result, field by field: the pair
texts of each split (not their indices), fixed negatives, the features (encoder spec, pooling, template, input
mode), the head, the objective and optimiser settings, the negatives' mix and the seed. A checkpoint whose
fingerprint differs is refused with the fields that differ, so that no run resumes another's state.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

from ..data.records import atomic_write

__all__ = ["CHECKPOINT_NAME", "RoundState", "digest", "run_fingerprint", "save_round", "load_round"]

CHECKPOINT_NAME = "train_state.safetensors"
# the temporary files ``atomic_write`` leaves beside the checkpoint when a SIGKILL (or a SIGTERM outside the CLI)
# ends a run in the middle of a save: as large as the checkpoint (four times the head's or encoder's weights)
_STALE_TEMPORARY = re.compile(rf"\.{re.escape(CHECKPOINT_NAME)}\.[0-9a-f]+\.tmp")
Fingerprint = dict[str, Any]


def digest(*parts: Any) -> str:
    """A short hash of arrays, lists of strings (each length-prefixed, so that no two lists collide) and scalars."""
    h = hashlib.sha256()
    for part in parts:
        if isinstance(part, (np.ndarray, torch.Tensor)):
            array = np.ascontiguousarray(part.detach().cpu().numpy() if isinstance(part, torch.Tensor) else part)
            h.update(f"array {array.dtype} {array.shape}".encode())
            h.update(array.tobytes())
        elif isinstance(part, (list, tuple)):
            h.update(f"list {len(part)}".encode())
            for item in part:
                data = str(item).encode("utf-8", "surrogatepass")
                h.update(len(data).to_bytes(8, "little") + data)
        else:
            h.update(f"value {part!r}".encode())
    return "sha256:" + h.hexdigest()[:24]


def _flatten(prefix: str, value: Any) -> Fingerprint:
    if isinstance(value, Mapping):
        return {k: v for key, item in value.items() for k, v in _flatten(f"{prefix}.{key}", item).items()}
    if isinstance(value, (np.ndarray, torch.Tensor)):
        return {prefix: digest(value)}
    return {prefix: value if value is None or isinstance(value, (bool, int, float, str)) else json.dumps(value)}


def run_fingerprint(**parts: Any) -> Fingerprint:
    """A run's fingerprint: one entry per setting (nested settings as ``name.field``; arrays as their digest)."""
    return {k: v for name, value in parts.items() for k, v in _flatten(name, value).items()}


def _differences(saved: Any, current: Fingerprint, defaults: Fingerprint | None = None) -> list[str]:
    """What differs between a checkpoint's fingerprint and this run's; a setting the checkpoint does not hold (an
    option added to pmi-reward after it was written) is no difference where this run leaves it at its default."""
    if not isinstance(saved, dict):
        return ["the fingerprint's format (written by an older pmi-reward)"]
    defaults = defaults or {}
    out = []
    for key in sorted(set(saved) | set(current)):
        if key not in saved and key in current and key in defaults and current[key] == defaults[key]:
            continue
        old, new = saved.get(key, "<absent>"), current.get(key, "<absent>")
        if old != new:
            hashed = isinstance(new, str) and new.startswith("sha256:")
            out.append(
                f"{key} (other texts or values)" if hashed else f"{key} (checkpoint: {old!r}, this run: {new!r})"
            )
    return out


@dataclass
class RoundState:
    """What ``load_round`` hands back besides the head, optimizer and RNGs it restores in place."""

    epoch: int  # the last finished round
    best: tuple[float, int, dict]  # (best validation AUC, its round, the head's state then)
    history: list[dict]
    # the run's wall-clock seconds when that round ended (its history row's), so that a resumed run's clock goes on
    # from there: every checkpoint holds it, older ones too
    seconds: float = 0.0


def _optimizer_tensors(optim: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict]:
    state = optim.state_dict()
    tensors, scalars = {}, {}
    for idx, entries in state["state"].items():
        for key, value in entries.items():
            if torch.is_tensor(value):
                tensors[f"optim.{idx}.{key}"] = value.detach().clone().contiguous()
            else:
                scalars[f"{idx}.{key}"] = value
    return tensors, {"param_groups": state["param_groups"], "scalars": scalars}


def save_round(
    directory: str | Path,
    fingerprint: Fingerprint,
    epoch: int,
    head: torch.nn.Module,
    optim: torch.optim.Optimizer,
    best: tuple[float, int, dict],
    history: list[dict],
    rng: np.random.Generator,
) -> Path:
    """Write the state after round ``epoch`` (atomically) and return the file's path. Temporary files that an
    earlier save, killed midway, left in ``directory`` are removed first: one run owns its checkpoint folder, and
    nothing else would ever remove them."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    _sweep_stale_temporaries(directory)
    tensors = {f"head.{k}": v.detach().clone().contiguous() for k, v in head.state_dict().items()}
    tensors.update({f"best.{k}": v.detach().clone().contiguous() for k, v in best[2].items()})
    optim_tensors, optim_meta = _optimizer_tensors(optim)
    tensors.update(optim_tensors)
    tensors["torch_rng"] = torch.get_rng_state()
    if torch.cuda.is_initialized():  # a GPU's dropout (an encoder fine-tuned there) draws from its own generators
        tensors.update({f"cuda_rng.{i}": state for i, state in enumerate(torch.cuda.get_rng_state_all())})
    meta = {
        "fingerprint": fingerprint,
        "epoch": epoch,
        "best_auc": best[0],
        "best_epoch": best[1],
        "history": history,
        "numpy_rng": rng.bit_generator.state,
        "optimizer": optim_meta,
    }
    path = directory / CHECKPOINT_NAME
    atomic_write(path, lambda tmp: save_file(tensors, tmp, metadata={"state": json.dumps(meta)}))
    return path


def _sweep_stale_temporaries(directory: Path) -> None:
    """Remove the checkpoint's hidden temporary files (``.train_state.safetensors.<hex>.tmp``) from ``directory``."""
    for path in directory.iterdir():
        if _STALE_TEMPORARY.fullmatch(path.name) and path.is_file():
            path.unlink(missing_ok=True)


def load_round(
    directory: str | Path,
    fingerprint: Fingerprint,
    head: torch.nn.Module,
    optim: torch.optim.Optimizer,
    rng: np.random.Generator,
    defaults: Fingerprint | None = None,
) -> RoundState | None:
    """Restore head, optimizer, torch (the CPU's, and each GPU's where the run used them) and numpy RNGs from
    ``directory``'s checkpoint; return the rest (epoch, best, history), or None when there is no checkpoint. A
    checkpoint of a different run is refused; ``defaults`` (the fingerprint of default settings) lets a checkpoint
    written before an option existed resume a run that leaves that option at its default."""
    path = Path(directory) / CHECKPOINT_NAME
    if not path.is_file():
        return None
    try:
        with safe_open(str(path), "pt") as f:
            meta = json.loads((f.metadata() or {})["state"])
        tensors = load_file(path)
    except (SafetensorError, OSError, KeyError, ValueError) as err:
        raise ValueError(f"{path}: corrupted training checkpoint ({err}); delete it to start over") from None
    differ = _differences(meta.get("fingerprint"), fingerprint, defaults)
    if differ:
        shown = "; ".join(differ[:6]) + (f"; and {len(differ) - 6} more" if len(differ) > 6 else "")
        # a fine-tune with a head warm-up named the warmed-up head as its start until 2026-11-28 (now the head the
        # warm-up starts from, which a resume skips): such a checkpoint differs here with the same settings
        old = any(d.startswith("start_head") for d in differ)
        raise ValueError(
            f"{path}: written by a run with other data or settings ({shown}); resume with the same settings, "
            "or delete it or choose another checkpoint_dir"
            + (" (a fine-tune with a head warm-up checkpointed before 2026-11-28 cannot be resumed)" if old else "")
        )
    try:
        head.load_state_dict({k[5:]: v for k, v in tensors.items() if k.startswith("head.")})
    except RuntimeError as err:  # other trained parameters (LoRA adapters on other modules, as before 2026-11-28)
        first = str(err).strip().splitlines()[-1].strip()
        raise ValueError(
            f"{path}: written by a run that trained other parameters ({first[:200]}); resume with the same "
            "settings, or delete it or choose another checkpoint_dir"
        ) from None
    best_state = {k[5:]: v for k, v in tensors.items() if k.startswith("best.")}
    optim_state: dict[str, Any] = {"state": {}, "param_groups": meta["optimizer"]["param_groups"]}
    for key, value in tensors.items():
        if key.startswith("optim."):
            _, idx, name = key.split(".", 2)
            optim_state["state"].setdefault(int(idx), {})[name] = value
    for key, value in meta["optimizer"]["scalars"].items():
        idx, name = key.split(".", 1)
        optim_state["state"].setdefault(int(idx), {})[name] = value
    optim.load_state_dict(optim_state)
    torch.set_rng_state(tensors["torch_rng"])
    cuda = [tensors[f"cuda_rng.{i}"] for i in range(sum(k.startswith("cuda_rng.") for k in tensors))]
    if cuda and torch.cuda.is_available() and torch.cuda.device_count() == len(cuda):
        torch.cuda.set_rng_state_all(cuda)
    rng.bit_generator.state = meta["numpy_rng"]
    history = meta["history"]
    seconds = float((history[-1] if history else {}).get("seconds") or 0.0)
    return RoundState(meta["epoch"], (meta["best_auc"], meta["best_epoch"], best_state), history, seconds)

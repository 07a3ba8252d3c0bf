"""``--device`` for the commands that load a scorer (``score``, ``rerank``, ``evaluate``, ``serve``): one check, so
that a device this machine lacks is refused alike by each, in one line and before anything loads, and one way of
writing its help."""

from __future__ import annotations


def device_help(runs: str = "the scorer runs", onnx: str | None = "the CPU") -> str:
    """The ``--help`` line of a command's ``--device``: what ``runs`` there, and where ``--backend onnx`` puts the
    scorer when no device is named (None: a command without ``--backend``). Without ``--device`` a GPU is taken where
    there is one: on a shared node whose GPU is full or another job's the command failed there, with no way to stay
    on the CPU but hiding the GPU (``CUDA_VISIBLE_DEVICES=``)."""
    default = "cuda if available, else the CPU" + (f"; --backend onnx: {onnx}" if onnx else "")
    stay = "--device cpu stays off a GPU that is full or another job's"
    return f"cpu | cuda | cuda:1 | mps ...: where {runs} (default: {default}); {stay}"


def check_device(device: str | None) -> None:
    """``--device`` names a device of this machine (a CUDA index it has), checked before the scorer loads: ``gpu``,
    or ``cuda`` where there is none, was a traceback after loading."""
    from ..scoring.encoder import missing_device

    reason = missing_device(device) if device is not None else None
    if reason:
        raise ValueError(f"--device {device}: {reason}")

"""``pmi-reward serve``: a saved scorer behind HTTP (OpenRLHF ``/get_reward``, ``/score``, ``/rerank``, ``/health``)."""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass, field, replace

from ..configs import parse_args
from ..rewards.options import RewardOptions
from ..rewards.remote import api_key_from_env
from ..scoring.encoder import EncoderRuntime
from ..scoring.scorer import DEFAULT_SCORER, PMIScorer, ScorerLoadError
from ..serving.endpoints import check_options
from ..serving.server import ServerConfig, serve


@dataclass
class ServeArguments:
    scorer: str = field(
        default=DEFAULT_SCORER,
        metadata={
            "help": "a directory written by `pmi-reward train`, or a Hub repo id org/name (default: `make scorer`'s)"
        },
    )
    device: str | None = field(default=None, metadata={"help": "cpu | cuda | cuda:1 ... (default: cuda if available)"})
    cache_dir: str | None = field(default=None, metadata={"help": "embedding cache directory (default: none)"})
    encode_batch_size: int | None = field(default=None, metadata={"help": "override the scorer's encoder batch"})
    log_level: str = field(
        default="info", metadata={"help": "debug | info (with the access log: a line per request) | warning"}
    )


def check_device(device: str | None) -> None:
    """``--device`` names a device of this machine (a CUDA index it has), checked before the scorer loads: ``gpu``,
    or ``cuda`` where there is none, was a traceback after loading."""
    if device is None:
        return
    import torch

    try:
        parsed = torch.device(device)
    except (RuntimeError, ValueError):
        raise ValueError(f"--device {device}: not a device; expected cpu, cuda, cuda:N or mps") from None
    if parsed.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if not count:
            raise ValueError(f"--device {device}: this machine has no CUDA device (torch sees none); use --device cpu")
        if parsed.index is not None and parsed.index >= count:
            raise ValueError(f"--device {device}: this machine has {count} CUDA device(s), cuda:0 to cuda:{count - 1}")
    elif parsed.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"--device {device}: MPS is not available on this machine; use --device cpu")
    elif parsed.type not in ("cpu", "mps") and not getattr(getattr(torch, parsed.type, None), "is_available", bool)():
        raise ValueError(f"--device {device}: not available on this machine; expected cpu, cuda, cuda:N or mps")


def main(argv: list[str] | None = None) -> int:
    args, config, options, runtime = parse_args(
        (ServeArguments, ServerConfig, RewardOptions, EncoderRuntime), argv, prog="pmi-reward serve"
    )
    config = replace(config, api_key=api_key_from_env(config.api_key))
    try:
        check_options(options)  # before the scorer loads: a mistake in the command fails at once
        check_device(args.device)
    except ValueError as err:
        print(f"pmi-reward serve: {err}", file=sys.stderr)
        return 2
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(message)s")
    try:
        scorer = PMIScorer.from_pretrained(
            args.scorer, device=args.device, cache_dir=args.cache_dir, **runtime.as_kwargs()
        )
    except ScorerLoadError as err:
        print(f"pmi-reward serve: {err}", file=sys.stderr)
        return 2
    scorer.encoder.set_batch_size(args.encode_batch_size)
    serve(scorer, config, options)
    return 0

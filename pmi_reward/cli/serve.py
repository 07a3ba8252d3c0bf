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
from .device import check_device, device_help
from .processes import single_process


@dataclass
class ServeArguments:
    scorer: str = field(
        default=DEFAULT_SCORER,
        metadata={
            "help": "a directory written by `pmi-reward train`, or a Hub repo id org/name; by default the recommended "
            "scorer, where `pmi-reward train --config scorer/recommended` (or `make scorer` in a checkout) saves it"
        },
    )
    device: str | None = field(default=None, metadata={"help": device_help()})
    cache_dir: str | None = field(default=None, metadata={"help": "embedding cache directory (default: none)"})
    encode_batch_size: int | None = field(default=None, metadata={"help": "override the scorer's encoder batch"})
    log_level: str = field(
        default="info", metadata={"help": "debug | info (with the access log: a line per request) | warning"}
    )


# serve's own --help lines for the RewardOptions fields it takes otherwise than the trainers: the shared help offered
# an empty_score of None and a batch size, both refused here (check_options, check_batch_size)
HELP_TEXTS = {
    "empty_score": "the reward /get_reward gives an empty or unreadable completion: a number (None is refused: "
    "OpenRLHF cannot take a null reward; RemotePMIReward applies its own empty_score, None included, on the "
    "trainer's side)",
    "batch_size": "not used by the server, which merges requests into encoder batches by --max_batch_pairs and "
    "--max_batch_chars: a value other than the default is refused",
}


def check_batch_size(options: RewardOptions) -> None:
    """``--batch_size`` (pairs per scorer call, a client's setting) does nothing in the server, which merges
    requests into encoder batches of ``--max_batch_pairs``: refused rather than silently ignored."""
    if options.batch_size != RewardOptions.batch_size:
        raise ValueError(
            f"--batch_size {options.batch_size} has no effect on the server: it batches concurrent requests by "
            "--max_batch_pairs (pairs per encoder call) and --max_batch_chars; set those instead"
        )


def main(argv: list[str] | None = None) -> int:
    single_process("serve")  # before anything loads: it has no multi-process path
    args, config, options, runtime = parse_args(
        (ServeArguments, ServerConfig, RewardOptions, EncoderRuntime),
        argv,
        prog="pmi-reward serve",
        help_texts=HELP_TEXTS,
    )
    try:
        config = replace(config, api_key=api_key_from_env(config.api_key))  # a key from a file: its newline goes
        check_options(options)  # before the scorer loads: a mistake in the command fails at once
        check_batch_size(options)
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

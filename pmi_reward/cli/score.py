"""``pmi-reward score``: rows with context and response in, the same rows plus a ``pmi`` column out.

Rows are read by the reward's own path (``rewards.path.RewardPath``, as ``rerank`` reads them through ``PMIReward``):
contexts cut to the newest turns and without reasoning, replies without their ``<think>`` block, so that a row's
score is its raw PMI as ``PMIReward`` reads it. A row the reward cannot score (a blank context, an empty or invisible
reply: ``"\u200b"``, unfinished reasoning) gets an empty cell (null), never a score of nothing. The added column must
be new.

The embedding cache is ``train``'s and ``evaluate``'s (``$PMI_REWARD_CACHE/embeddings``) unless ``--cache_dir`` names
another folder or ``--no_cache`` turns it off: ``EmbeddingCacheArguments``, which ``rerank`` takes too.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..configs import parse_args
from ..data.records import DataError, check_output, read_records, require_text, write_records
from ..rewards.options import RewardOptions
from ..rewards.path import RewardPath
from ..scoring.encoder import LOCAL_ENCODER, EncoderRuntime
from ..scoring.models import CACHE_DIR_HELP, NO_CACHE_HELP, embedding_cache_dir
from ..scoring.scorer import CONFIG_NAME, DEFAULT_SCORER, METADATA_NAME, PMIScorer
from .device import check_device, device_help
from .processes import single_process


@dataclass
class EmbeddingCacheArguments:
    """Where ``score`` and ``rerank`` keep the embeddings they compute: ``train``'s options (``TrainData.cache_dir``,
    ``no_cache``) by the same names, help and default, so that a folder given to one command is given the same way
    to the others, and texts embedded by one are read back by the next."""

    cache_dir: str | None = field(default=None, metadata={"help": CACHE_DIR_HELP})
    no_cache: bool = field(default=False, metadata={"help": NO_CACHE_HELP})

    def __post_init__(self) -> None:
        if self.no_cache and self.cache_dir:  # one of them would be dropped without a word
            raise ValueError(f"give --cache_dir ({self.cache_dir}) or --no_cache, not both")

    def directory(self) -> Path | None:
        """The cache's folder (None: no cache)."""
        return embedding_cache_dir(self.cache_dir, self.no_cache)


@dataclass
class ScoreArguments:
    input: str = field(
        metadata={
            "help": "CSV/TSV/JSONL/JSON file with context and response columns (a context as text, one turn per "
            "line, oldest first; chat messages: `rerank --input`)"
        }
    )
    output: str = field(metadata={"help": "where to write the rows with the added column (.csv/.tsv/.jsonl/.json)"})
    scorer: str = field(
        default=DEFAULT_SCORER,
        metadata={
            "help": "a directory written by `pmi-reward train`, or a Hub repo id org/name; by default the recommended "
            "scorer, where `pmi-reward train --config scorer/recommended` (or `make scorer` in a checkout) saves it"
        },
    )
    overwrite: bool = field(default=False, metadata={"help": "replace --output if it exists"})
    context_column: str = field(default="context", metadata={"help": "--input's context column"})
    response_column: str = field(default="response", metadata={"help": "--input's response column"})
    score_column: str = field(
        default="pmi", metadata={"help": "the column added for the scores (one --input has already is refused)"}
    )
    context_turns: int | None = field(
        default=None,
        metadata={
            "help": "newest context lines (turns) scored: default as the scorer was trained (its config's "
            "context_turns), as PMIReward and the server read them; 0 scores every line"
        },
    )
    device: str | None = field(default=None, metadata={"help": device_help()})
    encode_batch_size: int | None = field(default=None, metadata={"help": "override the scorer's encoder batch"})
    progress: bool = field(default=True, metadata={"help": "show a progress bar"})

    def __post_init__(self) -> None:
        if self.context_turns is not None and self.context_turns < 0:
            raise ValueError(f"context_turns must be >= 0 (0: every line), got {self.context_turns}")


def scorer_files(scorer: str) -> list[Path]:
    """The files of a local scorer folder that loading it reads and that an output could name (its config, its
    metadata, a fine-tuned encoder's folder): inputs that ``check_output`` refuses to write over, as the input file
    (one absent, or a Hub id, is skipped there)."""
    return [Path(scorer) / name for name in (CONFIG_NAME, METADATA_NAME, LOCAL_ENCODER)]


def main(argv: list[str] | None = None) -> int:
    single_process("score")  # before anything loads: it has no multi-process path
    args, cache, runtime = parse_args(
        (ScoreArguments, EmbeddingCacheArguments, EncoderRuntime), argv, prog="pmi-reward score"
    )
    check_device(args.device)  # a device this machine lacks: one line now, not a traceback once the scorer loaded
    check_output(args.output, args.overwrite, inputs=[args.input, *scorer_files(args.scorer)])
    records = read_records(args.input)
    contexts = require_text(records, args.input, args.context_column, allow_empty=True)
    responses = require_text(records, args.input, args.response_column, allow_empty=True)
    if any(args.score_column in record for record in records):
        raise DataError(
            f"{args.input}: it has a column {args.score_column!r} already, which the scores would overwrite; name "
            "another with --score_column"
        )
    scorer = PMIScorer.from_pretrained(
        args.scorer, device=args.device, cache_dir=cache.directory(), **runtime.as_kwargs()
    )
    scorer.encoder.set_batch_size(args.encode_batch_size)
    turns = scorer.context_turns if args.context_turns is None else args.context_turns
    # PMIReward's reading with no shaping (rerank's), but every line for 0: its options know no "all turns" beside
    # the scorer's own default, so the path is built here with the turns already resolved
    path = RewardPath(RewardOptions(empty_score=None, max_context_turns=turns or None))
    _, scores = path.measure(contexts, responses, lambda c, r: scorer.score(c, r, progress=args.progress))
    for record, value in zip(records, scores.tolist(), strict=True):
        record[args.score_column] = round(value, 6) if math.isfinite(value) else None
    write_records(args.output, records)
    finite = scores[np.isfinite(scores)]
    mean = float(finite.mean()) if len(finite) else None
    print(json.dumps({"rows": len(records), "output": args.output, "mean_pmi": mean}))
    return 0

"""The whole ``pmi-reward train`` run: a data source in, a saved scorer directory (with its provenance) out.

Its options are the concepts' own dataclasses: ``TrainData`` (where pairs come from and where the scorer goes),
``EncoderSpec``, ``PromptTemplate``, ``HeadConfig``, ``NegativeSpec`` and ``TrainConfig``; ``ARGUMENTS`` lists
them in the order ``train_scorer`` takes them, for ``pmi_reward.configs.parse_args``.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..data.dialogues import load_dialogues, split_dialogues
from ..data.negatives import NegativeSpec
from ..data.pairs import PairSet, load_pairs
from ..data.records import check_output_dir, json_safe, replace_directory
from ..memory import peak_rss_mib
from ..scoring.cache import EmbeddingCache
from ..scoring.encoder import EncoderSpec, TextEncoder
from ..scoring.head import HeadConfig
from ..scoring.models import CACHE_DIR_HELP, NO_CACHE_HELP, embedding_cache_dir, shipped_name
from ..scoring.templates import PromptTemplate
from .fit import check_negative_draws, evaluate_auc, fit_scorer
from .loop import TrainConfig

__all__ = ["TrainData", "ARGUMENTS", "build_pairs", "train_scorer", "peak_rss_mib"]


@dataclass
class TrainData:
    """Where pairs come from (pair files, or dialogues split by dialogue) and where the scorer is saved."""

    output_dir: str = field(default="outputs/scorer", metadata={"help": "where the scorer is saved"})
    overwrite: bool = field(default=False, metadata={"help": "replace output_dir if it holds files"})
    dialogues: str | None = field(
        default=None, metadata={"help": "chitchat | dialogue file (.jsonl/.json/.csv) | datasets folder"}
    )
    train_file: str | None = field(
        default=None,
        metadata={
            "help": "pair file with context,response[,dialog_key]; with --dialogues, its pairs join the dialogues' "
            "training pairs"
        },
    )
    val_file: str | None = field(
        default=None,
        metadata={
            "help": "pair file for model selection; with --dialogues, it replaces their validation split (whose "
            "dialogues stay out of training: --val_fraction 0 trains on them)"
        },
    )
    test_file: str | None = field(
        default=None,
        metadata={
            "help": "pair file for a held-out AUC; with --dialogues, it replaces their test split (whose dialogues "
            "stay out of training: --test_fraction 0 trains on them)"
        },
    )
    context_column: str = field(
        default="context", metadata={"help": "the pair files' context column (turns one per line, oldest first)"}
    )
    response_column: str = field(default="response", metadata={"help": "the pair files' response column"})
    key_column: str = field(
        default="dialog_key",
        metadata={
            "help": "the pair files' dialogue id column (in-dialogue negatives are drawn within a dialogue); a file "
            "without it reads each row as a dialogue of its own"
        },
    )
    skip_dialogues: int = field(
        default=0,
        metadata={
            "help": "skip the first N dialogues (e.g. to train a second scorer on dialogues disjoint from the first's)"
        },
    )
    max_dialogues: int | None = field(default=None, metadata={"help": "use the first N dialogues (after skipping)"})
    max_context_turns: int = field(
        default=3,
        metadata={
            "help": "turns of context kept before each response, in dialogues and pair files (the scorer reads "
            "contexts the same way)"
        },
    )
    max_pairs_per_dialogue: int | None = field(default=None, metadata={"help": "sample at most N pairs per dialogue"})
    val_fraction: float = field(
        default=0.1, metadata={"help": "share of the --dialogues held out for model selection (split by dialogue)"}
    )
    test_fraction: float = field(
        default=0.1, metadata={"help": "share of the --dialogues held out for the test AUC (split by dialogue)"}
    )
    split_seed: int = field(
        default=0,
        metadata={
            "help": "seed for which dialogues land in each split, and which pairs --max_pairs_per_dialogue keeps"
        },
    )
    cache_dir: str | None = field(default=None, metadata={"help": CACHE_DIR_HELP})
    no_cache: bool = field(default=False, metadata={"help": NO_CACHE_HELP})
    progress: bool = field(default=True, metadata={"help": "show progress bars"})

    def __post_init__(self) -> None:
        """Counts out of range are refused, not sliced with: a negative ``skip_dialogues`` or ``max_dialogues`` would
        take dialogues from the end, and ``max_dialogues 0`` would take them all."""
        if self.skip_dialogues < 0:
            raise ValueError(f"skip_dialogues must be >= 0, got {self.skip_dialogues}")
        counts = {"max_dialogues": self.max_dialogues, "max_pairs_per_dialogue": self.max_pairs_per_dialogue}
        for name, value in {**counts, "max_context_turns": self.max_context_turns}.items():
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")


ARGUMENTS = (TrainData, EncoderSpec, PromptTemplate, HeadConfig, NegativeSpec, TrainConfig)


def _dialogue_pairs(args: TrainData) -> tuple[list[PairSet | None], dict]:
    """The dialogues' (train, val, test) pairs, split by dialogue, and their provenance; a validation split is
    needed unless ``--val_file`` gives one."""
    dialogues = load_dialogues(args.dialogues)[args.skip_dialogues :]  # type: ignore[arg-type]
    dialogues = dialogues[: args.max_dialogues] if args.max_dialogues else dialogues
    if not dialogues:
        raise SystemExit(f"--skip_dialogues {args.skip_dialogues} leaves no dialogues in {args.dialogues}")
    splits = split_dialogues(dialogues, args.val_fraction, args.test_fraction, args.split_seed)
    made = [
        PairSet.from_dialogues(
            s, args.max_context_turns, max_pairs_per_dialogue=args.max_pairs_per_dialogue, seed=args.split_seed
        )
        if s
        else None
        for s in splits
    ]
    if made[0] is None or (made[1] is None and not args.val_file):
        raise SystemExit(f"{args.dialogues}: too few dialogues for a training and a validation split")
    source = {
        "dialogues": args.dialogues,
        "skip_dialogues": args.skip_dialogues,
        "max_dialogues": args.max_dialogues,
        "n_dialogues": [len(s) for s in splits],
        "max_context_turns": args.max_context_turns,
        "max_pairs_per_dialogue": args.max_pairs_per_dialogue,
        "val_fraction": args.val_fraction,
        "test_fraction": args.test_fraction,
        "split_seed": args.split_seed,  # which dialogues land in each split, and which pairs a capped dialogue gives
    }
    return made, source


def _file_pairs(args: TrainData) -> tuple[list[PairSet | None], dict]:
    """The pair files' (train, val, test) pairs, None for a file not named, and their provenance (a missing file
    is a DataError naming it)."""
    if not args.val_file and not args.dialogues:
        raise SystemExit("--train_file needs --val_file for model selection (or --dialogues, whose split gives one)")
    columns = (args.context_column, args.response_column, args.key_column)
    load = lambda path: load_pairs(path, *columns, max_context_turns=args.max_context_turns)  # noqa: E731
    made = [load(p) if p else None for p in (args.train_file, args.val_file, args.test_file)]
    source = {
        "train_file": args.train_file,
        "val_file": args.val_file,
        "test_file": args.test_file,
        "columns": list(columns),
        "max_context_turns": args.max_context_turns,
    }
    return made, source


def build_pairs(args: TrainData) -> tuple[PairSet, PairSet, PairSet | None, dict]:
    """(train, val, test or None, provenance) from the data arguments: dialogues split by dialogue, pair files,
    or both. With both, the training pairs are the union of the dialogues' and ``--train_file``'s; a named
    ``--val_file`` or ``--test_file`` replaces the dialogues' split of it (whose dialogues stay out of training), so
    that model selection and the held-out AUC are those of the file the user named, not of a mix of it with the
    dialogues'."""
    if not args.dialogues and not args.train_file:
        held_out = [f"--{k}" for k in ("val_file", "test_file") if getattr(args, k)]
        plural = "" if len(held_out) > 1 else "s"
        given = f" ({' and '.join(held_out)} only give{plural} held-out pairs)" if held_out else ""
        raise SystemExit(f"give --dialogues (e.g. chitchat) and/or --train_file{given}")
    # the pair files first: a missing one fails before a large dialogue source is read
    files = _file_pairs(args) if args.train_file or args.val_file or args.test_file else None
    dialogues = _dialogue_pairs(args) if args.dialogues else None
    parts = [part for part in (dialogues, files) if part is not None]
    source = {k: v for _, s in parts for k, v in s.items()}
    splits: list[PairSet | None] = []
    for i in range(3):
        named = files[0][i] if files is not None and i > 0 else None  # a named val or test file is that split
        present = [named] if named is not None else [p for p in (made[i] for made, _ in parts) if p is not None]
        splits.append(PairSet.concat(present) if len(present) > 1 else (present[0] if present else None))
    train, val, test = splits
    assert train is not None and val is not None  # each source gives both, or a val file the validation pairs
    return train, val, test, source


def _origin(data: TrainData, split: int) -> str:
    """Where split ``split`` (0 train, 1 validation, 2 test) comes from, for error messages (``build_pairs``)."""
    name = ("training", "validation", "test")[split]
    file = (data.train_file, data.val_file, data.test_file)[split]
    dialogues = data.dialogues and not (split and file)  # a named val or test file is that split by itself
    parts = [f"{data.dialogues} (its {name} dialogues)" if dialogues else None, file]
    return f"the {name} pairs of " + " and ".join(p for p in parts if p)


def _cache_dir(data: TrainData) -> str | Path | None:
    """The embedding cache's folder the run uses (None: no cache)."""
    return embedding_cache_dir(data.cache_dir, data.no_cache)


def _inputs(data: TrainData, encoder_spec: EncoderSpec, config: TrainConfig) -> dict[str, str | Path | None]:
    """What the run reads or keeps by path (option name: path), none of which may lie in the output folder that its
    save replaces whole: the pair and dialogue files, a local encoder folder, the checkpoints and the embedding cache
    (absent ones too: the run creates them there, and the save would delete them)."""
    local = shipped_name(encoder_spec.model) is None and Path(encoder_spec.model).exists()
    return {
        "--dialogues": data.dialogues if data.dialogues != "chitchat" else None,
        "--train_file": data.train_file,
        "--val_file": data.val_file,
        "--test_file": data.test_file,
        "--model": encoder_spec.model if local else None,
        "--checkpoint_dir": config.checkpoint_dir,
        "--cache_dir": _cache_dir(data),
    }


def train_scorer(
    data: TrainData,
    encoder_spec: EncoderSpec,
    template: PromptTemplate,
    head: HeadConfig,
    negatives: NegativeSpec,
    config: TrainConfig,
) -> dict:
    """Build pairs, train, report a held-out AUC, save the scorer and its history; the run's summary."""
    start = time.perf_counter()
    check_output_dir(data.output_dir, data.overwrite, inputs=_inputs(data, encoder_spec, config))
    if config.checkpoint_dir:
        check_output_dir(config.checkpoint_dir, overwrite=True, what="--checkpoint_dir", whole=False)
    train, val, test, source = build_pairs(data)
    for split, pairs in enumerate((train, val, test)):
        if pairs is not None:  # each split's negatives, checked before anything is embedded or trained
            check_negative_draws(pairs, negatives, _origin(data, split))
    cache_dir = _cache_dir(data)
    cache = None if cache_dir is None else EmbeddingCache(cache_dir)
    encoder = TextEncoder(encoder_spec, cache=cache)
    scorer, result = fit_scorer(  # in place: a fine-tune needs no second copy of the pretrained encoder here
        train,
        val,
        encoder,
        template,
        config,
        head,
        negatives,
        metadata={"data": source},
        progress=data.progress,
        in_place=True,
    )
    summary = {"train_pairs": len(train), "val_pairs": len(val), **result.summary()}
    if test is not None:
        summary["test_auc"] = evaluate_auc(scorer, test, negatives, seed=config.seed + 2, progress=data.progress)
        scorer.metadata["test_auc"] = summary["test_auc"]
    summary["wall_seconds"] = round(time.perf_counter() - start, 1)
    summary["peak_rss_mib"] = round(peak_rss_mib(), 1)
    summary["encoded_texts"] = encoder.stats.texts
    scorer.metadata["run"] = {k: summary[k] for k in ("wall_seconds", "peak_rss_mib")}

    def fill(folder: Path) -> None:
        scorer.save_pretrained(folder)
        (folder / "train_history.json").write_text(json.dumps(json_safe(result.history), indent=1, allow_nan=False))

    out = replace_directory(data.output_dir, fill)  # the old scorer or the complete new one, never a mix
    return {"saved": str(out), **summary}

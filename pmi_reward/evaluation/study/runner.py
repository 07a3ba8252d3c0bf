"""The study loop shared by the recipes: encoders x rounds x input modes x methods, on per-round negatives.

Each round draws one set of training and validation negatives (seeded by the round) that every method
and input mode of the round shares; evaluation sets keep the fixed negatives the recipe gave them.
MEEP, which reads texts rather than embeddings, runs once. Scores (not just metrics) are kept, so
recipes can compute any metric, bootstrap it, plot it, and average heads across rounds.
"""

from __future__ import annotations

import json
import time
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from ...data.negatives import NegativeSpec, sample_negatives
from ...data.pairs import PairSet
from ...data.records import atomic_write
from ...scoring.cache import EmbeddingCache
from ...scoring.encoder import EncoderSpec, TextEncoder
from ...scoring.head import HeadConfig
from ...scoring.models import CACHE_DIR_HELP, embedding_cache_dir
from ...scoring.templates import PromptTemplate
from ...training.loop import TrainConfig
from ..baselines.kde import KDEConfig
from ..baselines.meep import MEEPConfig, MEEPScorer
from .methods import EvalSet, FeatureBank, MethodScores, run_round, score_texts

__all__ = [
    "StudyArguments",
    "StudySetup",
    "ARGUMENTS",
    "run_study",
    "average_rounds",
    "save_scores",
    "load_scores",
    "merge_scores",
    "first_repeat",
]

Label = TypeVar("Label", bound=Hashable)
Source = TypeVar("Source", bound=Hashable)

ALL_METHODS = ["nwj", "mine", "infonce", "js", "chi2", "hellinger", "tv", "kde"]


def first_repeat(labelled: Iterable[tuple[Label, Source]]) -> tuple[Label, Source, Source] | None:
    """The first run label that comes from two sources, with both sources (None when each label has one source).

    Reports group runs by their label (encoder, method, input mode; ``group_runs``), so the runs of one label from
    two sources (a model listed twice, two output folders merged into one report) would pool into one row: their
    rounds counted as more rounds of one run, their round averages as rounds. ``labelled``: (label, source) pairs,
    a label repeated within one source (its rounds) being no repeat; a source is e.g. a position in a list, so that
    one model or folder named twice is two sources."""
    first: dict[Label, Source] = {}
    for label, source in labelled:
        if first.setdefault(label, source) != source:
            return label, first[label], source
    return None


@dataclass
class StudyArguments:
    """What a study compares: encoders, input modes, methods and rounds, the baselines' settings, the report.

    The rest comes from the concepts' own dataclasses: the encoder's other settings from ``EncoderSpec``, the
    head's shape from ``HeadConfig``, the training negatives from ``NegativeSpec`` and the optimisation from
    ``TrainConfig`` (whose seed seeds round 0; round r uses seed + r).
    """

    output_dir: str = field(default="outputs/study", metadata={"help": "tables, plots, scores and logs go here"})
    models: list[str] = field(default_factory=lambda: ["minilm"], metadata={"help": "encoders (short names or HF ids)"})
    dtypes: list[str] = field(default_factory=lambda: ["float32"], metadata={"help": "dtype per model (one: all)"})
    input_modes: list[str] = field(default_factory=lambda: ["pair", "prompt"])
    methods: list[str] = field(
        default_factory=lambda: list(ALL_METHODS), metadata={"help": "objectives of the registry and/or kde"}
    )
    rounds: int = field(default=5, metadata={"help": "rounds (seeds): fresh negatives and head init each"})
    kde_components: int = 128
    kde_bandwidth: str | None = field(
        default=None,
        metadata={
            "help": "a number, scott or silverman (those rules assume unit-variance components: --kde_whiten; "
            "unwhitened, scott gave en validation AUC 0.58 against 0.90 for 10, see recipes/quality); default: "
            "scott with --kde_whiten, else 10"
        },
    )
    kde_whiten: bool = False
    meep: bool = field(default=True, metadata={"help": "also score with MEEP (a chat LM's 0-100 rating)"})
    meep_model: str = "smollm2-135m-instruct"
    meep_dtype: str = "bfloat16"
    meep_samples: int = 3
    meep_max_new_tokens: int = 6
    meep_batch_size: int = 8
    n_boot: int = field(default=1000, metadata={"help": "bootstrap resamples for the 95%% intervals"})
    cache_dir: str | None = field(default=None, metadata={"help": CACHE_DIR_HELP})
    progress: bool = True

    def __post_init__(self) -> None:
        if len(self.dtypes) not in (1, len(self.models)):  # the extra ones were dropped without a word
            raise ValueError(
                f"dtypes: give one for all models or one per model ({len(self.models)}), got {self.dtypes}"
            )
        twice = first_repeat((m, i) for i, m in enumerate(self.models))
        if twice:  # runs are labelled by model: its rounds would merge (and average across dtypes)
            raise ValueError(
                f"models: {twice[0]!r} is listed twice; its runs would merge into one row (to compare one model at "
                "two dtypes, run the study once per dtype into separate output dirs)"
            )

    def kde_config(self) -> KDEConfig:
        """KDE's settings; without a bandwidth, the rule for whitened components, else the recipes' 10."""
        given = self.kde_bandwidth if self.kde_bandwidth is not None else "scott" if self.kde_whiten else "10"
        try:
            bandwidth: float | str = float(given)
        except ValueError:
            bandwidth = given
        return KDEConfig(self.kde_components, bandwidth, self.kde_whiten)

    def encoder_specs(self, base: EncoderSpec) -> list[EncoderSpec]:
        """``base`` once per model of the study, with that model's dtype."""
        dtypes = self.dtypes if len(self.dtypes) == len(self.models) else self.dtypes[:1] * len(self.models)
        return [replace(base, model=m, dtype=d) for m, d in zip(self.models, dtypes, strict=True)]


@dataclass
class StudySetup:
    """The concepts' dataclasses a study reads besides ``StudyArguments`` (defaults: their own defaults)."""

    encoder: EncoderSpec = field(default_factory=EncoderSpec)
    head: HeadConfig = field(default_factory=HeadConfig)
    negatives: NegativeSpec = field(default_factory=NegativeSpec)
    training: TrainConfig = field(default_factory=TrainConfig)


ARGUMENTS = (StudyArguments, EncoderSpec, HeadConfig, NegativeSpec, TrainConfig)


_INDEX = "index.json"  # the key of the runs' index inside a scores file (never a score's: those hold a "/")


def _log(path: Path, record: dict) -> None:
    with path.open("a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")


def run_study(
    args: StudyArguments,
    setup: StudySetup,
    template: PromptTemplate,
    train: PairSet,
    val: PairSet,
    evals: Sequence[EvalSet],
    meep_limit: dict[str, int] | None = None,
) -> list[MethodScores]:
    """All (encoder, round, input mode, method) scores on ``evals``, MEEP's, and the round averages."""
    out_dir = Path(args.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    log = out_dir / "train_log.jsonl"
    folder = embedding_cache_dir(args.cache_dir, no_cache=False)
    assert folder is not None  # a study always caches
    cache = EmbeddingCache(folder)
    runs: list[MethodScores] = []
    for enc_spec in args.encoder_specs(setup.encoder):
        encoder = TextEncoder(enc_spec, cache=cache)
        bank = FeatureBank(encoder, template, args.progress)
        for r in range(args.rounds):
            seed = setup.training.seed + r
            rng = np.random.default_rng(seed)
            train_set = EvalSet("train", train, sample_negatives(train, setup.negatives, rng))
            val_set = EvalSet("val", val, sample_negatives(val, setup.negatives, rng))
            start = time.perf_counter()
            done = run_round(
                args.methods,
                args.input_modes,
                r,
                train_set,
                val_set,
                evals,
                bank,
                replace(setup.training, seed=seed),
                setup.head,
                args.kde_config(),
                progress=False,
            )
            for d in done:
                _log(log, {"encoder": d.encoder, "input_mode": d.input_mode, "method": d.method, "round": r, **d.info})
            print(
                f"[study] {enc_spec.model} round {r + 1}/{args.rounds}: {len(done)} fits in "
                f"{time.perf_counter() - start:.0f}s",
                flush=True,
            )
            runs += done
    runs += average_rounds(runs)
    if args.meep:
        runs.append(_meep(args, setup.training.seed, evals, meep_limit, out_dir / "meep_answers.jsonl"))
    return runs


def _meep(
    args: StudyArguments, seed: int, evals: Sequence[EvalSet], limit: dict[str, int] | None, cache_file: Path
) -> MethodScores:
    """MEEP's scores (a chat LM's 0-100 rating of each text pair; it reads texts, so it runs once)."""
    config = MEEPConfig(
        args.meep_model,
        args.meep_dtype,
        args.meep_samples,
        max_new_tokens=args.meep_max_new_tokens,
        batch_size=args.meep_batch_size,
        seed=seed,
    )
    meep = MEEPScorer(config, cache_file=cache_file)
    result = score_texts(args.meep_model, "meep", lambda c, r: meep.score(c, r, args.progress), evals, limit)
    result.info = meep.describe()
    return result


def average_rounds(runs: Sequence[MethodScores]) -> list[MethodScores]:
    """Per (encoder, mode, method) with several rounds: the mean of their scores (head averaging)."""
    groups: dict[tuple, list[MethodScores]] = {}
    for run in runs:
        if run.round >= 0:
            groups.setdefault((run.encoder, run.method, run.input_mode), []).append(run)
    out = []
    for (encoder, method, mode), members in groups.items():
        if len(members) < 2:
            continue
        avg = MethodScores(encoder, method, mode, -1, info={"rounds": len(members)})
        for name in members[0].pos:
            avg.pos[name] = np.mean([m.pos[name] for m in members], axis=0)
        for name in members[0].neg:
            avg.neg[name] = np.mean([m.neg[name] for m in members], axis=0)
        out.append(avg)
    return out


def save_scores(path: str | Path, runs: Sequence[MethodScores]) -> None:
    """All scores in one ``.npz`` that also holds the index of the runs (method, mode, round, info), each written in
    one step; the index is copied to a ``.json`` beside it for reading. One file: arrays and labels cannot part."""
    arrays: dict[str, Any] = {}
    index = []
    for i, run in enumerate(runs):
        for name, value in run.pos.items():
            arrays[f"{i}/pos/{name}"] = value
        for name, value in run.neg.items():
            arrays[f"{i}/neg/{name}"] = value
        index.append({k: v for k, v in asdict(run).items() if k not in ("pos", "neg")})
    text = json.dumps(index, indent=1, default=float)
    arrays[_INDEX] = np.array(text)
    path = Path(path)

    def write(tmp: str) -> None:
        with open(tmp, "wb") as f:  # a file object: numpy would append ".npz" to a name without it
            np.savez_compressed(f, **arrays)

    atomic_write(path, write)
    atomic_write(path.with_suffix(".json"), lambda tmp: Path(tmp).write_text(text))


def merge_scores(folders: Sequence[str | Path]) -> list[MethodScores]:
    """The runs of several output folders' ``scores.npz``, for one report (a recipe's ``--merge``). Refuses two
    folders that hold runs of one (encoder, method, input mode): their rounds would pool into one row
    (``first_repeat``); merge folders of other encoders, methods or input modes."""
    loaded = [load_scores(Path(folder) / "scores.npz") for folder in folders]
    repeat = first_repeat(((r.encoder, r.method, r.input_mode), i) for i, runs in enumerate(loaded) for r in runs)
    if repeat is not None:  # sources by position: one folder named twice is refused too
        (encoder, method, mode), a, b = repeat
        raise ValueError(
            f"{folders[a]} and {folders[b]} both hold runs of encoder {encoder!r}, method {method} ({mode} input): "
            "merged, their rounds would pool into one row and their round averages count as rounds; merge folders "
            "of other encoders, methods or input modes, or report each folder alone"
        )
    return [r for runs in loaded for r in runs]


def load_scores(path: str | Path) -> list[MethodScores]:
    """The runs written by ``save_scores`` (an older file without its own index: the ``.json`` beside it)."""
    with np.load(path) as data:
        meta = str(data[_INDEX]) if _INDEX in data.files else Path(path).with_suffix(".json").read_text()
        runs = [MethodScores(**m) for m in json.loads(meta)]
        for key in data.files:
            if key != _INDEX:
                i, kind, name = key.split("/", 2)
                getattr(runs[int(i)], kind)[name] = data[key]
    return runs

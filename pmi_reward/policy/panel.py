"""A panel of judges for policy evaluation, and what each shares with the training reward.

A judge is a saved scorer named ``name=directory`` (or just a directory, named after it). From the scorers'
metadata (never from their internals) each judge is compared with the reward scorer: the same encoder model (a
fine-tuned encoder counts as the pretrained model it started from), the same training seed, and the training
data: the same or overlapping dialogues of one corpus, a pair file in common, disjoint dialogues of one corpus,
or different data altogether. A judge that shares nothing (another encoder and no training dialogue or pair file
in common; the seed is then moot: one number drives two unrelated initialisations and data orders) cannot be
fooled by the reward's own quirks in the same way; a gain counts when every such judge sees it (its 95% CI
excludes 0). Each judge's validation AUC is printed beside the verdict: a judge that cannot rank replies cannot
confirm a gain.

A judge may also be an untrained chat LM, ``name=lm:MODEL``: its own PMI, log p(r | c) - log p(r)
(``LMPMIScorer``). It has no training data, so it shares none with the reward, and no validation split of its own:
its validation AUC, measured elsewhere (``recipes/scorer/run.py --method lm_pmi``), is given as ``name=AUC``.
"""

from __future__ import annotations

import math
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..scoring.encoder import EncoderSpec, TextEncoder
from ..scoring.models import model_identity
from ..scoring.scorer import LOCAL_ENCODER, PMIScorer

LM_PREFIX = "lm:"

__all__ = [
    "LM_PREFIX",
    "Judge",
    "parse_judge",
    "parse_val_aucs",
    "check_panel",
    "pretrained_encoder",
    "training_range",
    "relation",
    "load_judges",
    "describe",
    "verdict",
]


@dataclass
class Judge:
    """A judge's name, directory, scorer and provenance (``meta``), and its relation to the reward scorer."""

    name: str
    path: str
    scorer: Any  # a PMIScorer, or an LMPMIScorer for an ``lm:MODEL`` judge
    meta: dict[str, Any]
    shares: dict[str, Any] = field(default_factory=dict)

    @property
    def val_auc(self) -> float | None:
        return self.meta.get("best_val_auc")

    @property
    def independent(self) -> bool:
        """Shares nothing with the reward: another encoder and no training data in common (False if not checked).
        A shared seed number matters only for a twin (same encoder or data), which is not independent anyway."""
        return bool(self.shares) and not (self.shares["encoder"] or self.shares["data_shared"])


def row_name(path: str) -> str:
    """A policy's or judge's name from its folder: the folder's own name, ``.`` and ``..`` resolved against the
    working directory (``.`` is named like the folder it is); "" for the root, which callers refuse."""
    return Path(os.path.abspath(path)).name


def parse_judge(spec: str) -> tuple[str, str]:
    """``name=directory`` (or a directory, named after its folder: ``row_name``) as (name, directory)."""
    name, sep, path = spec.partition("=")
    if not sep:
        path = spec
        name = row_name(spec)
    if not name or not path:
        raise ValueError(f"judge {spec!r}: expected name=scorer_dir or scorer_dir")
    return name, path


def _provenance(scorer: PMIScorer) -> dict[str, Any]:
    """The scorer's metadata with ``encoder``: the pretrained model it embeds with (a fine-tuned encoder, saved in
    the scorer's directory, counts as the model it started from: it keeps what that model learned)."""
    return {**scorer.metadata, "encoder": pretrained_encoder(scorer.encoder.spec.model, scorer.metadata)}


def pretrained_encoder(model: str, meta: dict) -> str:
    """The pretrained model behind an encoder: ``model``, or for a fine-tuned one the model training started from."""
    return str(meta.get("base_encoder") or model) if model == LOCAL_ENCODER else model


def training_range(meta: dict) -> tuple[str, int, int] | None:
    """(corpus, first, stop) of the dialogues a scorer was trained on (validation and test splits included), or
    None when it was trained on pair files."""
    data = meta.get("data") or {}
    if not data.get("dialogues"):
        return None
    first = int(data.get("skip_dialogues") or 0)
    return str(data["dialogues"]), first, first + int(sum(data.get("n_dialogues") or [0]))


def _pair_files(meta: dict) -> set[Path]:
    data = meta.get("data") or {}
    return {Path(str(data[k])).resolve() for k in ("train_file", "val_file", "test_file") if data.get(k)}


def _recorded(meta: dict) -> bool:
    """Whether a scorer's metadata says what it trained on (an untrained LM judge trained on nothing)."""
    return meta.get("method") == "lm_pmi" or training_range(meta) is not None or bool(_pair_files(meta))


def _data_relation(judge: dict, reward: dict) -> str:
    """How the two training sets relate; a scorer may have trained on dialogues AND pair files (``make scorer``).
    "unknown" when either scorer's metadata does not say (e.g. one saved by ``recipes/scorer/run.py``): such a judge
    cannot be shown to share nothing, so it does not count as independent."""
    if not (_recorded(judge) and _recorded(reward)):
        return "unknown"
    j, r = training_range(judge), training_range(reward)
    one_corpus = j is not None and r is not None and j[0] == r[0]
    if j is not None and r is not None and one_corpus:
        if j == r:
            return "same dialogues"
        if j[1] < r[2] and r[1] < j[2]:
            return "overlapping dialogues"
    if _pair_files(judge) & _pair_files(reward):
        return "shared pair files"
    return "disjoint dialogues of one corpus" if one_corpus else "different"


def relation(judge_meta: dict, reward_meta: dict) -> dict[str, Any]:
    """What a judge shares with the reward scorer, from both scorers' provenance (metadata + encoder model)."""
    data = _data_relation(judge_meta, reward_meta)
    seed = (judge_meta.get("training") or {}).get("seed")
    return {
        "encoder": _same_model(judge_meta.get("encoder"), reward_meta.get("encoder")),
        "seed": seed is not None and seed == (reward_meta.get("training") or {}).get("seed"),
        "data": data,
        "data_shared": data in ("same dialogues", "overlapping dialogues", "shared pair files", "unknown"),
    }


def _same_model(a: Any, b: Any) -> bool:
    """Whether two encoders are one model, whatever name each scorer recorded (``model_identity``)."""
    return a == b if a is None or b is None else model_identity(str(a)) == model_identity(str(b))


def _load(path: str, loaded: list[TextEncoder]) -> PMIScorer:
    """A scorer, sharing an already loaded encoder that embeds the same way."""
    spec = EncoderSpec.from_dict(PMIScorer.read_config(path)["encoder"])
    encoder = next((e for e in loaded if e.spec.embeds_like(spec.on(e.device))), None)  # a saved "auto" resolved
    scorer = PMIScorer.from_pretrained(path, encoder=encoder)
    if encoder is None:
        loaded.append(scorer.encoder)
    return scorer


def _lm_judge(model: str, val_auc: float | None) -> tuple[Any, dict[str, Any]]:
    """An untrained chat LM's PMI as a scorer, and its provenance: the LM, no training data, no seed."""
    from ..evaluation.baselines.lm_pmi import LMPMIConfig, LMPMIScorer

    scorer = LMPMIScorer(LMPMIConfig(model=model))
    return scorer, {"encoder": model, "method": "lm_pmi", "best_val_auc": val_auc, "data": {}, "training": {}}


def parse_val_aucs(specs: list[str]) -> dict[str, float]:
    """``name=AUC`` per judge whose validation AUC its directory does not hold (an ``lm:`` judge)."""
    out = {}
    for spec in specs:
        name, _, value = spec.partition("=")
        try:
            auc = float(value)
        except ValueError:
            auc = math.nan
        if not name or not 0.0 <= auc <= 1.0:
            raise ValueError(f"judge_val_auc {spec!r}: expected name=AUC with AUC in [0, 1]")
        out[name] = auc
    return out


def check_panel(specs: list[str], val_aucs: dict[str, float] | None = None) -> list[tuple[str, str]]:
    """The panel's (name, directory or ``lm:MODEL``) pairs, checked before any judge loads: at least one judge,
    distinct names, a model after every ``lm:``, and no validation AUC for a judge whose directory holds its own; one
    for a judge not in the panel (a config's, whose panel ``--judges`` replaced) is ignored with a warning."""
    if not specs:
        raise ValueError("evaluate-policy needs at least one judge (--judges name=scorer_dir ...)")
    panel = [parse_judge(spec) for spec in specs]
    names = [name for name, _ in panel]
    if len(set(names)) != len(names):
        raise ValueError(f"judge names must differ: {names}")
    for name, path in panel:
        if path.startswith(LM_PREFIX) and not path[len(LM_PREFIX) :]:
            raise ValueError(f"judge {name}={LM_PREFIX}: name the chat LM, e.g. {LM_PREFIX}smollm2-135m-instruct")
    given = set(val_aucs or {})
    not_lm = sorted(given & {name for name, path in panel if not path.startswith(LM_PREFIX)})
    if not_lm:  # a judge directory holds its own validation AUC
        raise ValueError(f"judge_val_auc names no {LM_PREFIX} judge of the panel: {not_lm} (their folders hold theirs)")
    absent = sorted(given - set(names))
    if absent:  # a config's entries for its own panel, which --judges replaced (a list flag cannot empty them)
        warnings.warn(f"judge_val_auc names judges not in the panel, ignored: {absent}", stacklevel=1)
    return panel


def load_judges(
    specs: list[str], reward_dir: str | None, val_aucs: dict[str, float] | None = None
) -> tuple[list[Judge], PMIScorer | None, dict | None]:
    """The judges (compared with the reward scorer when given), the reward scorer and its provenance.
    ``val_aucs``: validation AUCs of judges whose directory holds none (``lm:`` judges)."""
    panel = check_panel(specs, val_aucs)
    val_aucs = val_aucs or {}
    loaded: list[TextEncoder] = []
    reward = _load(reward_dir, loaded) if reward_dir else None
    reward_meta = _provenance(reward) if reward else None
    judges = []
    for name, path in panel:
        if path.startswith(LM_PREFIX):
            scorer, meta = _lm_judge(path[len(LM_PREFIX) :], val_aucs.get(name))
        else:
            scorer = _load(path, loaded)
            meta = _provenance(scorer)
        judges.append(Judge(name, path, scorer, meta, relation(meta, reward_meta) if reward_meta else {}))
    return judges, reward, reward_meta


def describe(meta: dict) -> str:
    """``minilm, seed 1, chitchat dialogues 1000-1999`` (or the pair file it was trained on, or an untrained LM)."""
    if meta.get("method") == "lm_pmi":
        return f"{meta.get('encoder', '?')}, untrained: the chat LM's own PMI, log p(r | c) - log p(r)"
    seed = (meta.get("training") or {}).get("seed", "?")
    span = training_range(meta)
    where = (
        f"{span[0]} dialogues {span[1]}-{span[2] - 1}"
        if span
        else f"pairs {(meta.get('data') or {}).get('train_file', '?')}"
    )
    return f"{meta.get('encoder', '?')}, seed {seed}, {where}"


def _auc_text(judge: Judge) -> str:
    return f"val AUC {judge.val_auc:.3f}" if judge.val_auc is not None else "val AUC unknown"


def verdict(gains: dict[str, tuple[float, float, float]], judges: list[Judge]) -> str:
    """Whether a policy's gain counts: every judge that shares nothing with the reward has a CI above 0 (or
    every one below 0: a loss). ``gains`` maps judge name to (gain, low, high). Each independent judge is named
    with its gain and validation AUC."""
    independent = [j for j in judges if j.independent]
    if not independent:
        return "no judge shares nothing with the reward: no verdict"
    missing = [j.name for j in independent if math.isnan(gains[j.name][0])]
    if missing:  # a judge that left replies of the policy or the base unscored has no gain to give
        return f"not established: {', '.join(missing)} left replies unscored (no gain; shares: the unscored column)"
    lows = [gains[j.name][1] for j in independent]
    highs = [gains[j.name][2] for j in independent]
    names = "; ".join(
        f"{j.name} {gains[j.name][0]:+.2f} [{gains[j.name][1]:+.2f}, {gains[j.name][2]:+.2f}], {_auc_text(j)}"
        for j in independent
    )
    if all(lo > 0 for lo in lows):
        return f"gain counts: every independent judge ({names}) sees it, CI above 0"
    if all(hi < 0 for hi in highs):
        return f"loss: every independent judge ({names}) has its CI below 0"
    return f"not established: the independent judges ({names}) do not all exclude 0"

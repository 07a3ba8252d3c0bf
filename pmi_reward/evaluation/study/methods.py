"""Method comparisons on shared negatives: every method of a round sees the same pairs and is selected alike.

A round fixes one draw of training and validation negatives (``EvalSet.negatives``). Each trained
method (any objective of the registry) runs the one training loop on those negatives with model
selection by validation ROC-AUC; KDE is fitted on the head's inputs of the same positives and
negatives; text methods (MEEP) score the texts directly. Every method then scores the positives and
fixed negatives of each evaluation set, and the recipes turn those scores into metrics.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import torch

from ...data.pairs import PairSet
from ...scoring.encoder import TextEncoder
from ...scoring.features import PairFeatures
from ...scoring.head import HeadConfig, head_input
from ...scoring.templates import PromptTemplate
from ...training.loop import TrainConfig, score_index_pairs, train_head
from ...training.objectives import OBJECTIVES
from ..baselines.kde import KDEConfig, KDEScorer
from ..metrics import roc_auc

__all__ = ["EvalSet", "MethodScores", "FeatureBank", "fit_method", "run_round", "score_texts"]

IndexScorer = Callable[[PairFeatures, np.ndarray, np.ndarray], np.ndarray]


@dataclass
class EvalSet:
    """Positive pairs with (optionally) fixed negatives: ``negatives[i]`` are response indices for pair i."""

    name: str
    pairs: PairSet
    negatives: np.ndarray | None = None

    def fixed_negatives(self) -> np.ndarray:
        """The fixed negatives (an error for a set without them)."""
        if self.negatives is None:
            raise ValueError(f"evaluation set {self.name!r} has no fixed negatives")
        return self.negatives

    def negative_contexts(self) -> np.ndarray:
        return np.repeat(self.pairs.ctx[:, None], self.fixed_negatives().shape[1], axis=1)


@dataclass
class MethodScores:
    """One method's scores in one round: ``pos[set]`` (n,) and ``neg[set]`` (n, K) per evaluation set.

    ``round`` -1 marks the average of the rounds' scores (an ensemble of their heads).
    """

    encoder: str
    method: str
    input_mode: str
    round: int
    pos: dict[str, np.ndarray] = field(default_factory=dict)
    neg: dict[str, np.ndarray] = field(default_factory=dict)
    info: dict = field(default_factory=dict)


class FeatureBank:
    """One lazily filled ``PairFeatures`` per (pair set, input mode), reused by every method and round. Keyed by the
    pair set itself, not its name: two sets of one name (a user's "val" beside the study's own) hold other texts."""

    def __init__(self, encoder: TextEncoder, template: PromptTemplate, progress: bool = True) -> None:
        self.encoder, self.template, self.progress = encoder, template, progress
        self._features: dict[tuple[int, str, int], PairFeatures] = {}

    def __call__(self, data: EvalSet, input_mode: str, line_turns: int = 0) -> PairFeatures:
        key = (id(data.pairs), input_mode, line_turns)  # the features keep the pairs alive: the id stays theirs
        if key not in self._features:
            self._features[key] = PairFeatures(
                self.encoder, self.template, data.pairs, input_mode, self.progress, line_turns
            )
        return self._features[key]


def _head_rows(config: HeadConfig, features: PairFeatures, ctx: np.ndarray, resp: np.ndarray) -> np.ndarray:
    features.prepare(ctx.ravel(), resp.ravel())
    with torch.no_grad():
        return head_input(config, *features(ctx.ravel(), resp.ravel())).numpy()


def fit_method(
    method: str,
    head_config: HeadConfig,
    train: EvalSet,
    val: EvalSet,
    bank: FeatureBank,
    config: TrainConfig,
    kde: KDEConfig | None = None,
    progress: bool = False,
) -> tuple[IndexScorer, dict]:
    """Fit ``method`` (an objective name or ``kde``) on the shared negatives; return a scorer of index pairs."""
    mode = head_config.input_mode
    ft, fv = bank(train, mode, head_config.line_turns), bank(val, mode, head_config.line_turns)
    if method in OBJECTIVES:
        result = train_head(
            head_config,
            ft,
            train.pairs,
            fv,
            val.pairs,
            replace(config, objective=method),
            progress,
            train_negatives=train.negatives,
            val_negatives=val.negatives,
        )
        return (lambda f, c, r: score_index_pairs(result.head, f, c, r)), result.summary()
    if method == "kde":
        pos = _head_rows(head_config, ft, train.pairs.ctx, train.pairs.resp)
        neg = _head_rows(head_config, ft, train.negative_contexts(), train.fixed_negatives())
        model = KDEScorer(kde, seed=config.seed).fit(pos, neg)

        def score(f: PairFeatures, c: np.ndarray, r: np.ndarray) -> np.ndarray:
            return model.score(_head_rows(head_config, f, c, r)).reshape(np.shape(c))

        val_neg = score(fv, val.negative_contexts(), val.fixed_negatives())
        val_auc = roc_auc(score(fv, val.pairs.ctx, val.pairs.resp), val_neg)
        return score, {"best_val_auc": val_auc}
    raise ValueError(f"unknown method {method!r}: use an objective ({sorted(OBJECTIVES)}) or 'kde'")


def run_round(
    methods: Sequence[str],
    input_modes: Sequence[str],
    round_index: int,
    train: EvalSet,
    val: EvalSet,
    evals: Sequence[EvalSet],
    bank: FeatureBank,
    config: TrainConfig,
    head: HeadConfig | None = None,
    kde: KDEConfig | None = None,
    progress: bool = False,
) -> list[MethodScores]:
    """Fit every (method, input mode) on this round's negatives and score every evaluation set.

    ``head`` is the head's shape (its input mode is each of ``input_modes`` in turn); ``config.seed`` should
    differ per round.
    """
    out = []
    for mode in input_modes:
        base = head or HeadConfig()
        head_config = replace(
            base, dim=bank.encoder.dim, input_mode=mode, line_turns=base.line_turns if mode == "pair" else 0
        )
        for method in methods:
            scorer, info = fit_method(method, head_config, train, val, bank, config, kde, progress)
            result = MethodScores(bank.encoder.spec.model, method, mode, round_index, info=info)
            for data in evals:
                f = bank(data, mode, head_config.line_turns)
                result.pos[data.name] = scorer(f, data.pairs.ctx, data.pairs.resp)
                if data.negatives is not None:
                    result.neg[data.name] = scorer(f, data.negative_contexts(), data.negatives)
            out.append(result)
    return out


def score_texts(
    model: str,
    method: str,
    fn: Callable[[list[str], list[str]], np.ndarray],
    evals: Sequence[EvalSet],
    limit: dict[str, int] | None = None,
) -> MethodScores:
    """Scores of a text-level method (e.g. MEEP with ``model``) on the evaluation sets; with ``limit[set] = n``
    only the first n positives (and their negatives) are scored and the rest are NaN (``n = 0``: the set is not
    scored at all)."""
    result = MethodScores(model, method, "text", 0)
    for data in evals:
        n = min(len(data.pairs), (limit or {}).get(data.name, len(data.pairs)))
        p = data.pairs
        contexts = [p.contexts[i] for i in p.ctx[:n]]
        responses = [p.responses[i] for i in p.resp[:n]]
        k = 0 if data.negatives is None else data.negatives.shape[1]
        contexts += [c for c in contexts for _ in range(k)]
        responses += [p.responses[j] for j in (data.fixed_negatives()[:n].ravel() if k else [])]
        scores = np.asarray(fn(contexts, responses) if n else [], dtype=np.float32)
        result.pos[data.name] = np.full(len(p), np.nan, dtype=np.float32)
        result.pos[data.name][:n] = scores[:n]
        if k:
            result.neg[data.name] = np.full((len(p), k), np.nan, dtype=np.float32)
            result.neg[data.name][:n] = scores[n:].reshape(n, k)
    return result

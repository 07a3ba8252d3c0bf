"""One training loop for every objective: rounds of fresh negatives, AdamW, validation ROC-AUC, best-of-run.

Each round (epoch) draws new negatives for every training positive, then passes over the positives in
batches of ``batch_size`` with their K negatives (studies that compare methods pass negatives drawn once
instead, so that every method sees the very same pairs). After each round the head scores a fixed
validation set (positives against negatives drawn once); the state with the best validation ROC-AUC is
kept and training stops after ``patience`` rounds without improvement. Features that expose a ``module``
with trainable parameters (``pmi_reward.training.trainable.TrainableFeatures``: the whole encoder or LoRA
adapters) are trained along with the head, at ``encoder_lr``, in batches of ``encoder_batch_size``; their random
negatives are then drawn among the batch's other replies (``random_from_batch``: the same distribution, nothing
more to embed), and a round is ``steps_per_round`` batches, so that validation and checkpoints come often. A head
that training continues (``head``) is validated first as round 0, so the result is never worse on validation than
the start. A round whose head scores validation pairs as non-numbers (training diverged: an lr too high, a bf16
overflow) ends the run with a warning and the best round so far (an error when no round was finite). With
``graded_in_dialogue``, each round also draws other turns of each positive's dialogue, which join
the positives at weight ``graded_weight`` (``pmi_reward.data.graded``). Checkpoints hold the head, the optimizer,
the RNGs and a trainable encoder, so a killed run resumes to the same result; its wall-clock ``seconds`` go on from
the checkpoint's, and the result names the round it resumed from (``resumed_from_round``). Seeded and deterministic
on CPU (all but the rounds' wall-clock ``seconds``). The first round's texts are embedded before the round bar
starts, so that its ETA times rounds, not that embedding (most of a frozen encoder's run).
"""

from __future__ import annotations

import copy
import math
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np
import torch
from sklearn.metrics import roc_auc_score
from torch import nn

from ..data.graded import partial_replies
from ..data.negatives import NegativeSpec, random_from_batch, sample_negatives
from ..data.pairs import PairSet
from ..progress import progress_bar
from ..scoring.head import HeadConfig, PMIHead
from .checkpoint import digest, load_round, run_fingerprint, save_round
from .objectives import get_objective

__all__ = ["TrainConfig", "TrainResult", "train_head", "default_lr", "head_lr", "score_index_pairs"]


@dataclass
class TrainConfig:
    """Optimisation settings of the head (the negatives' mix is a ``NegativeSpec`` of its own)."""

    objective: str = field(default="nwj", metadata={"help": "nwj (PMIScore), mine, infonce, js, chi2, hellinger, tv"})
    batch_size: int = field(default=256, metadata={"help": "positives per step (each with its K negatives)"})
    lr: float | None = field(default=None, metadata={"help": "AdamW learning rate (default: 1e-3 * 1024 / dim)"})
    weight_decay: float = field(default=0.01, metadata={"help": "AdamW weight decay"})
    epochs: int = field(default=40, metadata={"help": "rounds, each with freshly drawn negatives"})
    patience: int = field(default=6, metadata={"help": "stop after this many rounds without a better val AUC"})
    seed: int = field(default=0, metadata={"help": "seeds the head's initialisation and the negatives' draws"})
    checkpoint_dir: str | None = field(
        default=None, metadata={"help": "save state after every round there; resume from it when present"}
    )
    train_encoder: str = field(
        default="none", metadata={"help": "none (frozen encoder, cached embeddings) | full | lora: fine-tune it too"}
    )
    encoder_lr: float = field(
        default=2e-5, metadata={"help": "learning rate of the encoder's trainable weights (LoRA: ~1e-4)"}
    )
    encoder_layers: int | None = field(
        default=None,
        metadata={
            "help": "with train_encoder full: train only the top N layers (None: all); the embeddings and lower layers "
            "keep their pretrained weights, and the backward pass is cheaper"
        },
    )
    encoder_attention_dropout: float | None = field(
        default=None,
        metadata={
            "help": "with train_encoder: dropout on attention probabilities while the encoder trains (None: the "
            "model's own, 0.1 for MiniLM); 0 lets PyTorch's CPU attention run its fused kernel: less memory, 1.3x "
            "faster fine-tuning of MiniLM, and 0.002 less validation AUC (docs/scorer.md)"
        },
    )
    encoder_activation_checkpointing: bool = field(
        default=False,
        metadata={
            "help": "with train_encoder: recompute each layer's activations in the backward pass instead of keeping "
            "them: the same gradients in much less peak memory, for one more forward pass (docs/scorer.md)"
        },
    )
    warmup_rounds: int = field(
        default=0, metadata={"help": "with train_encoder: rounds of the head alone on the frozen encoder first"}
    )
    encoder_batch_size: int = field(
        default=32,
        metadata={
            "help": "with train_encoder: positives per step while the encoder trains (the head's lr is scaled by "
            "encoder_batch_size / batch_size then); the warm-up keeps batch_size"
        },
    )
    bf16: bool | None = field(
        default=None,
        metadata={
            "help": "with train_encoder: run the encoder under bfloat16 autocast (float32 weights); default: where the "
            "device computes bf16 faster (a GPU, a CPU with AMX, or AVX512-BF16 on a non-Intel CPU: 2.3x on an AMD "
            "EPYC; slower on an Intel one without AMX, emulated on AVX2)"
        },
    )
    steps_per_round: int | None = field(
        default=None, metadata={"help": "batches per round (None: a full pass); validation after each round"}
    )
    select_by: str = field(
        default="auc",
        metadata={"help": "keep the round with the best validation auc, or the lowest validation loss (calibration)"},
    )
    in_batch_negatives: bool = field(
        default=False, metadata={"help": "every other reply of the batch is a negative too (free once embedded)"}
    )
    graded_in_dialogue: int = field(
        default=0,
        metadata={
            "help": "graded supervision: per positive, this many other turns of its dialogue (not its context's lines) "
            "count as positives of weight graded_weight (pmi_reward.data.graded); 0: off"
        },
    )
    graded_weight: float = field(
        default=0.5, metadata={"help": "with graded_in_dialogue: the weight w of those partially relevant replies"}
    )
    correction_l2: float = field(
        default=0.0,
        metadata={
            "help": "residual heads: add this times the mean squared MLP correction (nats^2) to the loss, so that "
            "the score stays near the scaled cosine"
        },
    )

    def __post_init__(self) -> None:
        """Refuse settings out of range when the options are read, not after the data are embedded or a warm-up has
        run (a batch of 0, 0 rounds that would save an untrained head, a negative patience that stops at once)."""
        for name in ("batch_size", "encoder_batch_size", "epochs", "patience", "steps_per_round", "encoder_layers"):
            count = getattr(self, name)
            if count is not None and count < 1:
                raise ValueError(f"{name} must be >= 1, got {count}")
        if self.graded_in_dialogue < 0:
            raise ValueError(f"graded_in_dialogue must be >= 0, got {self.graded_in_dialogue}")
        if self.graded_in_dialogue and self.objective == "infonce":
            raise ValueError("graded_in_dialogue needs an objective whose positive term is a mean, not infonce")
        for name in ("lr", "encoder_lr", "weight_decay", "warmup_rounds", "correction_l2", "graded_weight"):
            value = getattr(self, name)
            if value is not None and not value >= 0:  # NaN too
                raise ValueError(f"{name} must be >= 0, got {value}")
        dropout = self.encoder_attention_dropout
        if dropout is not None and not 0 <= dropout < 1:
            raise ValueError(f"encoder_attention_dropout must be in [0, 1), got {dropout}")
        if self.select_by not in ("auc", "loss"):
            raise ValueError(f"select_by must be auc or loss, got {self.select_by!r}")
        if self.train_encoder not in ("none", "full", "lora"):
            raise ValueError(f"train_encoder must be none, full or lora, got {self.train_encoder!r}")


@dataclass
class TrainResult:
    """A run's best head, its round and validation AUC, every round's figures, the wall-clock seconds of the whole
    run (a resumed one's included: they go on from the checkpoint's), and the checkpoint's last round when the run
    resumed from one (None: it did not)."""

    head: PMIHead
    best_epoch: int
    best_val_auc: float
    history: list[dict] = field(default_factory=list)
    seconds: float = 0.0
    resumed_from_round: int | None = None

    def untimed_history(self) -> list[dict]:
        """The rounds without their wall-clock ``seconds``: what a seeded run (or a resumed one) reproduces."""
        return [{k: v for k, v in h.items() if k != "seconds"} for h in self.history]

    def summary(self) -> dict:
        diverged = [h["epoch"] for h in self.history if h["val_auc"] is None]  # the round that ended the run
        return {
            "best_epoch": self.best_epoch,
            "best_val_auc": self.best_val_auc,
            "epochs_run": sum(h["epoch"] > 0 for h in self.history),  # round 0 only validates a starting head
            **({"diverged_round": diverged[0]} if diverged else {}),
            "seconds": round(self.seconds, 2),
            "resumed_from_round": self.resumed_from_round,
        }


def default_lr(dim: int) -> float:
    """The paper's rule: 1e-3 scaled by 1024 / embedding width."""
    return 1e-3 * 1024 / dim


def head_lr(config: TrainConfig, dim: int, encoder_trains: bool = False) -> float:
    """The head's AdamW learning rate: ``lr``, or ``default_lr(dim)``; while an encoder trains, scaled by
    ``encoder_batch_size / batch_size`` (its smaller batches: the linear scaling rule)."""
    lr = config.lr if config.lr is not None else default_lr(dim)
    return lr * (config.encoder_batch_size / config.batch_size) if encoder_trains else lr  # the old rounding


@torch.no_grad()
def score_index_pairs(head: PMIHead, features, ctx: np.ndarray, resp: np.ndarray, chunk: int = 8192) -> np.ndarray:
    """Head scores for index pairs of any shape (encodes what is missing first)."""
    features.prepare(ctx.ravel(), resp.ravel())
    flat_c, flat_r = ctx.ravel(), resp.ravel()
    out = [head(*features(flat_c[s : s + chunk], flat_r[s : s + chunk])) for s in range(0, len(flat_c), chunk)]
    return torch.cat(out).numpy().reshape(ctx.shape) if out else np.zeros(ctx.shape, dtype=np.float32)


def _validate(
    head: PMIHead, features, pairs: PairSet, negs: np.ndarray, objective: Callable
) -> tuple[float, float] | None:
    """Validation ROC-AUC and the objective's value (the loss) on the validation positives and negatives; None when
    the scores are not numbers (NaN weights: training diverged)."""
    pos = score_index_pairs(head, features, pairs.ctx, pairs.resp)
    neg = score_index_pairs(head, features, np.repeat(pairs.ctx[:, None], negs.shape[1], 1), negs)
    if not (np.isfinite(pos).all() and np.isfinite(neg).all()):
        return None
    labels = np.r_[np.ones(len(pos)), np.zeros(neg.size)]
    loss = float(objective(torch.from_numpy(pos), torch.from_numpy(neg)))
    return float(roc_auc_score(labels, np.r_[pos, neg.ravel()])), loss


def _prepare_validation(features: Any, pairs: PairSet, negs: np.ndarray) -> None:
    """Embed what ``_validate`` needs, in the calls it makes (the positives, then the negatives), so that its
    embeddings come out as they would there."""
    features.prepare(pairs.ctx.ravel(), pairs.resp.ravel())
    features.prepare(np.repeat(pairs.ctx[:, None], negs.shape[1], 1).ravel(), negs.ravel())


def _pairs_digest(pairs: PairSet) -> str:
    """The pairs' texts, in order, the dialogue structure their negatives are drawn from, and mined negatives."""
    mined = [table for kind in sorted(pairs.mined) for table in (kind, *pairs.mined[kind])]
    return digest(
        pairs.contexts,
        pairs.responses,
        pairs.ctx,
        pairs.resp,
        pairs.group,
        pairs.pool_ptr,
        pairs.pool,
        pairs.line_ptr,
        pairs.lines,
        *mined,
    )


def _features_identity(features: Any) -> Any:
    """What the features say makes their embeddings (encoder, pooling, template, input mode); else their type."""
    identity = getattr(features, "identity", None)
    return identity() if callable(identity) else type(features).__name__


def _fingerprint(
    head_config: HeadConfig,
    config: TrainConfig,
    negatives: NegativeSpec,
    train: tuple[PairSet, Any, np.ndarray | None],
    val: tuple[PairSet, Any, np.ndarray | None],
    head: PMIHead | None = None,
) -> dict:
    """Everything that determines a run's rounds, so that a checkpoint is only resumed by the run that wrote it
    (or by one that only stops later: ``epochs`` and ``patience`` may change). ``train`` and ``val`` are each
    (pairs, features, fixed negatives or None); ``head`` is the head training starts from, if not a fresh one.

    The option dataclasses are hashed whole (every field but the three above), so that a field added later is
    covered without a change here."""
    settings = {k: v for k, v in asdict(config).items() if k not in ("checkpoint_dir", "epochs", "patience")}
    splits = {
        name: {
            "pairs": _pairs_digest(pairs),
            "features": _features_identity(features),
            "negatives_given": fixed,
        }
        for name, (pairs, features, fixed) in (("train", train), ("val", val))
    }
    start = None if head is None else digest(*(t for _, t in sorted(head.state_dict().items())))
    return run_fingerprint(
        head=asdict(head_config), start_head=start, training=settings, negatives=asdict(negatives), **splits
    )


def _default_settings() -> dict:
    """The fingerprint of the options' defaults: a checkpoint written before an option was added resumes a run that
    leaves it at its default (the run then trains as the older code did)."""
    return run_fingerprint(head=asdict(HeadConfig()), training=asdict(TrainConfig()), negatives=asdict(NegativeSpec()))


def _diverged(epoch: int) -> str:
    return f"round {epoch}: the head's validation scores are not numbers: training diverged (try a lower lr)"


def _stop_round(history: list[dict], config: TrainConfig) -> int | None:
    """The round after which a run of ``config`` stops, replayed on a checkpoint's history (None: not yet)."""
    best_key, best_epoch = -np.inf, 0
    for row in history:
        if row["val_auc"] is None:  # diverged: the run stopped there
            return row["epoch"]
        key = row["val_auc"] if config.select_by == "auc" else -row["val_loss"]
        if key > best_key:
            best_key, best_epoch = key, row["epoch"]
        if row["epoch"] >= config.epochs or (row["epoch"] and row["epoch"] - best_epoch >= config.patience):
            return row["epoch"]
    return None


def _in_batch(head: PMIHead, u: torch.Tensor, v: torch.Tensor, resp: np.ndarray) -> torch.Tensor:
    """(B, B - 1) scores of each context with the batch's other replies; where another reply IS the gold one (the
    same text twice in a batch) the score is the floor -cap, a constant, so no positive is ever a negative."""
    n = len(resp)
    other = (np.arange(n)[:, None] + np.arange(1, n)[None, :]) % n  # row i: every j != i
    scores = head(u.unsqueeze(1).expand(n, n - 1, *u.shape[1:]), v[torch.as_tensor(other)])
    clash = torch.as_tensor(resp[other] == resp[:, None])
    return scores.masked_fill(clash, -head.config.cap) if clash.any() else scores


def _fit_prior(head: PMIHead, features: Any, pairs: PairSet, seed: int, n: int = 4096, k: int = 3) -> None:
    """Start a residual head at the best scaled cosine: fit a, b on ``n`` training positives and ``k`` random
    replies each (the product of marginals, so that the start estimates PMI from the cosine alone; the mix's hard
    negatives are the correction's to learn). Its own RNG: the rounds' draws stay those of any other head. Fitted by
    NWJ whatever the training objective: the calibrated ones share its optimum, log p/q, and on finite samples chi2
    (which rewards a positive by 2e^s) ran off toward a step function (``tests/test_residual_head.py``)."""
    rng = np.random.default_rng([seed, 2])
    rows = np.sort(rng.choice(len(pairs), min(n, len(pairs)), replace=False))
    negs = sample_negatives(pairs, NegativeSpec(k_random=k, k_context=0), rng)[rows]
    ctx = pairs.ctx[rows]
    features.prepare(np.r_[ctx, np.repeat(ctx, k)], np.r_[pairs.resp[rows], negs.ravel()])
    with torch.no_grad():
        cos_pos = head.prior_cosine(*features(ctx, pairs.resp[rows]))
        cos_neg = head.prior_cosine(*features(np.repeat(ctx[:, None], k, 1), negs))
    head.fit_prior(cos_pos, cos_neg, get_objective("nwj"))


def _check_negatives(negs: np.ndarray | None, pairs: PairSet, name: str) -> np.ndarray | None:
    if negs is None:
        return None
    negs = np.asarray(negs, dtype=np.int64)
    if negs.ndim != 2 or len(negs) != len(pairs) or negs.shape[1] < 1:
        raise ValueError(f"{name} must have shape ({len(pairs)}, K >= 1), got {negs.shape}")
    if negs.min() < 0 or negs.max() >= len(pairs.responses):
        raise ValueError(f"{name} holds indices outside the response table")
    return negs


@dataclass
class _Round:
    """One round's draws: each training positive's negatives and graded replies (-1: none), and the positives it
    trains on, in order (``_Run.plan``)."""

    negs: np.ndarray
    partial: np.ndarray
    order: np.ndarray


class _Run:
    """The state of one ``train_head`` run: the head, trainable features, the optimizer, the best state so far."""

    def __init__(
        self, head_config: HeadConfig, train_features: Any, config: TrainConfig, head: PMIHead | None = None
    ) -> None:
        self.head = head if head is not None else PMIHead(head_config)
        self.encoder = getattr(train_features, "module", None)
        self.tuned = (
            [(n, p) for n, p in self.encoder.named_parameters() if p.requires_grad] if self.encoder is not None else []
        )
        # smaller batches while the encoder trains: the head's lr follows the linear scaling rule
        self.batch_size = config.encoder_batch_size if self.tuned else config.batch_size
        lr = head_lr(config, head_config.dim or 1, bool(self.tuned))
        prior = {id(p) for p in self.head.prior_parameters()}
        groups: list[dict] = [{"params": [p for p in self.head.parameters() if id(p) not in prior]}]
        if prior:  # a residual head's cosine scale and shift: no weight decay (it would shrink the scale to 0)
            groups.append({"params": self.head.prior_parameters(), "weight_decay": 0.0})
        if self.tuned:
            groups.append({"params": [p for _, p in self.tuned], "lr": config.encoder_lr, "weight_decay": 0.0})
        self.optim = torch.optim.AdamW(groups, lr=lr, weight_decay=config.weight_decay)
        self.best: tuple[float, int, tuple[dict, dict]] = (-math.inf, 0, self.snapshot())
        self.history: list[dict] = []
        # a resumed run: the checkpoint's last round, and the wall-clock seconds its rounds had taken by then
        self.resumed_from: int | None = None
        self.carried_seconds = 0.0
        # what a checkpoint saves: the head, and a fine-tuned encoder whole (its frozen weights included)
        self.saved = nn.ModuleDict({"head": self.head})
        if self.tuned and self.encoder is not None:
            self.saved["encoder"] = self.encoder

    def best_state(self) -> dict:
        """The best state so far as one flat dict of ``self.saved``'s keys."""
        head, tuned = self.best[2]
        return {**{f"head.{k}": v for k, v in head.items()}, **{f"encoder.{n}": t for n, t in tuned.items()}}

    def snapshot(self) -> tuple[dict, dict]:
        return copy.deepcopy(self.head.state_dict()), {n: p.detach().clone() for n, p in self.tuned}

    def set_training(self, on: bool) -> None:
        self.head.train(on)
        if self.encoder is not None:
            self.encoder.train(on)

    def resume(self, directory: str, fingerprint: dict, rng: np.random.Generator, config: TrainConfig) -> int | None:
        """Restore the last finished round from ``directory``; the first round still to run (None: no checkpoint,
        a large number: the interrupted run had already stopped early). A run that would have stopped before the
        checkpoint's last round (fewer ``epochs``, a lower ``patience``) is refused: its best round could be one it
        never trains; one whose last round diverged has stopped."""
        resumed = load_round(directory, fingerprint, self.saved, self.optim, rng, _default_settings())
        if resumed is None:
            return None
        self.resumed_from, self.carried_seconds = resumed.epoch, resumed.seconds
        stop = _stop_round(resumed.history, config)
        if stop is not None and stop < resumed.epoch:
            raise ValueError(
                f"{directory}: the checkpoint ran {resumed.epoch} rounds; with epochs={config.epochs} and "
                f"patience={config.patience} this run stops after round {stop}: resume with the settings that wrote "
                "it (or ones that stop later), or start afresh in another checkpoint_dir"
            )
        (auc, epoch, state), self.history = resumed.best, resumed.history
        head = {k[5:]: v for k, v in state.items() if k.startswith("head.")}
        tuned = {k[8:]: v for k, v in state.items() if k.startswith("encoder.")}
        self.best = (auc, epoch, (head, tuned))
        stopped = resumed.epoch - epoch >= config.patience or self.history[-1]["val_auc"] is None
        return sys.maxsize if stopped else resumed.epoch + 1

    def plan(
        self,
        features: Any,
        pairs: PairSet,
        negs: np.ndarray,
        config: TrainConfig,
        rng: np.random.Generator,
        batch_random: int = 0,
        partial: np.ndarray | None = None,
    ) -> _Round:
        """A round's order of positives (all shuffled, or ``steps_per_round`` batches of them) with its ``negs`` and
        ``partial`` replies (graded supervision; -1: none), every text it needs embedded (``features.prepare``; the
        ``batch_random`` negatives drawn from the batch are the batch's own replies)."""
        k = negs.shape[1] + batch_random
        order = rng.permutation(len(pairs))
        if config.steps_per_round:
            order = order[: config.steps_per_round * self.batch_size]
        partial = np.zeros((len(pairs), 0), np.int64) if partial is None else partial
        have = partial[order] >= 0
        features.prepare(
            np.r_[
                pairs.ctx[order],
                np.repeat(pairs.ctx[order], k),
                np.repeat(pairs.ctx[order], partial.shape[1])[have.ravel()],
            ],
            np.r_[pairs.resp[order], negs[order].ravel(), partial[order][have]],
        )
        return _Round(negs, partial, order)

    def epoch(
        self,
        objective: Callable,
        features: Any,
        pairs: PairSet,
        planned: _Round,
        config: TrainConfig,
        rng: np.random.Generator,
        progress: bool,
        batch_random: int = 0,
    ) -> float:
        """One round as ``planned`` (``plan``): batches of positives, each with its K negatives (``batch_random``
        random ones drawn from the batch first; with ``in_batch_negatives``, all the batch's other replies too) and
        its graded replies; the mean loss."""
        negs, partial, order = planned.negs, planned.partial, planned.order
        k, kp = negs.shape[1] + batch_random, partial.shape[1]
        losses = []
        self.set_training(True)
        starts = range(0, len(order), self.batch_size)
        bar = progress_bar(starts, "batches", disable=not progress or len(starts) < 20, leave=False, unit="batch")
        seen, t0 = 0, time.perf_counter()  # positives trained so far (the bar's count lags a refresh behind)
        for s in bar:
            b = order[s : s + self.batch_size]
            c, nb, pb = pairs.ctx[b], negs[b], partial[b]
            if batch_random:
                nb = np.c_[random_from_batch(pairs, b, batch_random, rng), nb]
            pc, pr = np.repeat(c, kp)[pb.ravel() >= 0], pb[pb >= 0]
            # one features call per batch: a trainable encoder embeds each distinct text of it once
            u, v = features(np.r_[c, np.repeat(c, k), pc], np.r_[pairs.resp[b], nb.ravel(), pr])
            scores, correction = self.head.scores_and_correction(u, v)
            neg = scores[len(b) : len(b) * (k + 1)].view(len(b), k)
            if config.in_batch_negatives and len(b) > 1:
                neg = torch.cat([neg, _in_batch(self.head, u[: len(b)], v[: len(b)], pairs.resp[b])], dim=1)
            loss = objective(scores[: len(b)], neg)
            if len(pr):  # positives of weight w: the mixture (p + w p_dialogue) / (1 + w), the negatives' term once
                w = config.graded_weight
                loss = (loss + w * objective(scores[len(b) * (k + 1) :], neg)) / (1 + w)
            if config.correction_l2 and correction is not None:
                loss = loss + config.correction_l2 * correction.square().mean()
            self.optim.zero_grad(set_to_none=True)
            loss.backward()
            self.optim.step()
            losses.append(loss.item())
            seen += len(b)
            bar.set_postfix(loss=f"{loss.item():.4f}", pairs_s=f"{seen / max(time.perf_counter() - t0, 1e-9):.1f}")
        self.set_training(False)
        return float(np.mean(losses))

    def restore_best(self) -> None:
        self.head.load_state_dict(self.best[2][0])
        with torch.no_grad():
            for name, p in self.tuned:
                p.copy_(self.best[2][1][name])
        self.set_training(False)


_HEAD = object()  # train_head's origin by default: the head it is given


def train_head(
    head_config: HeadConfig,
    train_features: Any,
    train_pairs: PairSet,
    val_features: Any,
    val_pairs: PairSet,
    config: TrainConfig,
    progress: bool = True,
    train_negatives: np.ndarray | None = None,
    val_negatives: np.ndarray | None = None,
    negatives: NegativeSpec | None = None,
    head: PMIHead | None = None,
    origin: Any = _HEAD,
) -> TrainResult:
    """Train a fresh head on (features, pairs); return the state with the best validation ROC-AUC.

    Each round draws ``negatives`` (default ``NegativeSpec()``) for every training positive. Fixed
    ``train_negatives`` (n_train, K) response indices replace those draws in every round (the paper's
    protocol; lets several methods share one draw); ``val_negatives`` likewise fixes the validation negatives.
    ``head`` continues training a head (e.g. one warmed up on the frozen encoder) instead of a fresh one, in place
    (the result's head is that object: ``fit_scorer`` trains a copy of its ``start_head``); it is validated first, as
    round 0, so that the result is never worse on validation than the start. ``origin`` is the
    head the checkpoints' fingerprint names as the start: ``head`` itself by default; where ``head`` comes from a
    warm-up that a resumed run skips (``fit_scorer``: the checkpoint holds its result), the head the warm-up started
    from (None: a fresh one), so that a resumed run needs no warm-up to be recognised.

    With ``config.checkpoint_dir`` holding a checkpoint of this run, the run resumes after its last round: the
    result's ``seconds`` (and the history's) go on from the checkpoint's, and ``resumed_from_round`` names that round.

    A round that diverges (validation scores that are not numbers) is recorded with ``val_auc`` and ``val_loss``
    None and ends the run with a warning: the result is the best round before it. With no finite round before it
    (nor a finite start head), a ValueError names the round.
    """
    if len(train_pairs) == 0 or len(val_pairs) == 0:
        raise ValueError("training and validation sets must both hold pairs")
    train_negatives = _check_negatives(train_negatives, train_pairs, "train_negatives")
    val_negatives = _check_negatives(val_negatives, val_pairs, "val_negatives")
    negatives = negatives or NegativeSpec()
    start = time.perf_counter()
    torch.manual_seed(config.seed)
    rng = np.random.default_rng(config.seed)
    objective = get_objective(config.objective)
    run = _Run(head_config, train_features, config, head)
    # while the encoder trains, random negatives come from the batch: the same draws from p(r), nothing more to embed
    batch_random = negatives.k_random if run.tuned and train_negatives is None else 0
    drawn = replace(negatives, k_random=0) if batch_random else negatives
    val_negs = val_negatives
    if val_negs is None:
        val_negs = sample_negatives(val_pairs, negatives, np.random.default_rng(config.seed + 1))
    first, fingerprint = 1, {}
    if config.checkpoint_dir:
        fingerprint = _fingerprint(
            head_config,
            config,
            negatives,
            (train_pairs, train_features, train_negatives),
            (val_pairs, val_features, val_negatives),
            head if origin is _HEAD else origin,
        )
        first = run.resume(config.checkpoint_dir, fingerprint, rng, config) or 1
        start -= run.carried_seconds  # a resumed run's clock goes on from its checkpoint's
    if head is None and head_config.residual != "none" and first == 1:  # a resumed head is the checkpoint's
        _fit_prior(run.head, train_features, train_pairs, config.seed)
    if head is not None and first == 1:  # the head it continues (e.g. warmed up on the frozen encoder) is round 0:
        validated = _validate(run.head, val_features, val_pairs, val_negs, objective)  # never worse than it
        if validated is None:
            raise ValueError(_diverged(0) + ": the head training starts from")
        start_auc, start_loss = validated
        run.history.append(
            {
                "epoch": 0,
                "loss": None,
                "val_auc": start_auc,
                "val_loss": start_loss,
                "seconds": time.perf_counter() - start,
            }
        )
        run.best = (start_auc if config.select_by == "auc" else -start_loss, 0, run.snapshot())

    def plan() -> _Round:
        """The next round's draws, its texts embedded."""
        if train_negatives is not None:
            negs = train_negatives
        else:
            negs = sample_negatives(train_pairs, drawn, rng) if drawn.k else np.zeros((len(train_pairs), 0), np.int64)
        partial = partial_replies(train_pairs, config.graded_in_dialogue, rng) if config.graded_in_dialogue else None
        return run.plan(train_features, train_pairs, negs, config, rng, batch_random, partial)

    rounds, done = range(first, config.epochs + 1), min(first, config.epochs + 1) - 1
    # the first round's draws and embeddings (with a frozen encoder nearly all the run's embedding, the same calls
    # in the same order) before the round bar starts its clock: its ETA then times rounds, not that embedding
    if len(rounds):
        planned = plan()
        _prepare_validation(val_features, val_pairs, val_negs)
    bar = progress_bar(
        rounds, f"train {config.objective}", disable=not progress, unit="round", initial=done, total=config.epochs
    )
    for epoch in bar:
        if epoch > first:  # the first round's was planned above
            planned = plan()
        loss = run.epoch(objective, train_features, train_pairs, planned, config, rng, progress, batch_random)
        validated = _validate(run.head, val_features, val_pairs, val_negs, objective)
        auc, val_loss = validated if validated is not None else (None, None)
        run.history.append(
            {
                "epoch": epoch,
                "loss": loss if math.isfinite(loss) else None,
                "val_auc": auc,
                "val_loss": val_loss,
                "seconds": time.perf_counter() - start,
            }
        )
        if auc is None or val_loss is None:  # NaN weights: every later round would be NaN too
            if all(h["val_auc"] is None for h in run.history):
                raise ValueError(_diverged(epoch))
            best_auc = next((h["val_auc"] for h in run.history if h["epoch"] == run.best[1]), run.best[0])
            warnings.warn(
                f"{_diverged(epoch)}; stopping with round {run.best[1]}, the best so far (validation AUC "
                f"{best_auc:.4f})",
                stacklevel=2,
            )
        else:
            key = auc if config.select_by == "auc" else -val_loss
            if key > run.best[0]:
                run.best = (key, epoch, run.snapshot())
            bar.set_postfix(loss=f"{loss:.4f}", val_auc=f"{auc:.4f}", val_loss=f"{val_loss:.4f}")
        if config.checkpoint_dir:
            best = (run.best[0], run.best[1], run.best_state())
            save_round(config.checkpoint_dir, fingerprint, epoch, run.saved, run.optim, best, run.history, rng)
        if auc is None or epoch - run.best[1] >= config.patience:
            break
    run.restore_best()
    best_auc = next((h["val_auc"] for h in run.history if h["epoch"] == run.best[1]), run.best[0])
    seconds = time.perf_counter() - start
    return TrainResult(run.head, run.best[1], best_auc, run.history, seconds, resumed_from_round=run.resumed_from)

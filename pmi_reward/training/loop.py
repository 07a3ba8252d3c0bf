"""One training loop for every objective: rounds of fresh negatives, AdamW, validation ROC-AUC, best-of-run.

Each round (epoch) draws new negatives for every training positive, then passes over the positives in
batches of ``batch_size`` with their K negatives (studies that compare methods pass negatives drawn once
instead, so that every method sees the very same pairs). After each round the head scores a fixed
validation set (positives against negatives drawn once); the state with the best validation ROC-AUC is
kept and training stops after ``patience`` rounds without improvement. Features that expose a ``module``
with trainable parameters (``pmi_reward.finetune.EncoderFeatures``: LoRA adapters) are trained along
with the head, at ``encoder_lr``. Seeded and deterministic on CPU.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import time
from dataclasses import asdict, dataclass, field

import numpy as np
import torch
from sklearn.metrics import roc_auc_score
from tqdm.auto import tqdm

from ..data.negatives import NegativeSpec, sample_negatives
from ..data.pairs import PairSet
from ..scoring.head import HeadConfig, PMIHead
from .checkpoint import load_round, save_round
from .objectives import get_objective

__all__ = ["TrainConfig", "TrainResult", "train_head", "default_lr", "score_index_pairs"]


@dataclass
class TrainConfig:
    """Optimisation and sampling settings of the head."""

    objective: str = field(default="nwj", metadata={"help": "nwj (PMIScore), mine, infonce, js, chi2, hellinger, tv"})
    k_random: int = field(default=4, metadata={"help": "negatives per positive: responses of other dialogues"})
    k_in_dialogue: int = field(default=1, metadata={"help": "negatives per positive: other turns of its dialogue"})
    k_context: int = field(default=1, metadata={"help": "negatives per positive: lines of its own context "
                                                       "(so that parroting is not rewarded)"})
    batch_size: int = field(default=256, metadata={"help": "positives per step (each with its K negatives)"})
    lr: float | None = field(default=None, metadata={"help": "AdamW learning rate (default: 1e-3 * 1024 / dim)"})
    weight_decay: float = 0.01
    epochs: int = field(default=40, metadata={"help": "rounds, each with freshly drawn negatives"})
    patience: int = field(default=6, metadata={"help": "stop after this many rounds without a better val AUC"})
    seed: int = 0
    checkpoint_dir: str | None = field(default=None, metadata={
        "help": "save state after every round there; resume from it when present"})
    encoder_lr: float = field(default=1e-4, metadata={
        "help": "learning rate of trainable features (e.g. LoRA adapters on the encoder)"})

    def negatives(self) -> NegativeSpec:
        return NegativeSpec(self.k_random, self.k_in_dialogue, self.k_context)


@dataclass
class TrainResult:
    head: PMIHead
    best_epoch: int
    best_val_auc: float
    history: list[dict] = field(default_factory=list)
    seconds: float = 0.0

    def summary(self) -> dict:
        return {"best_epoch": self.best_epoch, "best_val_auc": self.best_val_auc,
                "epochs_run": len(self.history), "seconds": round(self.seconds, 2)}


def default_lr(dim: int) -> float:
    """The paper's rule: 1e-3 scaled by 1024 / embedding width."""
    return 1e-3 * 1024 / dim


@torch.no_grad()
def score_index_pairs(head: PMIHead, features, ctx: np.ndarray, resp: np.ndarray, chunk: int = 8192) -> np.ndarray:
    """Head scores for index pairs of any shape (encodes what is missing first)."""
    features.prepare(ctx.ravel(), resp.ravel())
    flat_c, flat_r = ctx.ravel(), resp.ravel()
    out = [head(*features(flat_c[s:s + chunk], flat_r[s:s + chunk])) for s in range(0, len(flat_c), chunk)]
    return torch.cat(out).numpy().reshape(ctx.shape) if out else np.zeros(ctx.shape, dtype=np.float32)


def _val_auc(head: PMIHead, features, pairs: PairSet, negs: np.ndarray) -> float:
    pos = score_index_pairs(head, features, pairs.ctx, pairs.resp)
    neg = score_index_pairs(head, features, np.repeat(pairs.ctx[:, None], negs.shape[1], 1), negs)
    labels = np.r_[np.ones(len(pos)), np.zeros(neg.size)]
    return float(roc_auc_score(labels, np.r_[pos, neg.ravel()]))


def _fingerprint(head_config: HeadConfig, config: TrainConfig, train: PairSet, val: PairSet,
                 *fixed: np.ndarray | None) -> str:
    """Identifies a run's data and every setting that changes its rounds, so that a checkpoint is only resumed
    by the run that wrote it (or by one that only stops later: ``epochs`` and ``patience`` may change)."""
    settings = {k: v for k, v in asdict(config).items() if k not in ("checkpoint_dir", "epochs", "patience")}
    h = hashlib.sha1(json.dumps([head_config.to_dict(), settings], sort_keys=True, default=str).encode())
    for pairs in (train, val):
        for array in (pairs.ctx, pairs.resp):
            h.update(np.ascontiguousarray(array).tobytes())
    for array in fixed:
        h.update(b"-" if array is None else np.ascontiguousarray(array).tobytes())
    return h.hexdigest()


def _check_negatives(negs: np.ndarray | None, pairs: PairSet, name: str) -> np.ndarray | None:
    if negs is None:
        return None
    negs = np.asarray(negs, dtype=np.int64)
    if negs.ndim != 2 or len(negs) != len(pairs) or negs.shape[1] < 1:
        raise ValueError(f"{name} must have shape ({len(pairs)}, K >= 1), got {negs.shape}")
    if negs.min() < 0 or negs.max() >= len(pairs.responses):
        raise ValueError(f"{name} holds indices outside the response table")
    return negs


def train_head(head_config: HeadConfig, train_features, train_pairs: PairSet, val_features, val_pairs: PairSet,
               config: TrainConfig, progress: bool = True, train_negatives: np.ndarray | None = None,
               val_negatives: np.ndarray | None = None) -> TrainResult:
    """Train a fresh head on (features, pairs); return the state with the best validation ROC-AUC.

    ``train_negatives`` (n_train, K) response indices fix the training negatives for every round
    instead of drawing fresh ones (the paper's protocol; lets several methods share one draw);
    ``val_negatives`` likewise fixes the validation negatives. The config's counts are then unused.
    """
    if len(train_pairs) == 0 or len(val_pairs) == 0:
        raise ValueError("training and validation sets must both hold pairs")
    train_negatives = _check_negatives(train_negatives, train_pairs, "train_negatives")
    val_negatives = _check_negatives(val_negatives, val_pairs, "val_negatives")
    start = time.perf_counter()
    torch.manual_seed(config.seed)
    rng = np.random.default_rng(config.seed)
    objective = get_objective(config.objective)
    spec = config.negatives() if train_negatives is None or val_negatives is None else None
    head = PMIHead(head_config)
    lr = config.lr if config.lr is not None else default_lr(head_config.dim)
    encoder = getattr(train_features, "module", None)
    tuned = [(n, p) for n, p in encoder.named_parameters() if p.requires_grad] if encoder is not None else []
    groups = [{"params": list(head.parameters())}]
    if tuned:
        groups.append({"params": [p for _, p in tuned], "lr": config.encoder_lr, "weight_decay": 0.0})
    optim = torch.optim.AdamW(groups, lr=lr, weight_decay=config.weight_decay)

    def snapshot() -> tuple[dict, dict]:
        return copy.deepcopy(head.state_dict()), {n: p.detach().clone() for n, p in tuned}

    def set_training(on: bool) -> None:
        head.train(on)
        if encoder is not None:
            encoder.train(on)

    val_negs = val_negatives if val_negatives is not None else \
        sample_negatives(val_pairs, spec, np.random.default_rng(config.seed + 1))
    best = (-math.inf, 0, snapshot())
    history: list[dict] = []
    first = 1
    if config.checkpoint_dir:
        if tuned:
            raise ValueError("checkpoint_dir resumes head-only training; it cannot restore trainable encoder features")
        fingerprint = _fingerprint(head_config, config, train_pairs, val_pairs, train_negatives, val_negatives)
        resumed = load_round(config.checkpoint_dir, fingerprint, head, optim, rng)
        if resumed is not None:
            (auc, epoch, state), history, first = resumed.best, resumed.history, resumed.epoch + 1
            best = (auc, epoch, (state, {}))
            if resumed.epoch - best[1] >= config.patience:
                first = config.epochs + 1  # the interrupted run had already stopped early
    bar = tqdm(range(first, config.epochs + 1), desc=f"train {config.objective}", disable=not progress,
               unit="round", initial=first - 1, total=config.epochs)
    for epoch in bar:
        negs = train_negatives if train_negatives is not None else sample_negatives(train_pairs, spec, rng)
        k = negs.shape[1]
        train_features.prepare(np.r_[train_pairs.ctx, np.repeat(train_pairs.ctx, k)],
                               np.r_[train_pairs.resp, negs.ravel()])
        order = rng.permutation(len(train_pairs))
        losses = []
        set_training(True)
        for s in range(0, len(order), config.batch_size):
            b = order[s:s + config.batch_size]
            c = train_pairs.ctx[b]
            # one features call per batch: a trainable encoder embeds each distinct text of it once
            scores = head(*train_features(np.r_[c, np.repeat(c, k)], np.r_[train_pairs.resp[b], negs[b].ravel()]))
            loss = objective(scores[:len(b)], scores[len(b):].view(len(b), k))
            optim.zero_grad(set_to_none=True)
            loss.backward()
            optim.step()
            losses.append(loss.item())
        set_training(False)
        auc = _val_auc(head, val_features, val_pairs, val_negs)
        history.append({"epoch": epoch, "loss": float(np.mean(losses)), "val_auc": auc})
        if auc > best[0]:
            best = (auc, epoch, snapshot())
        bar.set_postfix(loss=f"{history[-1]['loss']:.4f}", val_auc=f"{auc:.4f}", best=f"{best[0]:.4f}")
        if config.checkpoint_dir:
            save_round(config.checkpoint_dir, fingerprint, epoch, head, optim, (best[0], best[1], best[2][0]), history, rng)
        if epoch - best[1] >= config.patience:
            break
    head.load_state_dict(best[2][0])
    with torch.no_grad():
        for name, p in tuned:
            p.copy_(best[2][1][name])
    set_training(False)
    return TrainResult(head, best[1], best[0], history, time.perf_counter() - start)

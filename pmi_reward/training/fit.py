"""From pairs to a trained ``PMIScorer`` (embed once, train the head, package it with its provenance), and scoring
a trained one against seeded negatives (its test ROC-AUC)."""

from __future__ import annotations

import copy
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from sklearn.metrics import roc_auc_score

from ..data.mining import mine_lexical, mine_nearest, mine_scrambled
from ..data.negatives import NegativeSpec, sample_negatives
from ..data.pairs import PairSet
from ..data.records import DataError
from ..scoring.encoder import TextEncoder
from ..scoring.features import PairFeatures
from ..scoring.head import HeadConfig, PMIHead
from ..scoring.models import native_bf16
from ..scoring.scorer import PMIScorer
from ..scoring.templates import PromptTemplate
from .checkpoint import CHECKPOINT_NAME
from .loop import TrainConfig, TrainResult, head_lr, score_index_pairs, train_head
from .trainable import TrainableFeatures, check_top_layers, finish_tuning, make_trainable

__all__ = [
    "fit_scorer",
    "evaluate_auc",
    "mine_negatives",
    "score_with_negatives",
    "check_negative_draws",
    "check_encoder_dtype",
]


def mine_negatives(pairs: PairSet, spec: NegativeSpec, features: PairFeatures) -> None:
    """Mine the hard negatives ``spec`` asks for (lexical look-alikes, the encoder's nearest replies), once."""
    if spec.k_lexical and "lexical" not in pairs.mined:
        mine_lexical(pairs)
    if spec.k_nearest and "nearest" not in pairs.mined:
        if features.input_mode != "pair":
            raise ValueError("k_nearest mines by the context and reply embeddings: it needs input_mode pair")
        features.prepare(np.arange(len(pairs.contexts)), np.unique(pairs.resp))
        mine_nearest(pairs, features.u.numpy(), features.v.numpy())


def check_encoder_dtype(encoder: TextEncoder, train_encoder: str) -> None:
    """A ValueError unless an encoder that trains (``train_encoder`` full or lora) holds float32 weights, as asked
    (``EncoderSpec.dtype`` float32; ``auto`` too is refused, so that the rule is the same on every machine). AdamW steps
    the weights in their own dtype: in bfloat16 most of a fine-tune's small updates round away, and the scorer is saved
    in it. Mixed precision is ``bf16``: bfloat16 autocast over float32 weights."""
    if train_encoder == "none":
        return
    held = sorted({str(p.dtype).removeprefix("torch.") for p in encoder.model.parameters() if p.is_floating_point()})
    if encoder.requested_dtype != "float32" or held != ["float32"]:
        raise ValueError(
            f"train_encoder {train_encoder} trains the encoder's weights in the dtype they are loaded in (asked: "
            f"{encoder.requested_dtype}, held: {', '.join(held)}), where AdamW's small steps round away: load the "
            "encoder with --dtype float32, and pass --bf16 true for bfloat16 autocast over float32 weights"
        )


def _tuning_copy(encoder: TextEncoder) -> TextEncoder:
    """A copy of ``encoder`` to fine-tune: its own model and tokenizer; the same embedding cache and counts (the
    tuned weights never read or write it under the pretrained keys: they embed with gradients, outside the cache,
    and ``finish_tuning`` gives them a revision of their own)."""
    tuned = copy.copy(encoder)
    tuned.model, tuned.tokenizer = copy.deepcopy(encoder.model), copy.deepcopy(encoder.tokenizer)
    return tuned


def fit_scorer(
    train: PairSet,
    val: PairSet,
    encoder: TextEncoder,
    template: PromptTemplate,
    config: TrainConfig | None = None,
    head: HeadConfig | None = None,
    negatives: NegativeSpec | None = None,
    metadata: dict | None = None,
    progress: bool = True,
    train_negatives: np.ndarray | None = None,
    val_negatives: np.ndarray | None = None,
    start_head: PMIHead | None = None,
    in_place: bool = False,
) -> tuple[PMIScorer, TrainResult]:
    """Train a head of shape ``head`` on ``train`` (model selection on ``val``) and wrap it with the encoder.

    The scorer reads contexts as the training pairs were cut (``train.context_turns``). ``negatives`` is the
    mix drawn every round; fixed ``train_negatives``/``val_negatives`` (response-table indices, one row per
    pair) replace the draws; see ``train_head``. ``metadata`` is provenance, saved beside the scorer.
    ``start_head``: a trained head of this shape to continue from (``encoder`` the one it was trained on), validated as
    round 0, so that training can only replace it with a better round. A copy of it trains: the caller's head (and a
    scorer built on it) is left as it was, to compare the old scorer with the new one.

    With ``config.train_encoder`` full or lora the encoder is fine-tuned as a copy, in float32
    (``check_encoder_dtype``): ``encoder`` itself is left as it was (a scorer built on it keeps its embeddings), unless
    ``in_place``, for a caller done with the pretrained encoder (``pmi-reward train``): one model's memory less. The
    head's warm-up (``warmup_rounds``) is skipped when ``config.checkpoint_dir`` holds a checkpoint: the run resumes
    from it, warm-up included.
    """
    config = config or TrainConfig()
    check_encoder_dtype(encoder, config.train_encoder)  # before anything is embedded or trained
    if encoder.spec.quantize != "none":  # config.json never records it: the scorer would load on float32 embeddings
        raise ValueError(
            f"quantize {encoder.spec.quantize} would train and select the head on int8 embeddings, but a saved scorer "
            "never records it and loads with float32 ones: quantize is a serving choice; train on float32 embeddings "
            "(no --quantize), and pass --quantize when scoring"
        )
    negatives = negatives or NegativeSpec()
    head_config = head or HeadConfig()
    if head_config.dim is not None and head_config.dim != encoder.dim:  # it was replaced without a word
        raise ValueError(f"dim {head_config.dim} is not the encoder's width {encoder.dim}: leave it out")
    head_config = head_config.with_dim(encoder.dim)
    if config.in_batch_negatives and head_config.input_mode != "pair":
        raise ValueError(
            "in_batch_negatives pairs embeddings made apart (input_mode pair); in prompt mode every "
            "negative is its own encoder pass: ask for k_random instead"
        )
    if config.train_encoder != "none":  # checked before anything is embedded or the warm-up trains
        check_top_layers(encoder.model, config.train_encoder, config.encoder_layers, layer=encoder.spec.layer)
    if negatives.k_scrambled:  # new reply texts: before the features size their tables
        mine_scrambled(train)
        mine_scrambled(val)
    train_features: Any = PairFeatures(
        encoder, template, train, head_config.input_mode, progress, head_config.line_turns
    )
    val_features: Any = PairFeatures(encoder, template, val, head_config.input_mode, progress, head_config.line_turns)
    if train_negatives is None or val_negatives is None:
        mine_negatives(train, negatives, train_features)
        mine_negatives(val, negatives, val_features)
    fixed: dict[str, Any] = {"train_negatives": train_negatives, "val_negatives": val_negatives, "negatives": negatives}
    if start_head is not None and start_head.config != head_config:
        raise ValueError(f"start_head is a {start_head.config} head, this training asks for {head_config}")
    if start_head is not None:  # train_head trains the head it is given in place
        start_head = copy.deepcopy(start_head)
    origin = start_head  # what the run starts from, for its checkpoints' fingerprint: the warm-up is part of the run
    if config.train_encoder != "none":
        resuming = config.checkpoint_dir is not None and (Path(config.checkpoint_dir) / CHECKPOINT_NAME).is_file()
        if config.warmup_rounds and not resuming:  # the head alone first, on the frozen encoder's cached embeddings
            warm = replace(
                config, train_encoder="none", epochs=config.warmup_rounds, steps_per_round=None, checkpoint_dir=None
            )
            start_head = train_head(
                head_config, train_features, train, val_features, val, warm, progress, head=start_head, **fixed
            ).head
        if not in_place:
            encoder = _tuning_copy(encoder)
        torch.manual_seed(config.seed)  # LoRA's fresh adapters: drawn from the run's seed, not the process's state
        make_trainable(
            encoder,
            config.train_encoder,
            top_layers=config.encoder_layers,
            attention_dropout=config.encoder_attention_dropout,
            activation_checkpointing=config.encoder_activation_checkpointing,
        )
        bf16 = native_bf16(encoder.device) if config.bf16 is None else config.bf16
        train_features, val_features = (
            TrainableFeatures(
                encoder, template, pairs, head_config.line_turns, bf16=bf16, input_mode=head_config.input_mode
            )
            for pairs in (train, val)
        )
    result = train_head(
        head_config, train_features, train, val_features, val, config, progress, head=start_head, **fixed, origin=origin
    )
    if config.train_encoder != "none":
        finish_tuning(encoder)
    meta = {
        **(metadata or {}),
        # the pretrained model, also when a fine-tuned scorer is tuned again (its encoder is then ./encoder)
        **({"base_encoder": encoder.base_model} if config.train_encoder != "none" and encoder.base_model else {}),
        # bf16 as it ran (None asks for the machine's native support); like the CPU's float sums, it is the machine's,
        # so a checkpoint's fingerprint keeps what was asked. lr as used (None asks for default_lr), and the head's
        # scaled lr beside the encoder's while the encoder trained
        "training": {
            **asdict(config),
            "lr": head_lr(config, head_config.dim or 1),
            **(
                {"bf16": bf16, "head_lr_with_encoder": head_lr(config, head_config.dim or 1, encoder_trains=True)}
                if config.train_encoder != "none"
                else {}
            ),
            **asdict(negatives),
        },
        **result.summary(),
        "train_pairs": len(train),
        "val_pairs": len(val),
    }
    return PMIScorer(encoder, template, result.head, meta, context_turns=train.context_turns), result


def score_with_negatives(
    scorer: PMIScorer, pairs: PairSet, spec: NegativeSpec | None, seed: int = 0, progress: bool = False
) -> tuple[np.ndarray, np.ndarray | None]:
    """Scores of the positives (n,) and of seeded negatives of the given mix (n, K; None without a mix).

    The negative columns come in ``sample_negatives`` order (``KINDS``).
    """
    if spec is not None and spec.k_scrambled:  # new reply texts: before the features size their tables
        mine_scrambled(pairs)
    features = PairFeatures(
        scorer.encoder, scorer.template, pairs, scorer.input_mode, progress, scorer.head.config.line_turns
    )
    negs = None
    if spec is not None:  # first: a mix these pairs or this scorer cannot give fails before the positives are scored
        mine_negatives(pairs, spec, features)
        negs = sample_negatives(pairs, spec, np.random.default_rng(seed))
    pos = score_index_pairs(scorer.head, features, pairs.ctx, pairs.resp)
    if negs is None:
        return pos, None
    return pos, score_index_pairs(scorer.head, features, np.repeat(pairs.ctx[:, None], negs.shape[1], 1), negs)


def check_negative_draws(pairs: PairSet, spec: NegativeSpec, where: str) -> None:
    """A DataError naming ``where`` if ``pairs`` cannot give ``spec``'s negatives (e.g. every pair has the same
    reply), raised before anything is embedded or trained rather than after. One seeded draw, the mined kinds as
    random ones: they fall back to random replies where they find none, and need embeddings (or, scrambles, new
    texts) to be mined."""
    if not spec.k:
        return
    mined = spec.k_lexical + spec.k_nearest + spec.k_scrambled
    try:
        sample_negatives(
            pairs,
            replace(spec, k_random=spec.k_random + mined, k_lexical=0, k_nearest=0, k_scrambled=0),
            np.random.default_rng(0),
        )
    except ValueError as err:
        raise DataError(f"{where}: {err}") from None


def evaluate_auc(scorer: PMIScorer, pairs: PairSet, spec: NegativeSpec, seed: int = 0, progress: bool = False) -> float:
    """ROC-AUC of positives against seeded negatives of the given mix, scored end to end."""
    pos, neg = score_with_negatives(scorer, pairs, spec, seed, progress)
    assert neg is not None  # a mix was given
    return float(roc_auc_score(np.r_[np.ones(len(pos)), np.zeros(neg.size)], np.r_[pos, neg.ravel()]))

import copy
import json
from dataclasses import replace

import numpy as np
import pytest
import torch
from conftest import TOPICS

from pmi_reward.data.negatives import NegativeSpec
from pmi_reward.data.pairs import PairSet
from pmi_reward.scoring.features import TensorFeatures
from pmi_reward.scoring.head import HeadConfig, PMIHead
from pmi_reward.scoring.templates import TEMPLATES
from pmi_reward.training import loop
from pmi_reward.training.fit import evaluate_auc, fit_scorer
from pmi_reward.training.job import TrainData, build_pairs
from pmi_reward.training.loop import TrainConfig, default_lr, score_index_pairs, train_head

TOPIC_OF = {t: i for i, (name, turns) in enumerate(TOPICS.items()) for t in turns}


def _topic_features(pairs: PairSet, seed: int) -> TensorFeatures:
    """One-hot topic plus noise: contexts and responses of one dialogue share a topic."""
    g = torch.Generator().manual_seed(seed)

    def table(texts, first_line):
        ids = [TOPIC_OF[(t.split("\n")[-1] if first_line else t)] for t in texts]
        return torch.nn.functional.one_hot(torch.tensor(ids), 8).float() + 0.3 * torch.randn(len(ids), 8, generator=g)

    return TensorFeatures(table(pairs.contexts, True), table(pairs.responses, False))


@pytest.fixture(scope="module")
def split(topic_dialogues):
    return PairSet.from_dialogues(topic_dialogues[:60]), PairSet.from_dialogues(topic_dialogues[60:])


def test_training_learns_topic_match_and_keeps_best_state(split):
    train, val = split
    config = TrainConfig(batch_size=32, epochs=15, patience=15, seed=0, lr=3e-3)
    ft, fv = _topic_features(train, 0), _topic_features(val, 1)
    result = train_head(HeadConfig(dim=8), ft, train, fv, val, config, progress=False, negatives=NegativeSpec(4, 0, 0))
    # a quarter of random negatives share the topic (indistinguishable), so the best AUC is 1 - 1/8
    assert 0.8 < result.best_val_auc <= 0.9
    assert max(h["val_auc"] for h in result.history) == result.best_val_auc
    pos = score_index_pairs(result.head, fv, val.ctx, val.resp)
    # same-topic pairs: PMI log 4 > 0; other-topic pairs: PMI -> -inf
    topic = [TOPIC_OF[r] for r in val.response_texts]
    other = np.array([next(j for j in range(len(val)) if topic[j] != topic[i]) for i in range(len(val))])
    neg = score_index_pairs(result.head, fv, val.ctx, val.resp[other])
    assert np.median(pos) > 0.5 and np.median(neg) < -1.0


def _train_topics(train, val, config: TrainConfig, negatives: NegativeSpec):
    return train_head(
        HeadConfig(dim=8),
        _topic_features(train, 0),
        train,
        _topic_features(val, 1),
        val,
        config,
        progress=False,
        negatives=negatives,
    )


def test_training_is_deterministic(split):
    train, val = split
    config = TrainConfig(batch_size=16, epochs=4, patience=10, seed=7, lr=3e-3)
    runs = [_train_topics(train, val, config, NegativeSpec(2, 1, 1)) for _ in range(2)]
    assert runs[0].untimed_history() == runs[1].untimed_history()
    for a, b in zip(runs[0].head.state_dict().values(), runs[1].head.state_dict().values(), strict=True):
        assert torch.equal(a, b)


def test_early_stopping_stops(split):
    train, val = split
    config = TrainConfig(epochs=50, patience=2, lr=0.0)  # lr 0: never improves
    result = _train_topics(train, val, config, NegativeSpec(1, 0, 0))
    assert len(result.history) == 3 and result.best_epoch == 1


@pytest.mark.parametrize("mode", ["pair", "prompt"])
def test_fit_scorer_end_to_end_with_tiny_encoder(split, tiny_encoder, mode):
    train, val = split
    config = TrainConfig(batch_size=32, epochs=3, patience=5)
    scorer, result = fit_scorer(
        train,
        val,
        tiny_encoder,
        TEMPLATES["en"],
        config,
        HeadConfig(input_mode=mode),
        NegativeSpec(2, 1, 1),
        progress=False,
    )
    assert len(result.history) == 3 and scorer.metadata["best_val_auc"] == result.best_val_auc
    encoded = tiny_encoder.stats.texts
    distinct = len(train.contexts) + len(train.responses) + len(val.contexts) + len(val.responses)
    if mode == "pair":
        assert encoded <= distinct  # negatives cost no encoding
    else:
        assert encoded > len(train) * 2  # every round's new combinations are encoded
    auc = evaluate_auc(scorer, val, NegativeSpec(2, 0, 0))
    assert 0.0 <= auc <= 1.0
    s = scorer.score(val.context_texts[:5], val.response_texts[:5])
    assert s.shape == (5,) and np.isfinite(s).all()
    # the Python API records the context turns in the scorer (not only the CLI): rewards read contexts alike
    assert scorer.context_turns == train.context_turns == 3
    assert scorer.metadata["training"]["k_random"] == 2 and scorer.metadata["training"]["batch_size"] == 32


def test_scorers_read_contexts_as_their_pairs_were_cut(topic_dialogues, tiny_encoder):
    train = PairSet.from_dialogues(topic_dialogues[:40], max_context_turns=2)
    val = PairSet.from_dialogues(topic_dialogues[40:60], max_context_turns=2)
    scorer, _ = fit_scorer(train, val, tiny_encoder, TEMPLATES["en"], TrainConfig(epochs=1), progress=False)
    assert scorer.context_turns == 2
    pair_files = PairSet.from_pairs(val.context_texts, val.response_texts)
    scorer, _ = fit_scorer(pair_files, val, tiny_encoder, TEMPLATES["en"], TrainConfig(epochs=1), progress=False)
    assert scorer.context_turns is None  # ready-made pairs: unknown, every turn is read


class _CountingFeatures(TensorFeatures):
    """Records every index pair the loop asks for."""

    def __init__(self, base: TensorFeatures) -> None:
        super().__init__(base.u, base.v)
        self.asked: set[tuple[int, int]] = set()

    def __call__(self, ctx, resp):
        self.asked.update(zip(np.ravel(ctx).tolist(), np.ravel(resp).tolist(), strict=True))
        return super().__call__(ctx, resp)


def test_fixed_negatives_are_the_only_negatives_seen(split):
    train, val = split
    rng = np.random.default_rng(0)
    from pmi_reward.data.negatives import sample_negatives

    train_negs = sample_negatives(train, NegativeSpec(2, 0, 0), rng)
    val_negs = sample_negatives(val, NegativeSpec(3, 0, 0), rng)
    ft = _CountingFeatures(_topic_features(train, 0))
    config = TrainConfig(batch_size=32, epochs=3, patience=5, lr=3e-3)
    result = train_head(
        HeadConfig(dim=8),
        ft,
        train,
        _topic_features(val, 1),
        val,
        config,
        progress=False,
        train_negatives=train_negs,
        val_negatives=val_negs,
    )
    allowed = set(zip(train.ctx.tolist(), train.resp.tolist(), strict=True))
    allowed |= set(zip(np.repeat(train.ctx, 2).tolist(), train_negs.ravel().tolist(), strict=True))
    assert ft.asked and ft.asked <= allowed  # no fresh draws, whatever the config's counts say
    # the validation AUC is the one of the given negatives
    fv = _topic_features(val, 1)
    pos = score_index_pairs(result.head, fv, val.ctx, val.resp)
    neg = score_index_pairs(result.head, fv, np.repeat(val.ctx[:, None], 3, 1), val_negs)
    from pmi_reward.evaluation.metrics import roc_auc

    assert roc_auc(pos, neg) == pytest.approx(result.best_val_auc, abs=1e-6)
    with pytest.raises(ValueError, match="train_negatives"):
        train_head(HeadConfig(dim=8), ft, train, fv, val, config, progress=False, train_negatives=train_negs[:5])


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("batch_size", 0),
        ("encoder_batch_size", 0),
        ("epochs", 0),
        ("patience", -1),
        ("steps_per_round", -1),
        ("encoder_layers", 0),
        ("warmup_rounds", -1),
        ("lr", -1e-3),
        ("lr", float("nan")),
        ("weight_decay", -0.1),
        ("encoder_attention_dropout", 1.5),
        ("train_encoder", "lorra"),
        ("select_by", "val_auc"),
    ],
)
def test_train_config_refuses_options_out_of_range(option, value):
    """Refused when read (a batch of 0 was a ZeroDivisionError, 0 epochs saved an untrained head, a negative patience
    or steps_per_round trained silently less, a misspelt train_encoder failed only after the warm-up)."""
    with pytest.raises(ValueError, match=option):
        TrainConfig(**{option: value})


def test_a_diverged_head_is_a_clear_error(split):
    """Scores that are not numbers (a learning rate far too high) say so, not sklearn's 'Input contains NaN', and
    name the round; with no finite round to keep, an error. A start head that is not finite is round 0."""
    train, val = split
    config = TrainConfig(batch_size=16, epochs=2, lr=1e30, objective="chi2")
    ft, fv = _topic_features(train, 0), _topic_features(val, 1)
    with pytest.raises(ValueError, match="round 1: .*training diverged"):
        train_head(HeadConfig(8, hidden=[16]), ft, train, fv, val, config, False)
    start = PMIHead(HeadConfig(8, hidden=[16]))
    with torch.no_grad():
        next(start.parameters()).fill_(float("nan"))
    with pytest.raises(ValueError, match="round 0: .*training diverged.*the head training starts from"):
        train_head(HeadConfig(8, hidden=[16]), ft, train, fv, val, replace(config, lr=1e-3), False, head=start)


class _Diverging(TensorFeatures):
    """Training batches that turn to NaN from round ``at`` on, as a bf16 overflow or an lr spike leaves them."""

    def __init__(self, base: TensorFeatures, at: int) -> None:
        super().__init__(base.u, base.v)
        self.at, self.rounds = at, 0

    def prepare(self, ctx, resp) -> None:  # once per training round
        self.rounds += 1

    def __call__(self, ctx, resp):
        u, v = super().__call__(ctx, resp)
        return (u * float("nan"), v) if torch.is_grad_enabled() and self.rounds >= self.at else (u, v)


def test_a_round_that_diverges_after_good_ones_ends_the_run_with_the_best(split):
    """One non-finite round after good ones raised 'training diverged' and returned nothing (a resume repeated it):
    it is recorded (val_auc None, JSON null), a warning names it and the best round, and the result is the one of a
    run that stopped before it. A start head validated as round 0 is a finite round too."""
    train, val = split
    config = TrainConfig(batch_size=16, epochs=6, patience=6, seed=0, lr=3e-3)
    ft, fv, negatives = _topic_features(train, 0), _topic_features(val, 1), NegativeSpec(4, 0, 0)
    with pytest.warns(UserWarning, match=r"round 3: .*training diverged.*; stopping with round \d, the best so far"):
        result = train_head(HeadConfig(dim=8), _Diverging(ft, 3), train, fv, val, config, False, negatives=negatives)
    before = train_head(HeadConfig(dim=8), ft, train, fv, val, replace(config, epochs=2), False, negatives=negatives)
    assert result.untimed_history()[:2] == before.untimed_history()
    assert result.untimed_history()[2] == {"epoch": 3, "loss": None, "val_auc": None, "val_loss": None}
    assert (result.best_epoch, result.best_val_auc) == (before.best_epoch, before.best_val_auc)
    for a, b in zip(result.head.state_dict().values(), before.head.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    assert result.summary()["diverged_round"] == 3 and result.summary()["epochs_run"] == 3
    assert "diverged_round" not in before.summary()
    assert json.loads(json.dumps(result.history, allow_nan=False))[2]["val_auc"] is None
    start = copy.deepcopy(before.head.state_dict())
    with pytest.warns(UserWarning, match="round 1: .*stopping with round 0"):
        kept = train_head(
            HeadConfig(dim=8), _Diverging(ft, 1), train, fv, val, config, False, negatives=negatives, head=before.head
        )
    assert kept.best_epoch == 0 and [h["val_auc"] is None for h in kept.history] == [False, True]
    for a, b in zip(kept.head.state_dict().values(), start.values(), strict=True):
        assert torch.equal(a, b)


def test_the_encoder_and_head_train_at_their_own_lrs_recorded_as_used(split, tiny_encoder, monkeypatch):
    """While the encoder trains, the head's lr is scaled by encoder_batch_size / batch_size and the encoder's weights
    take encoder_lr without weight decay; the warm-up trains the head alone at lr. The metadata records the lrs used
    (lr None was recorded null; default_lr's value is recorded now)."""
    groups = []
    init = loop._Run.__init__

    def spy(self, *args, **kwargs):
        init(self, *args, **kwargs)
        groups.append([(len(g["params"]), g["lr"], g["weight_decay"]) for g in self.optim.param_groups])

    monkeypatch.setattr(loop._Run, "__init__", spy)
    train, val = split
    config = TrainConfig(
        batch_size=16,
        encoder_batch_size=8,
        epochs=1,
        warmup_rounds=1,
        steps_per_round=1,
        train_encoder="lora",
        encoder_lr=1e-4,
        weight_decay=0.05,
        bf16=False,
    )
    scorer, _ = fit_scorer(
        train, val, tiny_encoder, TEMPLATES["en"], config, HeadConfig(hidden=[16]), NegativeSpec(2, 0, 0), False
    )
    lr, n_head = default_lr(tiny_encoder.dim), len(list(scorer.head.parameters()))
    assert tiny_encoder.dim == 32 and lr == pytest.approx(0.032, rel=1e-12)  # 1e-3 * 1024 / 32, not default_lr's own
    assert groups[0] == [(n_head, lr, 0.05)]  # the warm-up: the head alone at batch_size
    (head_group, encoder_group) = groups[1]
    assert head_group == (n_head, lr * (8 / 16), 0.05) and encoder_group[0] > 0 and encoder_group[1:] == (1e-4, 0.0)
    training = scorer.metadata["training"]
    assert (training["lr"], training["head_lr_with_encoder"], training["encoder_lr"]) == (lr, lr * (8 / 16), 1e-4)


@pytest.mark.parametrize(("dim", "lr"), [(384, 2.6667e-3), (768, 1.3333e-3), (1024, 1e-3), (32, 0.032)])
def test_the_default_learning_rate_is_the_papers_rule(dim, lr):
    """DEVELOPERS.md's rule, lr = 1e-3 x 1024 / d, by value: no shipped config sets lr, so every scorer trained by
    `make scorer`, `make demo` or a recipe trains at it (MiniLM: 384-d, mpnet: 768-d)."""
    assert default_lr(dim) == pytest.approx(lr, rel=1e-4)


def test_the_data_provenance_names_every_option_that_shaped_the_pairs(tmp_path, topic_dialogues):
    """max_pairs_per_dialogue, the split's fractions and seed and max_dialogues decide which pairs a scorer was
    trained on: the metadata's source names them (it named only the file, the skip and the context turns)."""
    path = tmp_path / "dialogues.jsonl"
    path.write_text("".join(json.dumps({"id": d.id, "turns": list(d.turns)}) + "\n" for d in topic_dialogues))
    data = TrainData(
        dialogues=str(path),
        max_dialogues=50,
        max_pairs_per_dialogue=2,
        val_fraction=0.2,
        test_fraction=0.1,
        split_seed=3,
    )
    *_, source = build_pairs(data)
    assert source == {
        "dialogues": str(path),
        "skip_dialogues": 0,
        "max_dialogues": 50,
        "n_dialogues": [35, 10, 5],
        "max_context_turns": 3,
        "max_pairs_per_dialogue": 2,
        "val_fraction": 0.2,
        "test_fraction": 0.1,
        "split_seed": 3,
    }


def test_a_quantized_encoder_is_refused_for_training_and_onnx_float32_trains(
    split, tiny_encoder, tmp_path, monkeypatch
):
    """``pmi-reward train --backend onnx --quantize int8`` trained, selected and evaluated the head on int8 embeddings,
    but config.json never records quantize: the saved scorer loaded with float32 embeddings, other than its head's
    and its recorded AUCs'. Refused before anything is embedded; the onnx backend in float32 still trains."""
    from pmi_reward.scoring.encoder import EncoderSpec, TextEncoder

    monkeypatch.setenv("PMI_REWARD_CACHE", str(tmp_path / "cache"))  # where an ONNX export is kept
    train, val = split

    def twin(**runtime) -> TextEncoder:
        spec = EncoderSpec(**{**tiny_encoder.spec.to_dict(), **runtime})
        return TextEncoder(spec, device="cpu", model=tiny_encoder.model, tokenizer=tiny_encoder.tokenizer)

    for quantize in ("int8", "int8-block"):
        quantized = twin(backend="onnx", quantize=quantize)
        with pytest.raises(ValueError, match=rf"quantize {quantize} .*serving choice.*--quantize when scoring"):
            fit_scorer(train, val, quantized, TEMPLATES["en"], TrainConfig(epochs=1), progress=False)
        assert quantized.stats.texts == 0
    scorer, _ = fit_scorer(train, val, twin(backend="onnx"), TEMPLATES["en"], TrainConfig(epochs=1), progress=False)
    assert scorer.encoder.spec.backend == "onnx" and np.isfinite(scorer.score(["I love pizza."], ["Pasta!"])).all()

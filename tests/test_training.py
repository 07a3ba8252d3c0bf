import numpy as np
import pytest
import torch
from conftest import TOPICS

from pmi_reward.data.negatives import NegativeSpec
from pmi_reward.data.pairs import PairSet
from pmi_reward.scoring.features import TensorFeatures
from pmi_reward.scoring.head import HeadConfig
from pmi_reward.scoring.templates import TEMPLATES
from pmi_reward.training.fit import evaluate_auc, fit_scorer
from pmi_reward.training.loop import TrainConfig, score_index_pairs, train_head

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
    """Scores that are not numbers (a learning rate far too high) say so, not sklearn's 'Input contains NaN'."""
    train, val = split
    config = TrainConfig(batch_size=16, epochs=2, lr=1e30, objective="chi2")
    with pytest.raises(ValueError, match="training diverged"):
        train_head(
            HeadConfig(8, hidden=[16]), _topic_features(train, 0), train, _topic_features(val, 1), val, config, False
        )

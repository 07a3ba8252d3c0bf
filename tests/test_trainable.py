import numpy as np
import pytest
import torch

from pmi_reward.data.negatives import NegativeSpec
from pmi_reward.data.pairs import PairSet
from pmi_reward.scoring.encoder import TextEncoder
from pmi_reward.scoring.head import HeadConfig
from pmi_reward.scoring.scorer import LOCAL_ENCODER, PMIScorer
from pmi_reward.scoring.templates import TEMPLATES
from pmi_reward.training.fit import fit_scorer
from pmi_reward.training.loop import TrainConfig, score_index_pairs, train_head
from pmi_reward.training.trainable import LoraSpec, TrainableFeatures, add_lora, merge_and_save


def test_lora_adapters_train_in_the_one_loop_and_merge(topic_dialogues, tiny_encoder_factory, tmp_path):
    train, val = PairSet.from_dialogues(topic_dialogues[:24]), PairSet.from_dialogues(topic_dialogues[60:72])
    enc = tiny_encoder_factory("bert", "mean")
    base = {n: p.detach().clone() for n, p in enc.model.named_parameters()}
    model = add_lora(enc, LoraSpec(r=4, alpha=8, dropout=0.0, target_modules=("query", "value")))
    lora = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    assert lora and all("lora_" in n for n in lora)
    ft, fv = (TrainableFeatures(enc, TEMPLATES["en"], p) for p in (train, val))
    config = TrainConfig(batch_size=16, epochs=3, patience=5, lr=3e-3, encoder_lr=1e-2)
    result = train_head(
        HeadConfig(enc.dim), ft, train, fv, val, config, progress=False, negatives=NegativeSpec(2, 0, 0)
    )
    after = dict(model.named_parameters())
    assert any(not torch.equal(after[n], v) for n, v in lora.items() if "lora_B" in n)  # adapters moved
    assert all(
        torch.equal(after[n].detach(), base[n.replace("base_model.model.", "").replace(".base_layer", "")])
        for n in after
        if "lora_" not in n
    )  # the base weights did not
    assert not model.training
    # the merged encoder, saved and reloaded as a plain model, embeds exactly like the adapted one
    pos_before = score_index_pairs(result.head, fv, val.ctx, val.resp)
    spec = merge_and_save(enc, tmp_path / "merged")
    reloaded = TextEncoder(spec, device="cpu", tokenizer=enc.tokenizer)
    texts = val.contexts[:5]
    np.testing.assert_allclose(reloaded.encode(texts, keep="end"), enc.encode(texts, keep="end"), atol=1e-5)
    fm = TrainableFeatures(reloaded, TEMPLATES["en"], val)
    np.testing.assert_allclose(score_index_pairs(result.head, fm, val.ctx, val.resp), pos_before, atol=1e-4)


GPU = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (benchmarks/gpu_check.sh)")


@pytest.mark.parametrize(
    ("mode", "bf16", "device"),
    [
        ("full", False, "cpu"),
        ("lora", False, "cpu"),
        ("full", True, "cpu"),
        pytest.param("full", True, "cuda", marks=GPU),
        pytest.param("lora", False, "cuda", marks=GPU),
    ],
)
def test_fine_tuning_learns_and_the_scorer_carries_its_encoder(
    mode, bf16, device, topic_dialogues, tiny_encoder_factory, tmp_path
):
    """Fine-tuning (in float32, or under bfloat16 autocast; on the CPU, or on a GPU where the head stays on the CPU)
    lowers the training loss and raises validation AUC on a small config-built encoder, and the saved scorer (its
    encoder inside, float32 weights) loads to identical scores, with cache keys apart from the pretrained
    encoder's."""
    train, val = PairSet.from_dialogues(topic_dialogues[:48]), PairSet.from_dialogues(topic_dialogues[60:80])
    enc = tiny_encoder_factory("bert", "mean", device=device)
    pretrained_key = enc.spec.fingerprint(enc.pooling)
    config = TrainConfig(
        batch_size=16,
        encoder_batch_size=16,
        epochs=6,
        patience=6,
        lr=3e-3,
        encoder_lr=3e-3 if mode == "full" else 1e-2,
        train_encoder=mode,
        warmup_rounds=2,
        steps_per_round=4,
        in_batch_negatives=True,
        bf16=bf16,
    )
    scorer, result = fit_scorer(
        train, val, enc, TEMPLATES["en"], config, HeadConfig(line_turns=2), NegativeSpec(2, 0, 1), progress=False
    )
    assert result.history[0]["epoch"] == 0  # the warmed-up head on the pretrained encoder, validated first
    assert result.summary()["epochs_run"] == len(result.history) - 1  # round 0 trains nothing
    assert next(scorer.encoder.model.parameters()).device.type == device
    losses = [h["loss"] for h in result.history[1:]]
    aucs = [h["val_auc"] for h in result.history]
    assert losses[-1] < losses[0] and max(aucs) > aucs[0]
    assert scorer.encoder.spec.model == LOCAL_ENCODER and scorer.encoder.spec.revision
    assert scorer.metadata["base_encoder"] == "tiny-bert"  # what the model card names as the base model
    assert scorer.encoder.spec.fingerprint(scorer.encoder.pooling) != pretrained_key
    assert not any(p.requires_grad for p in scorer.encoder.model.parameters())
    assert all(p.dtype == torch.float32 for p in scorer.encoder.model.parameters())
    contexts, replies = val.context_texts[:6], val.response_texts[:6]
    before = scorer.score(contexts, replies)
    scorer.save_pretrained(tmp_path / "s")
    assert (tmp_path / "s" / "encoder" / "config.json").is_file()
    loaded = PMIScorer.from_pretrained(tmp_path / "s")
    np.testing.assert_allclose(loaded.score(contexts, replies), before, atol=1e-5)


def test_a_continued_head_is_round_0_and_never_lost(topic_dialogues, tiny_encoder_factory):
    """Training that continues a head validates it first (round 0); when every round is worse (here a learning
    rate that wrecks the head), the result is the start, unchanged."""
    train, val = PairSet.from_dialogues(topic_dialogues[:24]), PairSet.from_dialogues(topic_dialogues[60:72])
    enc = tiny_encoder_factory("bert", "mean")
    ft, fv = (TrainableFeatures(enc, TEMPLATES["en"], p) for p in (train, val))
    spec = NegativeSpec(2, 0, 0)
    warm = train_head(
        HeadConfig(enc.dim), ft, train, fv, val, TrainConfig(batch_size=16, epochs=4), False, negatives=spec
    )
    start = {k: v.clone() for k, v in warm.head.state_dict().items()}
    wreck = TrainConfig(batch_size=16, epochs=2, patience=5, lr=50.0)
    result = train_head(HeadConfig(enc.dim), ft, train, fv, val, wreck, False, negatives=spec, head=warm.head)
    assert [h["epoch"] for h in result.history] == [0, 1, 2]
    assert result.history[0]["loss"] is None
    assert max(h["val_auc"] for h in result.history[1:]) < result.history[0]["val_auc"]  # the rounds were worse
    assert result.best_epoch == 0 and result.best_val_auc == result.history[0]["val_auc"]
    assert all(torch.equal(v, start[k]) for k, v in result.head.state_dict().items())


class _CountingFeatures(TrainableFeatures):
    """Records each training batch's reply indices (under grad): its gold replies, then its negatives."""

    def __init__(self, *args, k: int, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.k, self.batches = k, []

    def __call__(self, ctx, resp):
        if torch.is_grad_enabled():
            self.batches.append(np.asarray(resp))
        return super().__call__(ctx, resp)


def test_encoder_training_steps_take_encoder_batch_size_positives(topic_dialogues, tiny_encoder_factory):
    train, val = PairSet.from_dialogues(topic_dialogues[:24]), PairSet.from_dialogues(topic_dialogues[60:72])
    enc = tiny_encoder_factory("bert", "mean")
    enc.model.requires_grad_(True)
    ft = _CountingFeatures(enc, TEMPLATES["en"], train, k=2)
    fv = TrainableFeatures(enc, TEMPLATES["en"], val)
    config = TrainConfig(batch_size=64, encoder_batch_size=8, epochs=1, steps_per_round=3, train_encoder="full")
    train_head(HeadConfig(enc.dim), ft, train, fv, val, config, False, negatives=NegativeSpec(2, 0, 0))
    assert [len(b) // (1 + ft.k) for b in ft.batches] == [8, 8, 8]


def test_while_the_encoder_trains_random_negatives_are_the_batch_replies(topic_dialogues, tiny_encoder_factory):
    """The random negatives of an encoder-training batch are replies the batch embeds anyway; the other kinds (here a
    line of the context) are drawn as before."""
    train = PairSet.from_dialogues(topic_dialogues[:24], max_context_turns=2)
    val = PairSet.from_dialogues(topic_dialogues[60:72], max_context_turns=2)
    enc = tiny_encoder_factory("bert", "mean")
    enc.model.requires_grad_(True)
    ft = _CountingFeatures(enc, TEMPLATES["en"], train, k=3)
    fv = TrainableFeatures(enc, TEMPLATES["en"], val)
    config = TrainConfig(batch_size=64, encoder_batch_size=8, epochs=1, steps_per_round=4, train_encoder="full")
    train_head(HeadConfig(enc.dim), ft, train, fv, val, config, False, negatives=NegativeSpec(2, 0, 1))
    assert len(ft.batches) == 4
    lines = {int(x) for x in train.lines}
    for resp in ft.batches:
        gold, negs = resp[:8], resp[8:].reshape(8, 3)
        assert set(negs[:, :2].ravel()) <= set(gold)  # random: other replies of the batch
        assert set(negs[:, 2]) <= lines  # context: a line of the context


def test_the_warm_up_is_the_frozen_training(topic_dialogues, tiny_encoder_factory):
    """``warmup_rounds`` trains the head exactly as a frozen-encoder run of that many full rounds would (the encoder's
    ``steps_per_round`` does not cut it short), so that fine-tuning starts from the frozen scorer (round 0)."""
    train, val = PairSet.from_dialogues(topic_dialogues[:24]), PairSet.from_dialogues(topic_dialogues[60:72])
    spec = NegativeSpec(2, 0, 0)
    frozen_config = TrainConfig(batch_size=8, epochs=3, patience=3)
    _, frozen = fit_scorer(
        train, val, tiny_encoder_factory(), TEMPLATES["en"], frozen_config, HeadConfig(), spec, progress=False
    )
    tuned_config = TrainConfig(
        batch_size=8, warmup_rounds=3, patience=3, epochs=1, steps_per_round=1, train_encoder="full", bf16=False
    )
    _, tuned = fit_scorer(
        train, val, tiny_encoder_factory(), TEMPLATES["en"], tuned_config, HeadConfig(), spec, progress=False
    )
    assert tuned.history[0]["epoch"] == 0
    assert tuned.history[0]["val_auc"] == pytest.approx(frozen.best_val_auc, abs=1e-6)


@pytest.mark.parametrize("kind", ["bert", "llama"])
def test_encoder_layers_trains_only_the_top_layers(kind, topic_dialogues, tiny_encoder_factory):
    """``encoder_layers: 1`` moves the top layer (and a final norm after it) and nothing below it."""
    train, val = PairSet.from_dialogues(topic_dialogues[:24]), PairSet.from_dialogues(topic_dialogues[60:72])
    enc = tiny_encoder_factory(kind, "mean")
    before = {n: p.detach().clone() for n, p in enc.model.named_parameters()}
    config = TrainConfig(
        batch_size=8, epochs=1, steps_per_round=3, train_encoder="full", encoder_layers=1, encoder_lr=1e-2
    )
    scorer, _ = fit_scorer(
        train, val, enc, TEMPLATES["en"], config, HeadConfig(), NegativeSpec(2, 0, 0), progress=False
    )
    moved = {n for n, p in scorer.encoder.model.named_parameters() if not torch.equal(p, before[n])}
    top = "encoder.layer.1." if kind == "bert" else "layers.1."
    assert moved and all(n.startswith(top) or n.startswith(("pooler.", "norm.")) for n in moved)
    assert any(n.startswith(top) for n in moved)
    assert kind == "bert" or "norm.weight" in moved  # Llama's final norm follows the stack: it trains too


def test_encoder_layers_is_checked(tiny_encoder_factory):
    from pmi_reward.training.trainable import make_trainable

    with pytest.raises(ValueError, match="1..2"):
        make_trainable(tiny_encoder_factory(), "full", top_layers=3)
    with pytest.raises(ValueError, match="LoRA"):
        make_trainable(tiny_encoder_factory(), "lora", top_layers=1)


def test_bf16_features_run_under_autocast_and_return_float32(topic_dialogues, tiny_encoder_factory):
    pairs = PairSet.from_dialogues(topic_dialogues[:8])
    enc = tiny_encoder_factory("bert", "mean")
    ctx, resp = pairs.ctx[:6], pairs.resp[:6]
    with torch.no_grad():
        u32, _ = TrainableFeatures(enc, TEMPLATES["en"], pairs)(ctx, resp)
        u16, _ = TrainableFeatures(enc, TEMPLATES["en"], pairs, bf16=True)(ctx, resp)
    assert u16.dtype == torch.float32
    assert not torch.equal(u16, u32)  # computed in bfloat16
    assert torch.nn.functional.cosine_similarity(u16, u32).min() > 0.99


@pytest.mark.parametrize("native", [True, False])
def test_bf16_by_default_where_the_device_computes_it_natively(
    native, topic_dialogues, tiny_encoder_factory, monkeypatch
):
    from pmi_reward.training import fit

    seen = []
    monkeypatch.setattr(fit, "native_bf16", lambda device: native)
    monkeypatch.setattr(fit, "train_head", lambda *args, **kw: seen.append(args[1]) or _stop())
    config = TrainConfig(epochs=1, train_encoder="full")
    train, val = PairSet.from_dialogues(topic_dialogues[:8]), PairSet.from_dialogues(topic_dialogues[60:64])
    with pytest.raises(_Stop):
        fit_scorer(train, val, tiny_encoder_factory(), TEMPLATES["en"], config, HeadConfig(), progress=False)
    assert isinstance(seen[0], TrainableFeatures) and seen[0].bf16 is native


class _Stop(Exception):
    pass


def _stop():
    raise _Stop


@pytest.mark.parametrize("kind", ["bert", "llama"])
def test_attention_dropout_is_set_for_training(kind, tokenizer, tiny_model_factory):
    """Training-mode forwards differ by attention dropout alone; at 0 they repeat exactly (and a bad p is refused)."""
    from pmi_reward.training.trainable import set_attention_dropout

    if kind == "bert":
        model = tiny_model_factory("bert", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.5)
    else:
        model = tiny_model_factory("llama", attention_dropout=0.5)
    model.train()
    ids = torch.as_tensor([tokenizer("I love pizza and pasta, do you?")["input_ids"]])
    assert not torch.equal(model(input_ids=ids).last_hidden_state, model(input_ids=ids).last_hidden_state)
    assert set_attention_dropout(model, 0.0) == 2
    assert torch.equal(model(input_ids=ids).last_hidden_state, model(input_ids=ids).last_hidden_state)
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        set_attention_dropout(model, 1.0)


def test_fit_scorer_trains_without_attention_dropout(topic_dialogues, tiny_encoder_factory):
    """``encoder_attention_dropout`` reaches the encoder that trains; scoring afterwards is in eval mode."""
    train, val = PairSet.from_dialogues(topic_dialogues[:24]), PairSet.from_dialogues(topic_dialogues[60:72])
    enc = tiny_encoder_factory("bert", "mean")
    config = TrainConfig(
        train_encoder="full",
        epochs=1,
        steps_per_round=2,
        encoder_batch_size=4,
        encoder_attention_dropout=0.0,
        bf16=False,
    )
    scorer, _ = fit_scorer(
        train, val, enc, TEMPLATES["en"], config, HeadConfig(), NegativeSpec(2, 0, 0), progress=False
    )
    drops = [m.dropout.p for m in scorer.encoder.model.modules() if type(m).__name__ == "BertSelfAttention"]
    assert drops == [0.0, 0.0] and not scorer.encoder.model.training


@pytest.mark.parametrize("mode", ["full", "lora"])
def test_activation_checkpointing_trains_the_same_scorer(mode, topic_dialogues, tiny_encoder_factory):
    """Recomputing activations in the backward pass (dropout masks replayed) changes memory, not the result."""
    train, val = PairSet.from_dialogues(topic_dialogues[:24]), PairSet.from_dialogues(topic_dialogues[60:72])
    config = TrainConfig(
        batch_size=8, epochs=2, steps_per_round=3, train_encoder=mode, encoder_lr=1e-2, patience=2, bf16=False
    )
    scores, encoders = [], []
    for checkpointing in (False, True):
        enc = tiny_encoder_factory("bert", "mean")
        assert enc.model.config.attention_probs_dropout_prob > 0  # dropout is on while it trains
        cfg = TrainConfig(**{**config.__dict__, "encoder_activation_checkpointing": checkpointing})
        scorer, result = fit_scorer(
            train, val, enc, TEMPLATES["en"], cfg, HeadConfig(), NegativeSpec(2, 0, 0), progress=False
        )
        scores.append(scorer.score(val.context_texts[:6], val.response_texts[:6]))
        encoders.append(scorer.encoder)
    assert result.best_epoch > 0  # the encoder moved, so the comparison is not between two pretrained encoders
    np.testing.assert_allclose(scores[0], scores[1], atol=1e-4)
    assert not encoders[1].model.is_activation_checkpointing  # the saved encoder is a plain one


def test_fit_scorer_checks_encoder_layers_before_the_warm_up(topic_dialogues, tiny_encoder_factory):
    """An encoder_layers the encoder does not have (or with LoRA) failed only after the warm-up had trained (40 rounds
    in the recommended config) and every text was embedded."""
    train, val = PairSet.from_dialogues(topic_dialogues[:8]), PairSet.from_dialogues(topic_dialogues[60:64])
    for mode, message in (("full", "1..2"), ("lora", "LoRA")):
        enc = tiny_encoder_factory("bert", "mean")
        config = TrainConfig(batch_size=8, epochs=1, warmup_rounds=2, train_encoder=mode, encoder_layers=3)
        with pytest.raises(ValueError, match=message):
            fit_scorer(train, val, enc, TEMPLATES["en"], config, HeadConfig(hidden=[8]), progress=False)
        assert enc.stats.texts == 0


# a cross-encoder's fine-tuning on the tiny encoder: full, float32, 6 batches of 16 positives a round
PROMPT_TUNING = dict(
    batch_size=16, encoder_batch_size=16, lr=3e-3, encoder_lr=1e-3, train_encoder="full", steps_per_round=6, bf16=False
)


def test_prompt_mode_fine_tuning_trains_a_cross_encoder(topic_dialogues, tiny_encoder_factory, tmp_path):
    """In prompt mode the encoder reads context and reply together and learns under the head's loss: the training
    loss falls, validation AUC rises above the untrained prompt head's, and the saved scorer loads to identical
    scores."""
    train, val = PairSet.from_dialogues(topic_dialogues[:48]), PairSet.from_dialogues(topic_dialogues[60:80])
    enc = tiny_encoder_factory("bert", "mean")
    config = TrainConfig(**PROMPT_TUNING, epochs=10, patience=10, warmup_rounds=1)
    head = HeadConfig(input_mode="prompt")
    scorer, result = fit_scorer(train, val, enc, TEMPLATES["en"], config, head, NegativeSpec(2, 0, 1), progress=False)
    losses = [h["loss"] for h in result.history[1:]]
    aucs = [h["val_auc"] for h in result.history]
    assert losses[-1] < losses[0] and max(aucs) > aucs[0] + 0.05
    assert scorer.input_mode == "prompt" and scorer.encoder.spec.revision
    contexts, replies = val.context_texts[:6], val.response_texts[:6]
    before = scorer.score(contexts, replies)
    scorer.save_pretrained(tmp_path / "s")
    np.testing.assert_allclose(PMIScorer.from_pretrained(tmp_path / "s").score(contexts, replies), before, atol=1e-5)


def test_prompt_features_are_the_pair_prompt_embeddings_with_gradients(topic_dialogues, tiny_encoder_factory):
    """A prompt-mode batch embeds its (context, reply) prompts with gradients, as the frozen encoder's
    ``encode_pairs`` does (a repeated pair included); line features and in-batch negatives, which need embeddings
    made apart, are refused."""
    pairs = PairSet.from_dialogues(topic_dialogues[:10])
    enc = tiny_encoder_factory("bert", "mean")
    features = TrainableFeatures(enc, TEMPLATES["en"], pairs, input_mode="prompt")
    ctx, resp = np.array([[0, 0], [1, 0]]), np.array([[0, 1], [1, 1]])
    enc.model.requires_grad_(True)
    u, v = features(ctx, resp)
    assert v is None and u.shape == (2, 2, enc.dim) and u.requires_grad
    frozen = enc.encode_pairs(
        [pairs.contexts[c] for c in ctx.ravel()],
        [pairs.responses[r] for r in resp.ravel()],
        TEMPLATES["en"].pair_template,
    )
    np.testing.assert_allclose(u.detach().reshape(4, -1).numpy(), frozen, atol=1e-5)
    with pytest.raises(ValueError, match="line features"):
        TrainableFeatures(enc, TEMPLATES["en"], pairs, line_turns=2, input_mode="prompt")
    with pytest.raises(ValueError, match="in_batch_negatives"):
        fit_scorer(
            pairs, pairs, enc, TEMPLATES["en"], TrainConfig(in_batch_negatives=True), HeadConfig(input_mode="prompt")
        )


def test_fit_scorer_continues_a_saved_scorer_and_refuses_a_head_of_another_shape(
    topic_dialogues, tiny_encoder_factory, tmp_path
):
    """A saved scorer's encoder and head train further: its head is validated as round 0 and kept unless a round
    beats it; a head of another shape is refused before anything trains."""
    train, val = PairSet.from_dialogues(topic_dialogues[:48]), PairSet.from_dialogues(topic_dialogues[60:80])
    config = TrainConfig(**PROMPT_TUNING, epochs=3, patience=3)
    head, negatives = HeadConfig(input_mode="prompt"), NegativeSpec(2, 0, 1)
    first, done = fit_scorer(
        train, val, tiny_encoder_factory("bert", "mean"), TEMPLATES["en"], config, head, negatives, progress=False
    )
    first.save_pretrained(tmp_path / "first")
    saved = PMIScorer.from_pretrained(tmp_path / "first")
    _, result = fit_scorer(
        train, val, saved.encoder, TEMPLATES["en"], config, head, negatives, progress=False, start_head=saved.head
    )
    assert result.history[0]["epoch"] == 0 and len(result.history) == 4
    assert result.history[0]["val_auc"] == pytest.approx(done.best_val_auc, abs=1e-6)  # where the first one ended
    with pytest.raises(ValueError, match="start_head"):
        fit_scorer(
            train,
            val,
            saved.encoder,
            TEMPLATES["en"],
            config,
            HeadConfig(input_mode="prompt", hidden=[8]),
            negatives,
            progress=False,
            start_head=saved.head,
        )


@pytest.mark.parametrize("pooling", ["last", "mean"])
def test_an_empty_text_embeds_alike_with_and_without_gradients(pooling, smol_tokenizer):
    """A decoder without BOS tokenizes "" to nothing: inference embeds one pad token, fine-tuning embedded nothing
    (another embedding, and a batch of only empty texts crashed)."""
    from conftest import _tiny

    from pmi_reward.scoring.encoder import EncoderSpec

    spec = EncoderSpec(model="tiny-llama", pooling=pooling, max_length=64, encode_batch_size=8)
    encoder = TextEncoder(spec, model=_tiny("llama", len(smol_tokenizer)), tokenizer=smol_tokenizer, device="cpu")
    texts = ["hi", "a longer text that needs padding in the batch", ""]
    with torch.no_grad():
        assert np.abs(encoder.encode(texts) - encoder.embed_with_grad(texts).numpy()).max() < 1e-5
        assert encoder.embed_with_grad([""]).shape == (1, encoder.dim)


def test_lora_adapts_a_decoder_encoder_by_default_and_refuses_unknown_layers_early(tiny_encoder_factory):
    """LoRA's default targets were BERT's names only: on a decoder encoder (SmolLM2) `--train_encoder lora` failed
    in peft after the embedding and the warm-up had run. Decoders now get their projections; a model whose layers
    match no target is refused by the cheap check fit_scorer runs first."""
    from pmi_reward.training.trainable import check_top_layers, lora_targets

    decoder = tiny_encoder_factory("llama", "last")
    assert lora_targets(decoder.model, LoraSpec())[0] == "q_proj"
    assert any("lora_" in n for n, _ in add_lora(decoder, LoraSpec(r=2)).named_parameters())
    check_top_layers(tiny_encoder_factory("bert").model, "lora", None)  # BERT names: fine
    with pytest.raises(ValueError, match="LoRA finds none of .*'attn'"):
        lora_targets(tiny_encoder_factory("bert").model, LoraSpec(target_modules=["attn"]))


def test_lora_targets_the_user_names_are_checked_not_the_defaults():
    """The early check tried the default target lists even when the user named others, and refused them."""
    from pmi_reward.training.trainable import check_top_layers

    class Body(torch.nn.Module):  # linear layers named as in no default list (DistilBERT's q_lin, v_lin, say)
        def __init__(self) -> None:
            super().__init__()
            self.q_lin, self.v_lin = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)

    check_top_layers(Body(), "lora", None, LoraSpec(target_modules=["q_lin", "v_lin"]))
    with pytest.raises(ValueError, match="LoRA finds none of"):
        check_top_layers(Body(), "lora", None)


def test_a_seed_fixes_a_lora_run_whatever_the_process_drew_before(topic_dialogues, tiny_encoder_factory):
    """LoRA's fresh adapters were drawn from the process's torch state: two runs of one seed differed when anything
    had drawn before them (a loop over seeds in one process). They are drawn from the run's seed now."""
    from pmi_reward.data.negatives import NegativeSpec
    from pmi_reward.data.pairs import PairSet
    from pmi_reward.scoring.head import HeadConfig
    from pmi_reward.scoring.templates import TEMPLATES
    from pmi_reward.training.fit import fit_scorer
    from pmi_reward.training.loop import TrainConfig

    config = TrainConfig(
        batch_size=16, encoder_batch_size=16, epochs=2, patience=5, lr=3e-3, encoder_lr=1e-2, train_encoder="lora",
        steps_per_round=2, seed=0,
    )  # fmt: skip
    runs = []
    for drawn_before in (1, 2):
        train, val = PairSet.from_dialogues(topic_dialogues[:24]), PairSet.from_dialogues(topic_dialogues[60:72])
        encoder = tiny_encoder_factory()
        torch.manual_seed(drawn_before)
        scorer, result = fit_scorer(
            train, val, encoder, TEMPLATES["en"], config, HeadConfig(), NegativeSpec(2, 0, 0), progress=False
        )
        runs.append(result.untimed_history())
        assert scorer.metadata["training"]["bf16"] in (True, False)  # as it ran, not the default's None
    assert runs[0] == runs[1]


@pytest.mark.parametrize(("asked", "held"), [("bfloat16", torch.bfloat16), ("auto", None), ("float32", torch.float16)])
def test_an_encoder_trains_only_in_float32_weights(asked, held, tokenizer, topic_dialogues):
    """``--dtype bfloat16|float16|auto`` with ``--train_encoder`` stepped the weights in that dtype, where most of
    AdamW's small updates round away (12% of MiniLM's weights moved at 2e-5, 98% in float32) and the scorer was saved
    in it; ``auto`` is refused on every machine, and so are weights loaded in another dtype than asked. Refused before
    anything is embedded, with the way out (float32 weights, bf16 autocast); a frozen encoder may be in any dtype."""
    from conftest import _tiny

    from pmi_reward.scoring.encoder import EncoderSpec

    model = _tiny("bert", len(tokenizer))
    spec = EncoderSpec(model="tiny-bert", pooling="mean", dtype=asked, max_length=64, encode_batch_size=8)
    if held is None:  # auto: whatever this machine resolves it to
        held = torch.bfloat16 if spec.on(torch.device("cpu")).dtype == "bfloat16" else torch.float32
    enc = TextEncoder(spec, device="cpu", model=model.to(held), tokenizer=tokenizer)
    train, val = PairSet.from_dialogues(topic_dialogues[:8]), PairSet.from_dialogues(topic_dialogues[60:64])
    for mode in ("full", "lora"):
        config = TrainConfig(batch_size=8, epochs=1, steps_per_round=1, train_encoder=mode, bf16=False)
        with pytest.raises(ValueError, match=r"--dtype float32.*--bf16 true"):
            fit_scorer(train, val, enc, TEMPLATES["en"], config, HeadConfig(), NegativeSpec(2, 0, 0), progress=False)
    assert enc.stats.texts == 0 and all(p.dtype == held for p in enc.model.parameters())
    frozen, _ = fit_scorer(
        train, val, enc, TEMPLATES["en"], TrainConfig(batch_size=8, epochs=1), HeadConfig(), progress=False
    )
    assert frozen.encoder is enc


def test_lora_adapts_each_family_s_attention_and_mlp_never_the_pooler(tokenizer, tiny_encoder_factory):
    """MPNet's attention (q, k, v, o) matched BERT's default list only through ``dense``: LoRA adapted its MLP and its
    pooler, never its attention. Each family now gets its attention and MLP projections, and no pooler."""
    from transformers import MPNetConfig, MPNetModel

    from pmi_reward.scoring.encoder import EncoderSpec
    from pmi_reward.training.trainable import lora_targets

    torch.manual_seed(0)
    config = MPNetConfig(
        vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64
    )
    mpnet = TextEncoder(
        EncoderSpec(model="tiny-mpnet", pooling="mean", max_length=64),
        device="cpu",
        model=MPNetModel(config).eval(),
        tokenizer=tokenizer,
    )
    bert = tiny_encoder_factory("bert", "mean")
    assert lora_targets(mpnet.model, LoraSpec()) == ["q", "k", "v", "o", "dense"]
    assert lora_targets(bert.model, LoraSpec()) == ["query", "key", "value", "dense"]
    attention = {
        "mpnet": {f"attention.attn.{name}" for name in "qkvo"},
        "bert": {*(f"attention.self.{name}" for name in ("query", "key", "value")), "attention.output.dense"},
    }
    for enc, kind in ((mpnet, "mpnet"), (bert, "bert")):
        model = add_lora(enc, LoraSpec(r=2))
        adapted = {n.split(".lora_A")[0] for n, _ in model.named_parameters() if ".lora_A." in n}
        layer0 = {n.split("layer.0.", 1)[1] for n in adapted if "layer.0." in n}
        assert layer0 == attention[kind] | {"intermediate.dense", "output.dense"}
        assert len(adapted) == 2 * len(layer0)  # both layers, and nothing else: no pooler
        assert not any("pooler" in n for n in adapted)


def test_fit_scorer_fine_tunes_a_copy_of_the_encoder_it_is_given(topic_dialogues, tiny_encoder_factory, tmp_path):
    """Fine-tuning changed the caller's encoder in place: a frozen scorer built on it before read the fine-tuned
    embeddings afterwards (and would have saved them as its own). The encoder is tuned as a copy now, sharing the
    embedding cache under keys of its own; ``in_place`` (the CLI, done with the pretrained encoder) tunes it itself."""
    from pmi_reward.scoring.cache import EmbeddingCache

    train, val = PairSet.from_dialogues(topic_dialogues[:24]), PairSet.from_dialogues(topic_dialogues[60:72])
    enc = tiny_encoder_factory("bert", "mean", cache=EmbeddingCache(tmp_path / "cache"))
    weights, spec = {k: v.clone() for k, v in enc.model.state_dict().items()}, enc.spec
    negatives = NegativeSpec(2, 0, 0)
    frozen, _ = fit_scorer(
        train, val, enc, TEMPLATES["en"], TrainConfig(batch_size=8, epochs=2), HeadConfig(), negatives, progress=False
    )
    texts = (val.context_texts[:4], val.response_texts[:4])
    before = frozen.score(*texts)
    config = TrainConfig(batch_size=8, epochs=1, steps_per_round=3, train_encoder="full", encoder_lr=1e-2, bf16=False)
    tuned, _ = fit_scorer(train, val, enc, TEMPLATES["en"], config, HeadConfig(), negatives, progress=False)
    assert tuned.encoder is not enc and tuned.encoder.model is not enc.model
    assert enc.spec == spec and all(torch.equal(v, weights[k]) for k, v in enc.model.state_dict().items())
    assert not enc.model.training and not any(p.requires_grad for p in enc.model.parameters())
    np.testing.assert_array_equal(frozen.score(*texts), before)
    # the tuned weights embed otherwise, and the shared cache does not hand them the pretrained embeddings
    assert tuned.encoder.cache is enc.cache
    assert not np.allclose(tuned.encoder.encode(list(texts[1])), enc.encode(list(texts[1])), atol=1e-4)
    in_place, _ = fit_scorer(
        train, val, enc, TEMPLATES["en"], config, HeadConfig(), negatives, progress=False, in_place=True
    )
    assert in_place.encoder is enc and enc.spec.model == LOCAL_ENCODER


def test_encoder_layers_is_refused_above_the_pooled_layer(topic_dialogues, tiny_encoder_factory):
    """``layer -2`` with ``encoder_layers 1`` trained the top layer, which the embeddings (pooled from the layer below
    it) never read: nothing learnt, silently. Refused before anything is embedded; the last layer by its positive
    index is the last layer."""
    from dataclasses import replace

    from pmi_reward.training.trainable import check_top_layers

    train, val = PairSet.from_dialogues(topic_dialogues[:8]), PairSet.from_dialogues(topic_dialogues[60:64])
    enc = tiny_encoder_factory("bert", "mean")
    enc.adopt(replace(enc.spec, layer=-2))
    config = TrainConfig(batch_size=8, epochs=1, steps_per_round=1, train_encoder="full", encoder_layers=1, bf16=False)
    with pytest.raises(ValueError, match="pools hidden layer -2"):
        fit_scorer(train, val, enc, TEMPLATES["en"], config, HeadConfig(), NegativeSpec(2, 0, 0), progress=False)
    assert enc.stats.texts == 0
    check_top_layers(enc.model, "full", 1, layer=2)  # hidden_states[2] of 2 layers: the last
    check_top_layers(enc.model, "full", None, layer=-2)  # every layer trains: those below the pooled one learn


def test_a_fine_tuned_scorer_tuned_again_keeps_its_base_encoder(topic_dialogues, tiny_encoder_factory, tmp_path):
    """A fine-tuned scorer fine-tuned again (the recipe's ``--init_scorer``) recorded ``base_encoder`` "./encoder",
    and its model card named that as the base model. It keeps the pretrained model's name, loaded or not."""
    train, val = PairSet.from_dialogues(topic_dialogues[:24]), PairSet.from_dialogues(topic_dialogues[60:72])
    config = TrainConfig(batch_size=8, epochs=1, steps_per_round=2, train_encoder="full", bf16=False)
    negatives = NegativeSpec(2, 0, 0)
    first, _ = fit_scorer(
        train, val, tiny_encoder_factory(), TEMPLATES["en"], config, HeadConfig(), negatives, progress=False
    )
    first.save_pretrained(tmp_path / "first")
    loaded = PMIScorer.from_pretrained(tmp_path / "first")
    for init in (first, loaded):
        again, _ = fit_scorer(
            train, val, init.encoder, TEMPLATES["en"], config, HeadConfig(), negatives, False, start_head=init.head
        )
        assert again.metadata["base_encoder"] == "tiny-bert"
    again.save_pretrained(tmp_path / "again")
    card = (tmp_path / "again" / "README.md").read_text()
    assert "`tiny-bert`, fine-tuned (full) with the head" in card

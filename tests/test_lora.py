import numpy as np
import torch

from pmi_reward.data.negatives import NegativeSpec
from pmi_reward.data.pairs import PairSet
from pmi_reward.scoring.encoder import TextEncoder
from pmi_reward.scoring.head import HeadConfig
from pmi_reward.scoring.templates import TEMPLATES
from pmi_reward.training.loop import TrainConfig, score_index_pairs, train_head
from pmi_reward.training.lora import EncoderFeatures, LoraSpec, add_lora, merge_and_save


def test_lora_adapters_train_in_the_one_loop_and_merge(topic_dialogues, tiny_encoder_factory, tmp_path):
    train, val = PairSet.from_dialogues(topic_dialogues[:24]), PairSet.from_dialogues(topic_dialogues[60:72])
    enc = tiny_encoder_factory("bert", "mean")
    base = {n: p.detach().clone() for n, p in enc.model.named_parameters()}
    model = add_lora(enc, LoraSpec(r=4, alpha=8, dropout=0.0, target_modules=("query", "value")))
    lora = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    assert lora and all("lora_" in n for n in lora)
    ft, fv = (EncoderFeatures(enc, TEMPLATES["en"], p) for p in (train, val))
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
    fm = EncoderFeatures(reloaded, TEMPLATES["en"], val)
    np.testing.assert_allclose(score_index_pairs(result.head, fm, val.ctx, val.resp), pos_before, atol=1e-4)

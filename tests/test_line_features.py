"""Line features: the head also sees the context's newest lines, the same way in training and in scoring."""

import numpy as np
import pytest
import torch

from pmi_reward.data.dialogues import Dialogue
from pmi_reward.data.negatives import NegativeSpec
from pmi_reward.data.pairs import PairSet
from pmi_reward.scoring.features import PairFeatures, TensorFeatures, newest_lines
from pmi_reward.scoring.head import HeadConfig, PMIHead, head_input
from pmi_reward.scoring.scorer import PMIScorer
from pmi_reward.scoring.templates import TEMPLATES
from pmi_reward.training.loop import TrainConfig, score_index_pairs, train_head


def test_newest_lines_are_the_last_turns_newest_first():
    assert newest_lines("a\n\n b \nc", 2) == ["c", "b"]
    assert newest_lines("only", 3) == ["only"] and newest_lines("", 2) == []


def test_head_reads_the_line_features():
    config = HeadConfig(dim=4, line_turns=2)
    assert config.in_features == 4 * 3 + (4 + 2 + 2)
    u = torch.nn.functional.normalize(torch.randn(5, 3, 4), dim=-1)
    u[0, 2] = 0  # context 0 has one line only
    v = u[:, 1].clone()  # each reply copies its context's last line
    row = head_input(config, u, v)
    assert row.shape == (5, config.in_features)
    cos = row[:, 16:18]
    torch.testing.assert_close(cos[:, 0], torch.ones(5))  # a copy of the last line: cosine 1
    assert cos[0, 1] == -1.0  # a missing line never looks like the reply
    torch.testing.assert_close(row[:, 18], torch.ones(5))  # max cosine
    with pytest.raises(ValueError, match="line_turns"):
        HeadConfig(dim=4, input_mode="prompt", line_turns=2)
    with pytest.raises(ValueError, match="needs contexts of shape"):
        head_input(config, u[:, 0], v)


def test_training_features_and_scoring_give_the_same_scores(tiny_encoder):
    dialogues = [Dialogue(str(i), (f"hi {i}", f"how are you {i}?", f"fine {i}", "ok")) for i in range(4)]
    pairs = PairSet.from_dialogues(dialogues, max_context_turns=3)
    torch.manual_seed(0)
    head = PMIHead(HeadConfig(dim=tiny_encoder.dim, line_turns=2))
    features = PairFeatures(tiny_encoder, TEMPLATES["en"], pairs, "pair", progress=False, line_turns=2)
    trained_way = score_index_pairs(head, features, pairs.ctx, pairs.resp)
    scorer = PMIScorer(tiny_encoder, TEMPLATES["en"], head)
    np.testing.assert_allclose(scorer.score(pairs.context_texts, pairs.response_texts), trained_way, atol=1e-5)


def test_line_features_teach_the_head_that_parroting_is_not_an_answer():
    """Toy problem: lines and replies are random unit vectors and a context embedding is the normalized sum of its
    lines and its true reply, so that given u alone the reply and a copied line are exchangeable (as for a frozen
    encoder, whose context embedding is as close to a line as to the answer). Only the line features tell them
    apart."""
    gen = torch.Generator().manual_seed(0)
    n, d, k = 400, 16, 2

    def make(n):
        lines = torch.nn.functional.normalize(torch.randn(n, k, d, generator=gen), dim=-1)
        gold = torch.nn.functional.normalize(torch.randn(n, d, generator=gen), dim=-1)
        u = torch.nn.functional.normalize(lines.sum(1) + gold, dim=-1)
        pairs = PairSet.from_pairs([f"c{i}" for i in range(n)], [f"r{i}" for i in range(n)])
        base = len(pairs.responses)  # the context's own lines go after the table: rows base + k*i + j
        table = torch.zeros(base + k * n, d)
        table[torch.as_tensor(pairs.resp)] = gold
        table[base:] = lines.reshape(-1, d)
        pairs.line_ptr, pairs.lines = np.arange(0, k * (n + 1), k), base + np.arange(k * n)
        pairs.responses = pairs.responses + [f"line{j}" for j in range(k * n)]
        return pairs, TensorFeatures(torch.cat([u[:, None], lines], 1), table)

    (train, ft), (val, fv) = make(n), make(n)
    config = TrainConfig(epochs=60, patience=60, batch_size=32, seed=0)
    spec = NegativeSpec(1, 0, 1)
    aucs = {}
    for turns in (0, k):
        head_config = HeadConfig(dim=d, line_turns=turns)
        feats = [f if turns else TensorFeatures(f.u[:, 0], f.v) for f in (ft, fv)]
        result = train_head(head_config, feats[0], train, feats[1], val, config, progress=False, negatives=spec)
        pos = score_index_pairs(result.head, feats[1], val.ctx, val.resp)
        neg = score_index_pairs(result.head, feats[1], val.ctx, val.lines[::k].copy())
        aucs[turns] = float((pos[:, None] > neg[None, :]).mean())
    assert aucs[k] > 0.9 and aucs[0] < 0.7

"""The residual head (``HeadConfig.residual="cosine"``): softcap(a * cos(u, v) + b + MLP correction), starting
from the scaled cosine, saved and loaded with its scorer; heads without the field are unchanged."""

import json

import numpy as np
import pytest
import torch

from pmi_reward.data.negatives import NegativeSpec
from pmi_reward.data.pairs import PairSet
from pmi_reward.scoring.features import TensorFeatures
from pmi_reward.scoring.head import PRIOR_CENTRE, PRIOR_SCALE, HeadConfig, PMIHead, softcap
from pmi_reward.scoring.scorer import PMIScorer
from pmi_reward.scoring.templates import TEMPLATES
from pmi_reward.training.loop import TrainConfig, _Run, score_index_pairs, train_head
from pmi_reward.training.objectives import nwj

CTX = ["hi there\nhow are you?\nfine, you?", "I like jazz", "we went hiking\nwhere?"]
RESP = ["great, thanks", "me too, Coltrane!", "in the Alps"]


def _cos(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cosine_similarity(a, b, dim=-1)


@pytest.mark.parametrize("line_turns", [0, 2])
def test_an_untrained_residual_head_scores_the_softcapped_scaled_cosine(line_turns):
    torch.manual_seed(0)
    head = PMIHead(HeadConfig(dim=8, line_turns=line_turns, residual="cosine", cap=5.0))
    u = torch.randn(6, 1 + line_turns, 8) if line_turns else torch.randn(6, 8)
    v = torch.randn(6, 8)
    context = u[:, 0] if line_turns else u  # the context's own embedding, not its lines
    expected = softcap(PRIOR_SCALE * _cos(context, v) - PRIOR_SCALE * PRIOR_CENTRE, 5.0)
    torch.testing.assert_close(head(u, v), expected)
    scores, correction = head.scores_and_correction(u, v)
    assert correction is not None and torch.equal(correction, torch.zeros(6))
    # the same head without the residual is an MLP of those features, not the cosine
    plain = PMIHead(HeadConfig(dim=8, line_turns=line_turns))
    assert not torch.allclose(plain(u, v), expected, atol=0.1)
    assert plain.scores_and_correction(u, v)[1] is None and plain.prior_parameters() == []


def test_residual_needs_pair_mode_and_a_known_name():
    with pytest.raises(ValueError, match="residual"):
        HeadConfig(dim=4, input_mode="prompt", residual="cosine")
    with pytest.raises(ValueError, match="residual"):
        HeadConfig(dim=4, residual="dot")


def test_fit_prior_finds_the_objectives_best_scaled_cosine():
    g = torch.Generator().manual_seed(0)
    cos_pos = (0.5 + 0.15 * torch.randn(2000, generator=g)).clamp(-1, 1)
    cos_neg = (0.1 + 0.15 * torch.randn(2000, 3, generator=g)).clamp(-1, 1)
    head = PMIHead(HeadConfig(dim=4, residual="cosine", cap=1000.0))  # a far cap: NWJ's optimum exactly

    def loss(a, b):
        return float(nwj(softcap(a * cos_pos + b, 1000.0), softcap(a * cos_neg + b, 1000.0)))

    start = loss(head.prior_scale.item(), head.prior_shift.item())
    head.fit_prior(cos_pos, cos_neg, nwj)
    a, b = head.prior_scale.item(), head.prior_shift.item()
    assert a > 0 and loss(a, b) < start - 0.05
    # stationary: no small step in a or b does better, and NWJ's optimum has E_q[exp(s)] = 1 (d/db = 0)
    for da, db in ((0.2, 0), (-0.2, 0), (0, 0.05), (0, -0.05)):
        assert loss(a + da, b + db) >= loss(a, b) - 1e-6
    assert abs(torch.exp(a * cos_neg + b).mean().item() - 1) < 1e-3
    with pytest.raises(ValueError, match="residual"):
        PMIHead(HeadConfig(dim=4)).fit_prior(cos_pos, cos_neg, nwj)


def _residual_scorer(encoder, line_turns=2):
    torch.manual_seed(0)
    head = PMIHead(HeadConfig(dim=encoder.dim, line_turns=line_turns, residual="cosine"))
    with torch.no_grad():  # as after training: a fitted prior and a nonzero correction
        head.prior_scale.fill_(7.5)
        head.prior_shift.fill_(-2.25)
        head.mlp[-1].weight.normal_(0, 0.5)
    return PMIScorer(encoder, TEMPLATES["en"], head, context_turns=3)


def test_residual_scorers_save_and_load_to_identical_scores(tiny_encoder, tmp_path):
    scorer = _residual_scorer(tiny_encoder)
    before = scorer.score(CTX, RESP)
    scorer.save_pretrained(tmp_path / "s")
    config = json.loads((tmp_path / "s" / "config.json").read_text())
    assert config["head"]["residual"] == "cosine"
    assert "a * cos(u, v) + b" in (tmp_path / "s" / "README.md").read_text()  # the model card says so
    loaded = PMIScorer.from_pretrained(tmp_path / "s", encoder=tiny_encoder)
    assert loaded.head.config.residual == "cosine" and loaded.head.prior_scale.item() == 7.5
    np.testing.assert_array_equal(before, loaded.score(CTX, RESP))
    # a residual head's weights in a config that does not ask for the residual are refused, not half-loaded
    config["head"]["residual"] = "none"
    (tmp_path / "s" / "config.json").write_text(json.dumps(config))
    with pytest.raises(Exception, match="head weights do not match"):
        PMIScorer.from_pretrained(tmp_path / "s", encoder=tiny_encoder)


def test_scorers_saved_before_the_field_load_unchanged(tiny_encoder, tmp_path):
    torch.manual_seed(0)
    head = PMIHead(HeadConfig(dim=tiny_encoder.dim, line_turns=2))
    assert all(k.startswith("mlp.") for k in head.state_dict())  # no new tensors in a plain head
    scorer = PMIScorer(tiny_encoder, TEMPLATES["en"], head, context_turns=3)
    before = scorer.score(CTX, RESP)
    scorer.save_pretrained(tmp_path / "s")
    path = tmp_path / "s" / "config.json"
    config = json.loads(path.read_text())
    del config["head"]["residual"]  # as an older pmi-reward wrote it
    path.write_text(json.dumps(config))
    loaded = PMIScorer.from_pretrained(tmp_path / "s", encoder=tiny_encoder)
    assert loaded.head.config.residual == "none"
    np.testing.assert_array_equal(before, loaded.score(CTX, RESP))


def _toy(seed: int, n: int = 300, d: int = 16):
    """Contexts and replies whose embeddings share a hidden topic vector: the cosine already ranks them."""
    g = torch.Generator().manual_seed(seed)
    topics = torch.randn(n, d, generator=g)
    u = topics + 0.8 * torch.randn(n, d, generator=g)
    v = topics + 0.8 * torch.randn(n, d, generator=g)
    pairs = PairSet.from_pairs([f"c{seed}-{i}" for i in range(n)], [f"r{seed}-{i}" for i in range(n)])
    u_table, v_table = torch.zeros(len(pairs.contexts), d), torch.zeros(len(pairs.responses), d)
    u_table[torch.as_tensor(pairs.ctx)], v_table[torch.as_tensor(pairs.resp)] = u, v
    return pairs, TensorFeatures(u_table, v_table)


def test_training_starts_at_the_fitted_cosine_and_the_penalty_keeps_the_correction_small():
    (train, ft), (val, fv) = _toy(0), _toy(1)
    negatives = NegativeSpec(k_random=3, k_context=0)
    config = TrainConfig(batch_size=64, epochs=1, patience=5, lr=0.0, seed=0)  # lr 0: the start is what is kept
    start = train_head(HeadConfig(dim=16, residual="cosine"), ft, train, fv, val, config, False, negatives=negatives)
    u, v = fv(val.ctx, val.resp)
    torch.testing.assert_close(start.head.scores_and_correction(u, v)[1], torch.zeros(len(val)))
    assert start.head.prior_scale.item() != PRIOR_SCALE  # fitted on the training pairs, not the constant start
    cos_auc = start.best_val_auc

    def corrections(l2: float) -> float:
        cfg = TrainConfig(batch_size=64, epochs=8, patience=8, lr=3e-3, seed=0, correction_l2=l2)
        head = train_head(HeadConfig(dim=16, residual="cosine"), ft, train, fv, val, cfg, False, negatives=negatives)
        assert head.best_val_auc >= cos_auc - 0.01  # a correction of the cosine, not a restart
        with torch.no_grad():
            correction = head.head.scores_and_correction(u, v)[1]
        assert correction is not None
        return float(correction.abs().mean())

    free, penalised = corrections(0.0), corrections(10.0)
    assert free > 0.05 and penalised < free / 2
    scores = score_index_pairs(start.head, fv, val.ctx, val.resp)
    assert np.isfinite(scores).all()


def test_the_start_is_fitted_by_nwj_whatever_the_objective():
    """chi2 rewards a positive by 2e^s: fitted by chi2 on finite samples, the start ran off to a step function."""
    (train, ft), (val, fv) = _toy(0), _toy(1)
    negatives = NegativeSpec(k_random=3, k_context=0)
    starts = {}
    for objective in ("nwj", "chi2"):
        config = TrainConfig(batch_size=64, epochs=1, patience=5, lr=0.0, seed=0, objective=objective)
        run = train_head(HeadConfig(dim=16, residual="cosine"), ft, train, fv, val, config, False, negatives=negatives)
        starts[objective] = (run.head.prior_scale.item(), run.head.prior_shift.item())
    assert starts["chi2"] == starts["nwj"] and 0 < starts["nwj"][0] < 100


def test_the_cosine_scale_and_shift_escape_weight_decay():
    head = PMIHead(HeadConfig(dim=4, residual="cosine"))
    run = _Run(head.config, TensorFeatures(torch.zeros(1, 4)), TrainConfig(weight_decay=0.5), head)
    decayed, exempt = run.optim.param_groups
    assert exempt["weight_decay"] == 0.0 and decayed["weight_decay"] == 0.5
    assert {id(p) for p in exempt["params"]} == {id(head.prior_scale), id(head.prior_shift)}
    plain = _Run(HeadConfig(dim=4), TensorFeatures(torch.zeros(1, 4)), TrainConfig(), None)
    assert len(plain.optim.param_groups) == 1  # unchanged for the heads we had

import pytest
import torch

from pmi_reward.scoring.head import HeadConfig, PMIHead, softcap


def test_softcap_bound_holds_for_extreme_inputs():
    x = torch.tensor([-1e30, -1e4, -50.0, 0.0, 50.0, 1e4, 1e30])
    y = softcap(x, 20.0)
    assert torch.all(y.abs() <= 20.0) and torch.isfinite(y).all()
    assert y[3] == 0 and torch.isclose(softcap(torch.tensor(0.5), 20.0), torch.tensor(0.5), atol=1e-3)


@pytest.mark.parametrize("cap", [1.0, 5.0, 20.0])
def test_head_output_bounded_by_its_cap(cap):
    torch.manual_seed(0)
    head = PMIHead(HeadConfig(dim=8, input_mode="pair", cap=cap))
    u, v = torch.randn(64, 8) * 1e6, torch.randn(64, 8) * 1e6
    s = head(u, v)
    assert s.shape == (64,) and torch.all(s.abs() <= cap)


def test_pair_features_shapes():
    assert HeadConfig(dim=8).in_features == 24
    assert HeadConfig(dim=8, pair_product=False).in_features == 16
    assert HeadConfig(dim=8, input_mode="prompt").in_features == 8
    head = PMIHead(HeadConfig(dim=4))
    u, v = torch.ones(2, 4), 2 * torch.ones(2, 4)
    assert torch.equal(head.features(u, v), torch.cat([u, v, u * v], -1))
    with pytest.raises(ValueError, match="pair mode needs"):
        head(u)


def test_bad_config_rejected():
    with pytest.raises(ValueError, match="input_mode"):
        HeadConfig(dim=4, input_mode="both")
    with pytest.raises(ValueError, match="cap"):
        HeadConfig(dim=4, cap=0)


@pytest.mark.parametrize("hidden", [[0], [16, -1]])
def test_hidden_widths_must_be_positive(hidden):
    """A width of 0 gave a head that scores every pair alike; a negative one torch's RuntimeError."""
    with pytest.raises(ValueError, match="hidden widths must be >= 1"):
        HeadConfig(dim=8, hidden=hidden)


@pytest.mark.parametrize("cap", [0.0, -1.0, float("inf"), float("nan")])
def test_the_cap_must_be_a_positive_finite_number(cap):
    """cap=inf or nan was accepted, and softcap then made every score NaN (inf * tanh(x / inf) = inf * 0)."""
    with pytest.raises(ValueError, match="cap must be a positive finite number"):
        HeadConfig(dim=4, cap=cap)

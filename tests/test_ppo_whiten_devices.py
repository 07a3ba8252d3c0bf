"""``whiten`` on an MPS tensor (Apple silicon, ``pmi-reward ppo --use_cpu false``), simulated on the CPU.

MPS has no float64: converting an MPS tensor to it raises ``TypeError`` (pytorch/pytorch#122602), and ``whiten``
took its float64 sums on the tensors' device, so PPO crashed at its first whitened step on a Mac. ``SimulatedMps``
stands in for the device: a tensor marked ``OnMps`` says it is on ``mps``, refuses float64 as MPS does, and
``.to("cpu")``/``.to(mps)`` move a tensor off and onto it; everything is computed on the CPU."""

from __future__ import annotations

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_any, tree_map

from pmi_reward.policy.ppo_core import whiten

MPS = torch.device("mps")
MPS_FLOAT64 = "Cannot convert a MPS Tensor to float64 dtype as the MPS framework doesn't support float64"


class OnMps(torch.Tensor):
    """A CPU tensor that ``SimulatedMps`` treats as an MPS one (a marker: it adds no behaviour of its own)."""

    __torch_function__ = torch._C._disabled_torch_function_impl


def _target_device(args: tuple, kwargs: dict) -> torch.device | None:
    """The device a ``Tensor.to`` call moves to (positional or ``device=``), None when it only changes the dtype."""
    for value in (*args[1:], kwargs.get("device")):
        if isinstance(value, (str, torch.device)):
            return torch.device(value)
        if isinstance(value, torch.Tensor):
            return value.device
    return None


class SimulatedMps(TorchFunctionMode):
    """MPS as PyTorch presents it, on the CPU: ``OnMps`` tensors report ``device('mps')``, an op that would leave a
    float64 tensor on MPS raises MPS's ``TypeError``, ``.to(cpu)`` gives a plain tensor and ``.to(mps)`` an ``OnMps``
    one; the results of an op on ``OnMps`` tensors stay ``OnMps``. ``moved_to_cpu`` counts the moves off MPS."""

    def __init__(self) -> None:
        super().__init__()
        self.moved_to_cpu = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        on_mps = tree_any(lambda t: isinstance(t, OnMps), (args, kwargs))
        if func == torch.Tensor.device.__get__:  # a fresh method-wrapper each time: equal, not identical
            return MPS if on_mps else func(*args)
        plain_args, plain_kwargs = tree_map(
            lambda t: t.as_subclass(torch.Tensor) if isinstance(t, OnMps) else t, (args, kwargs)
        )
        if func is torch.Tensor.to:
            target = _target_device(args, kwargs)
            if target is not None and target.type in ("cpu", "mps"):
                plain_args = tuple(torch.device("cpu") if a is target or a == target else a for a in plain_args)
                if "device" in plain_kwargs:
                    plain_kwargs["device"] = torch.device("cpu")
                on_mps = target.type == "mps"
                self.moved_to_cpu += target.type == "cpu" and isinstance(args[0], OnMps)
        out = func(*plain_args, **plain_kwargs)
        if not on_mps:
            return out
        if tree_any(lambda t: isinstance(t, torch.Tensor) and t.dtype == torch.float64, out):
            raise TypeError(MPS_FLOAT64)
        return tree_map(lambda t: t.as_subclass(OnMps) if isinstance(t, torch.Tensor) else t, out)


def _advantages() -> tuple[torch.Tensor, torch.Tensor]:
    """Advantages of mean 1000 and spread 0.5 (float32 sums lose their digits there), a ragged mask."""
    x = torch.randn(8, 12, generator=torch.Generator().manual_seed(0)) * 0.5 + 1000
    mask = torch.ones(8, 12)
    mask[1, 5:] = 0
    mask[6, 2:] = 0
    return x, mask


def test_the_simulation_refuses_float64_on_mps_as_mps_does():
    """The stand-in is faithful where it matters: ``.double()`` of an MPS tensor raises, a move to the CPU does not,
    and a tensor moved onto MPS says it is there."""
    x, _ = _advantages()
    with SimulatedMps():
        on_mps = x.to(MPS)
        assert on_mps.device.type == "mps"
        with pytest.raises(TypeError, match="MPS framework doesn't support float64"):
            on_mps.double()
        assert on_mps.to("cpu", torch.float64).device.type == "cpu"


@pytest.mark.parametrize("shift_mean", [True, False])
def test_whiten_on_mps_sums_on_the_cpu_and_gives_the_cpus_values(shift_mean):
    """On MPS the float64 sums run on the CPU (before: TypeError at ``x.double()``); the answer is on MPS, float32,
    and equal to the CPU's, bit for bit."""
    x, mask = _advantages()
    expected = whiten(x, mask, shift_mean=shift_mean)
    with SimulatedMps() as mps:
        got = whiten(x.to(MPS), mask.to(MPS), shift_mean=shift_mean)
        assert got.device.type == "mps" and mps.moved_to_cpu == 2
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.as_subclass(torch.Tensor), expected, rtol=0, atol=0)


def test_whiten_on_mps_reduces_its_float64_statistics_on_the_cpu():
    """``all_reduce`` (the accelerator's sum over processes) gets the three float64 statistics, on the CPU for an MPS
    run; what it gives back is what the answer uses."""
    x, mask = _advantages()
    seen: list[torch.Tensor] = []

    def doubled(stats: torch.Tensor) -> torch.Tensor:  # as if a second process held the same advantages
        seen.append(stats)
        return stats * 2

    expected = whiten(x, mask, all_reduce=lambda t: t * 2)
    with SimulatedMps():
        got = whiten(x.to(MPS), mask.to(MPS), all_reduce=doubled)
        assert seen[0].device.type == "cpu" and seen[0].dtype == torch.float64 and seen[0].shape == (3,)
    torch.testing.assert_close(got.as_subclass(torch.Tensor), expected, rtol=0, atol=0)


def test_whiten_on_the_cpu_gives_the_float64_statistics_values_bit_for_bit():
    """The CPU path is unchanged: masked mean and (unbiased) variance from float64 sums, applied in float32."""
    x, mask = _advantages()
    xd, md = x.double(), mask.double()
    n = md.sum()
    mean = (xd * md).sum() / n
    var = ((xd * xd * md).sum() / n - mean * mean) * n / (n - 1)
    expected = (x - mean.float()) * torch.rsqrt(var.float() + 1e-8) * mask
    torch.testing.assert_close(whiten(x, mask), expected, rtol=0, atol=0)
    torch.testing.assert_close(whiten(x, mask, shift_mean=False), (expected + mean.float()) * mask, rtol=0, atol=0)


def test_whiten_keeps_a_cpu_tensors_sums_on_its_device():
    """On the CPU (and CUDA) nothing moves: the statistics ``all_reduce`` gets are on the tensors' own device, as NCCL
    needs for a CUDA run."""
    x, mask = _advantages()
    seen: list[torch.Tensor] = []
    whiten(x, mask, all_reduce=lambda t: seen.append(t) or t)
    assert seen[0].device == x.device and seen[0].dtype == torch.float64

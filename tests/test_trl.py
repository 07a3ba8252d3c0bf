"""TRL 1.16's own reward call, replayed: ``GRPOTrainer._calculate_rewards`` (the real method, unbound) on a
stand-in trainer that holds only what the method reads, with the sync ``PMIReward`` and the async
``RemotePMIReward`` side by side, as TRL calls them (dataset columns, ``trainer_state``, ``log_extra`` and
``log_metric`` as keywords; async functions gathered on TRL's daemon event loop)."""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from accelerate import PartialState
from trl import GRPOTrainer
from trl.trainer.utils import is_async_callable, shutdown_event_loop_in_daemon, start_event_loop_in_daemon

from pmi_reward.rewards.reward import PMIReward

PROMPT = [{"role": "user", "content": "I just got back from a hiking trip in Yosemite."}]
OTHER = [{"role": "user", "content": "I love jazz."}]
REPLIES = ["Did you see Half Dome?", "That's interesting.", "", "<think>They hiked.</think>Was it crowded?"]


class StandIn:
    """The attributes of a GRPOTrainer that ``_calculate_rewards`` reads (trl/trainer/grpo_trainer.py @ 1.16.0,
    lines 1579-1682, and its ``profiling_decorator``)."""

    def __init__(self, reward_funcs, async_loop) -> None:
        PartialState()  # accelerate's gather needs the (single-process) state
        self.accelerator = SimpleNamespace(device=torch.device("cpu"), is_main_process=True)
        self.args = SimpleNamespace(report_to=[])
        self.state = SimpleNamespace(global_step=3)
        self.reward_funcs = reward_funcs
        self.reward_processing_classes = [None] * len(reward_funcs)
        self.reward_func_names = [f.__name__ for f in reward_funcs]
        self.environments = None
        self.async_loop = async_loop
        self.metrics: dict[str, list[float]] = defaultdict(list)
        self.extra: dict[str, list] = {}

    def _log_metric(self, name: str, value: float) -> None:
        self.metrics[name].append(value)

    def _log_completion_extra(self, column: str, values: list) -> None:
        self.extra[column] = values


@pytest.fixture
def trl_loop():
    thread, loop, ready = start_event_loop_in_daemon(name="GRPOTrainer-AsyncLoop")
    ready.wait()
    yield loop
    shutdown_event_loop_in_daemon(thread, loop)


def test_grpo_calls_sync_and_async_rewards(spread_server, spread_scorer, trl_loop):
    local = PMIReward(spread_scorer, center="group", name="pmi")
    remote = PMIReward.remote(spread_server.url, center="group", name="pmi_remote")
    assert not is_async_callable(local) and is_async_callable(remote)
    trainer = StandIn([local, remote], trl_loop)
    prompts = [PROMPT] * 4 + [OTHER] * 4  # two GRPO groups
    inputs = [{"prompt": p, "topic": "hiking"} for p in prompts]  # a dataset column
    completions = [[{"role": "assistant", "content": r}] for r in REPLIES * 2]
    rewards = GRPOTrainer._calculate_rewards(trainer, inputs, prompts, completions, [[1, 2]] * 8)
    assert rewards.shape == (8, 2)
    torch.testing.assert_close(rewards[:, 0], rewards[:, 1])  # the remote reward equals the in-process one
    answers = ["Did you see Half Dome?", "That's interesting.", "", "Was it crowded?"] * 2  # the think block stripped
    raw = np.array(PMIReward(spread_scorer)(prompts, answers))
    scored = [0, 1, 3, 4, 5, 7]
    # the replies score apart and the groups' means differ: order, grouping and centring all show
    assert len(set(np.round(raw[scored], 4))) == 6 and abs(raw[[0, 1, 3]].mean() - raw[[4, 5, 7]].mean()) > 1e-2
    expected = raw.copy()
    for group in ([0, 1, 3], [4, 5, 7]):
        expected[group] -= raw[group].mean()  # each group centred on its scored replies' mean
    torch.testing.assert_close(rewards[:, 0], torch.tensor(expected, dtype=torch.float32), atol=1e-5, rtol=0)
    assert rewards[2, 0] == rewards[6, 0] == -5.0  # the empty replies: empty_score, not centred
    for name in ("pmi", "pmi_remote"):
        assert trainer.metrics[f"{name}/empty_frac"] == [0.25] and trainer.metrics[f"{name}/no_context_frac"] == [0]
    assert trainer.metrics["pmi/seconds"][0] > 0


def test_grpo_turns_unscorable_into_nan(tiny_scorer, trl_loop):
    """``empty_score=None``: TRL turns None into NaN, which its advantages treat as unscorable."""
    trainer = StandIn([PMIReward(tiny_scorer, empty_score=None)], trl_loop)
    completions = [[{"role": "assistant", "content": r}] for r in REPLIES[:3]]
    rewards = GRPOTrainer._calculate_rewards(trainer, [{"prompt": PROMPT}] * 3, [PROMPT] * 3, completions, [[1]] * 3)
    assert torch.isnan(rewards[2, 0]) and torch.isfinite(rewards[:2, 0]).all()

"""The verl adapter, loaded by path exactly as verl loads a ``custom_reward_function`` (verl itself not installed)."""

import importlib.util
import inspect

import numpy as np
import pytest
import torch

import pmi_reward.rewards.verl as verl_adapter
from pmi_reward.rewards.reward import PMIReward

CONTEXT = "I love jazz.\nMe too!\nWho is your favourite?"
MESSAGES = [
    {"role": "user", "content": "I love jazz."},
    {"role": "assistant", "content": "Me too!"},
    {"role": "user", "content": "Who is your favourite?"},
]


def _load_like_verl():
    """verl: spec_from_file_location("custom_module", path), exec_module, getattr(module, name)."""
    spec = importlib.util.spec_from_file_location("custom_module", verl_adapter.__file__)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_signatures_follow_verl():
    module = _load_like_verl()
    assert list(inspect.signature(module.compute_score).parameters)[:4] == [
        "data_source",
        "solution_str",
        "ground_truth",
        "extra_info",
    ]
    assert list(inspect.signature(module.compute_score_batch).parameters)[:4] == [
        "data_sources",
        "solution_strs",
        "ground_truths",
        "extra_infos",
    ]


def test_compute_score_against_a_server(reward_server, tiny_scorer):
    module = _load_like_verl()
    expected = PMIReward(tiny_scorer)([CONTEXT], ["Coltrane, for sure."])[0]
    got = module.compute_score(
        "chitchat", "Coltrane, for sure.<|im_end|><|endoftext|>", None, {"context": CONTEXT}, url=reward_server.url
    )
    assert isinstance(got, float) and got == pytest.approx(expected, abs=1e-6)


def test_batch_reads_contexts_from_extra_info_in_every_form(reward_server, tiny_scorer):
    module = _load_like_verl()
    infos = [
        {"context": CONTEXT},
        {"messages": np.array(MESSAGES, dtype=object)},  # parquet rows hold numpy arrays
        {"history": np.array(["I love jazz.", "Me too!", "Who is your favourite?"], dtype=object)},
        {"prompt": CONTEXT},
        {"index": 3},  # no context: empty_score
        None,
    ]
    replies = ["Coltrane."] * 6
    got = module.compute_score_batch(
        ["d"] * 6, replies, [None] * 6, infos, url=reward_server.url, center="none", empty_score=-1.0
    )
    expected = PMIReward(tiny_scorer, empty_score=-1.0)([CONTEXT] * 4 + [None, None], replies)
    assert got == pytest.approx(expected, abs=1e-6)
    assert got[0] == got[1] == got[2] == got[3] and got[4] == got[5] == -1.0
    centred = module.compute_score_batch(
        ["d"] * 2, ["Coltrane.", "ok"], [None] * 2, infos[:2], url=reward_server.url, center="group"
    )
    assert sum(centred) == pytest.approx(0.0, abs=1e-5)


def test_settings_errors(reward_server, monkeypatch):
    monkeypatch.delenv("PMI_REWARD_URL", raising=False)
    monkeypatch.delenv("PMI_REWARD_SCORER", raising=False)
    with pytest.raises(ValueError, match="exactly one of url"):
        verl_adapter.compute_score("d", "x", None, {"context": "c"})
    with pytest.raises(ValueError, match="empty_score cannot be None"):
        verl_adapter.compute_score("d", "x", None, {"context": "c"}, url=reward_server.url, empty_score=None)
    with pytest.raises(ValueError, match="2 responses but 1 extra_infos"):
        verl_adapter.compute_score_batch(["d"], ["x", "y"], [None], [{}], url=reward_server.url)
    monkeypatch.setenv("PMI_REWARD_URL", reward_server.url)
    assert isinstance(verl_adapter.compute_score("d", "x", None, {"context": "c"}), float)


@pytest.mark.integration
def test_compute_score_with_a_local_scorer_dir(tmp_path):
    from pmi_reward.scoring.encoder import EncoderSpec, TextEncoder
    from pmi_reward.scoring.head import HeadConfig, PMIHead
    from pmi_reward.scoring.scorer import PMIScorer
    from pmi_reward.scoring.templates import TEMPLATES

    encoder = TextEncoder(EncoderSpec("minilm"), device="cpu")
    torch.manual_seed(0)
    PMIScorer(encoder, TEMPLATES["en"], PMIHead(HeadConfig(dim=encoder.dim))).save_pretrained(tmp_path / "s")
    got = verl_adapter.compute_score(
        "d", "Coltrane.", None, {"context": CONTEXT}, scorer=str(tmp_path / "s"), device="cpu"
    )
    expected = PMIReward.from_pretrained(tmp_path / "s", device="cpu")([CONTEXT], ["Coltrane."])[0]
    assert got == pytest.approx(expected, abs=1e-6)

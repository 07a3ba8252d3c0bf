"""Scorers on the Hugging Face Hub, offline: a fake Hub cache laid out as huggingface_hub lays it out
(``models--org--name/refs/<ref>`` holding a commit, ``snapshots/<commit>/<files>``), push_to_hub against a fake
remote, and the model card."""

from __future__ import annotations

import dataclasses
import shutil
import socket
from pathlib import Path

import huggingface_hub
import numpy as np
import pytest
import torch
from huggingface_hub import ModelCard

from pmi_reward.rewards.reward import PMIReward
from pmi_reward.scoring.head import HeadConfig, PMIHead
from pmi_reward.scoring.scorer import LOCAL_ENCODER, PMIScorer, ScorerLoadError
from pmi_reward.scoring.templates import TEMPLATES
from pmi_reward.training.trainable import finish_tuning

COMMIT_A, COMMIT_B = "a" * 40, "b" * 40
CONTEXTS, REPLIES = ["I love jazz.\nMe too!", "I went hiking."], ["Coltrane.", "Where did you go?"]
METADATA = {
    "data": {"dialogues": "chitchat", "skip_dialogues": 0, "n_dialogues": [240, 30, 30], "max_context_turns": 3},
    "training": {"objective": "nwj", "k_random": 4, "k_in_dialogue": 1, "k_context": 1, "seed": 0},
    "best_epoch": 7,
    "best_val_auc": 0.8812,
    "test_auc": 0.8677,
}


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    """huggingface_hub reads HF_HUB_OFFLINE at import: set its constant, so that nothing can be downloaded."""
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


def _scorer(encoder, seed: int) -> PMIScorer:
    torch.manual_seed(seed)
    head = PMIHead(HeadConfig(dim=encoder.dim))
    with torch.no_grad():
        for p in head.parameters():
            p.mul_(10)
    return PMIScorer(encoder, TEMPLATES["en"], head, dict(METADATA), context_turns=3)


def _commit(cache: Path, repo_id: str, commit: str, source: Path, ref: str | None = "main") -> None:
    """One commit of a model repo in a Hub cache; ``refs/<ref>`` holds the commit hash without a newline."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    shutil.copytree(source, repo / "snapshots" / commit)
    if ref:
        (repo / "refs").mkdir(parents=True, exist_ok=True)
        (repo / "refs" / ref).write_text(commit)


@pytest.fixture
def hub_cache(tmp_path, tiny_encoder):
    """org/pmi-scorer: main = commit A (seed 0), tag v0 = commit B (seed 1)."""
    cache = tmp_path / "hub"
    for commit, seed, ref in ((COMMIT_A, 0, "main"), (COMMIT_B, 1, "v0")):
        _commit(cache, "org/pmi-scorer", commit, _scorer(tiny_encoder, seed).save_pretrained(tmp_path / ref), ref)
    return cache


def test_from_pretrained_reads_the_hub_cache_offline(hub_cache, tiny_encoder, tmp_path):
    expected = _scorer(tiny_encoder, 0).score(CONTEXTS, REPLIES)
    loaded = PMIScorer.from_pretrained("org/pmi-scorer", encoder=tiny_encoder, hub_cache_dir=hub_cache)
    np.testing.assert_allclose(loaded.score(CONTEXTS, REPLIES), expected, atol=1e-6)
    assert loaded.metadata["best_val_auc"] == METADATA["best_val_auc"] and loaded.context_turns == 3
    # a revision: a tag, or a commit hash, resolves to its own snapshot
    other = _scorer(tiny_encoder, 1).score(CONTEXTS, REPLIES)
    for revision in ("v0", COMMIT_B):
        got = PMIScorer.from_pretrained(
            "org/pmi-scorer", encoder=tiny_encoder, hub_cache_dir=hub_cache, revision=revision
        )
        np.testing.assert_allclose(got.score(CONTEXTS, REPLIES), other, atol=1e-6)
    assert not np.allclose(other, expected)
    # a local directory still wins
    local = PMIScorer.from_pretrained(tmp_path / "main", encoder=tiny_encoder)
    np.testing.assert_allclose(local.score(CONTEXTS, REPLIES), expected, atol=1e-6)


def test_the_hub_cache_dir_can_come_from_the_environment(hub_cache, tiny_encoder, monkeypatch):
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(hub_cache))
    assert PMIScorer.from_pretrained("org/pmi-scorer", encoder=tiny_encoder).metadata["test_auc"] == 0.8677


def test_missing_repos_and_revisions_fail_clearly(hub_cache, tiny_encoder):
    with pytest.raises(ScorerLoadError, match=r"org/unknown: not a local directory.*HF_HUB_OFFLINE=1"):
        PMIScorer.from_pretrained("org/unknown", encoder=tiny_encoder, hub_cache_dir=hub_cache)
    with pytest.raises(ScorerLoadError, match="revision v9"):
        PMIScorer.from_pretrained("org/pmi-scorer", encoder=tiny_encoder, hub_cache_dir=hub_cache, revision="v9")
    with pytest.raises(ScorerLoadError, match="not a directory"):
        PMIScorer.from_pretrained("/no/such/scorer", encoder=tiny_encoder)
    with pytest.raises(TypeError, match="runtime options"):
        PMIScorer.from_pretrained("org/pmi-scorer", encoder=tiny_encoder, hub_cache_dir=hub_cache, pooling="last")


def test_push_to_hub_round_trip(tmp_path, tiny_encoder, monkeypatch):
    """push_to_hub creates the repo and commits the saved directory; the fake remote publishes each commit into
    the Hub cache, from which from_pretrained loads the same scorer back."""
    cache, calls = tmp_path / "hub", []

    def create_repo(self, repo_id, **kwargs):
        calls.append(("create_repo", repo_id, kwargs))

    def upload_folder(self, *, repo_id, folder_path, **kwargs):
        calls.append(("upload_folder", repo_id, kwargs))
        _commit(cache, repo_id, "c" * 40, Path(folder_path))
        return huggingface_hub.CommitInfo(
            commit_url=f"https://huggingface.co/{repo_id}/commit/{'c' * 40}",
            commit_message=kwargs["commit_message"],
            commit_description="",
            oid="c" * 40,
        )

    monkeypatch.setattr(huggingface_hub.HfApi, "create_repo", create_repo)
    monkeypatch.setattr(huggingface_hub.HfApi, "upload_folder", upload_folder)
    scorer = _scorer(tiny_encoder, 0)
    url = scorer.push_to_hub("org/pushed", private=True)
    assert url.endswith("c" * 40) and [c[0] for c in calls] == ["create_repo", "upload_folder"]
    assert calls[0][2]["private"] is True and calls[0][2]["exist_ok"] is True
    loaded = PMIScorer.from_pretrained("org/pushed", encoder=tiny_encoder, hub_cache_dir=cache)
    np.testing.assert_allclose(loaded.score(CONTEXTS, REPLIES), scorer.score(CONTEXTS, REPLIES), atol=1e-6)
    card = (cache / "models--org--pushed" / "snapshots" / ("c" * 40) / "README.md").read_text()
    assert 'PMIScorer.from_pretrained("org/pushed")' in card
    reward = PMIReward(loaded, empty_score=-1.0)
    assert reward(CONTEXTS, ["Coltrane.", ""])[1] == -1.0
    # an encoder read from a local folder would not travel: the repo would load nowhere else
    (tmp_path / "my-bert").mkdir()
    scorer.encoder.spec = dataclasses.replace(scorer.encoder.spec, model=str(tmp_path / "my-bert"))
    calls.clear()
    with pytest.raises(ValueError, match="local folder"):
        scorer.push_to_hub("org/local")
    # a bare name: the Hub makes it user/name, while the card (and the upload) named the bare one
    with pytest.raises(ValueError, match="with its namespace"):
        scorer.push_to_hub("pushed")
    assert calls == []


def test_a_revision_is_not_silently_dropped_for_a_local_folder_and_hub_invalid_names_are_paths(
    tmp_path, tiny_encoder, monkeypatch
):
    """``from_pretrained("org/s", revision="v2")`` with a ``./org/s`` folder loaded the folder, whatever its version;
    a missing folder named with ``--`` (not a valid repo id) reached the Hub's own validation error."""
    monkeypatch.chdir(tmp_path)
    _scorer(tiny_encoder, 0).save_pretrained(tmp_path / "org" / "s")
    with pytest.raises(ScorerLoadError, match="revision 'v2' applies to Hub repo ids only"):
        PMIScorer.from_pretrained("org/s", encoder=tiny_encoder, revision="v2")
    assert PMIScorer.from_pretrained("org/s", encoder=tiny_encoder).directory is not None
    with pytest.raises(ScorerLoadError, match="runs/scorer--v2: not a directory"):
        PMIScorer.from_pretrained("runs/scorer--v2", encoder=tiny_encoder)


def test_model_card(tmp_path, tiny_encoder):
    directory = _scorer(tiny_encoder, 0).save_pretrained(tmp_path / "s")
    card = ModelCard.load(directory / "README.md")
    assert card.data.library_name == "pmi-reward" and "reward-model" in card.data.tags
    text = card.text
    for expected in (
        "`tiny-bert`",  # the encoder
        "separate context and reply embeddings",
        "Chit-Chat",
        "train / validation / test = 240 / 30 / 30",
        "4 x a reply from another dialogue",
        "1 x a line of the context itself",
        "`nwj`",
        "| 0.881 |",  # validation AUC
        "| 0.868 |",  # test AUC
        "## What the score means",
        "## Intended use",
        "## Limits",
        "GRPOTrainer(model=policy, reward_funcs=[reward]",
    ):
        assert expected in text, expected
    # a scorer without provenance still gets a card, saying what is not known
    bare = PMIScorer(tiny_encoder, TEMPLATES["en"], PMIHead(HeadConfig(dim=tiny_encoder.dim)))
    text = ModelCard.load(bare.save_pretrained(tmp_path / "bare") / "README.md").text
    assert "not recorded" in text and "## How to use" in text


def test_minilm_card_names_its_base_model(tmp_path, tiny_encoder):
    from pmi_reward.scoring.card import model_card

    config = _scorer(tiny_encoder, 0).config()
    config["encoder"]["model"] = "minilm"
    card = model_card(config, METADATA, "org/name")
    assert "base_model: sentence-transformers/all-MiniLM-L6-v2" in card and "language:\n- en" in card
    # any name of a shipped model gives its Hub id; a local folder gives none (its path is no Hub id)
    config["encoder"]["model"] = "all-MiniLM-L6-v2"
    assert "base_model: sentence-transformers/all-MiniLM-L6-v2" in model_card(config, METADATA, "org/name")
    config["encoder"]["model"] = str(tmp_path / "my-bert")
    assert "base_model" not in model_card(config, METADATA, "org/name")
    # the soft cap as configured (2.5 was printed as 2), scrambled negatives listed
    config["head"]["cap"] = 2.5
    training = {**METADATA["training"], "k_scrambled": 4}
    card = model_card(config, {**METADATA, "training": training}, "org/name")
    assert "soft cap 2.5" in card and "4 x the reply's own words in another order" in card


def test_a_local_folder_does_not_shadow_a_shipped_name(tmp_path, monkeypatch):
    """resolve_model reads "minilm" as the shipped model even beside a ./minilm folder; model_identity reads it the
    same way (the folder came first: one model counted as two)."""
    from pmi_reward.scoring.models import model_identity

    (tmp_path / "minilm").mkdir()
    monkeypatch.chdir(tmp_path)
    assert model_identity("minilm") == model_identity("all-MiniLM-L6-v2") == "minilm"
    assert model_identity(str(tmp_path / "minilm")) == str((tmp_path / "minilm").resolve())  # a path is its folder


def test_a_scorer_with_its_own_encoder_goes_through_the_hub(tmp_path, tiny_encoder_factory):
    """A scorer whose fine-tuned encoder lives in its ``encoder/`` folder: the card names what it was tuned from,
    and the Hub snapshot loads, encoder included, to the same scores."""
    encoder = tiny_encoder_factory("bert", "mean")
    with torch.no_grad():
        next(encoder.model.parameters()).add_(0.05)  # weights of its own, as after fine-tuning
    finish_tuning(encoder)
    scorer = _scorer(encoder, 0)
    scorer.metadata = {
        **METADATA,
        "base_encoder": "minilm",
        "training": {**METADATA["training"], "train_encoder": "lora"},
    }
    directory = scorer.save_pretrained(tmp_path / "tuned")
    assert (directory / "encoder" / "config.json").is_file()
    card = ModelCard.load(directory / "README.md")
    assert card.data.base_model == "sentence-transformers/all-MiniLM-L6-v2"
    assert "`minilm`" in card.text and "fine-tuned (lora) with the head" in card.text and "`encoder/`" in card.text
    _commit(tmp_path / "hub", "org/tuned", COMMIT_A, directory)
    loaded = PMIScorer.from_pretrained("org/tuned", device="cpu", hub_cache_dir=tmp_path / "hub")
    assert loaded.encoder.spec.model == LOCAL_ENCODER and loaded.encoder.spec.revision == encoder.spec.revision
    assert loaded.directory is not None and loaded.directory.name == COMMIT_A  # the encoder came from the snapshot
    np.testing.assert_allclose(loaded.score(CONTEXTS, REPLIES), scorer.score(CONTEXTS, REPLIES), atol=1e-5)


@pytest.fixture
def no_network(monkeypatch):
    """Every name look-up and connection attempt recorded and refused (the Hub's endpoint a local port): "offline"
    must need none."""
    attempts: list = []

    def getaddrinfo(host, *args, **kwargs):
        attempts.append(host)
        raise socket.gaierror(f"no network in this test ({host})")

    def connect(self, address):
        attempts.append(address)
        raise ConnectionRefusedError(f"no network in this test ({address})")

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", "http://127.0.0.1:9")
    return attempts


def test_an_unreachable_hub_is_not_blamed_on_local_files_only(tmp_path, monkeypatch, no_network):
    """Online with no connection to the Hub, and the repo not cached, the message blamed ``local_files_only``; it
    says that the Hub could not be reached now. Offline, it names what kept it offline."""
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    with pytest.raises(ScorerLoadError) as raised:
        PMIScorer.from_pretrained("org/unreachable", hub_cache_dir=tmp_path / "hub")
    message = str(raised.value)
    assert "could not be reached" in message and "127.0.0.1:9" in message and "local_files_only" not in message
    assert no_network  # it did try
    with pytest.raises(ScorerLoadError, match="with local_files_only=True nothing is downloaded"):
        PMIScorer.from_pretrained("org/unreachable", hub_cache_dir=tmp_path / "hub", local_files_only=True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ScorerLoadError, match="with HF_HUB_OFFLINE=1 nothing is downloaded"):
        PMIScorer.from_pretrained("org/unreachable", hub_cache_dir=tmp_path / "hub")

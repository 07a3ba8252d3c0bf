"""A scorer whose encoder is named by a Hub id records the commit the encoder's weights were loaded at
(config.json's ``encoder_commit``) and loads them at that commit again, whatever the repo's main branch is now; its
embeddings are cached under that commit. Offline, in a fake Hugging Face cache laid out as huggingface_hub lays it out
(``models--org--name/refs/main`` holding a commit, ``snapshots/<commit>/<files>``) with two commits of a tiny BERT
of different weights: nothing is downloaded."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import huggingface_hub
import numpy as np
import pytest
import torch

from pmi_reward.scoring.encoder import EncoderSpec, TextEncoder
from pmi_reward.scoring.head import HeadConfig, PMIHead
from pmi_reward.scoring.models import load_backbone
from pmi_reward.scoring.scorer import PMIScorer, ScorerLoadError
from pmi_reward.scoring.templates import TEMPLATES

REPO = "org/tiny-enc"
COMMIT_A, COMMIT_B = "a" * 40, "b" * 40
CONTEXTS = ["I love jazz.\nMe too!", "I went hiking.", "What did you cook tonight?"]
REPLIES = ["Coltrane is the best.", "Where did you go?", "Pasta with tomatoes."]
# the embedding cache keys (``EncoderSpec.fingerprint``) that the code before the commit was recorded computed (HEAD's
# encoder.py, 4b679e4): a shipped model's, and a Hub id's saved without a commit; both must stay as they were, or
# every existing embedding cache misses
SHIPPED_KEY = (
    '{"batch_size": null, "dtype": "float32", "layer": -1, "max_length": 256, "model": "minilm", "normalize": true, '
    '"pooling": "mean"}'
)
HUB_ID_KEY = (
    '{"batch_size": null, "dtype": "float32", "layer": -1, "max_length": 64, "model": "org/tiny-enc", '
    '"normalize": true, "pooling": "mean"}'
)


def _repo(cache: Path) -> Path:
    return cache / ("models--" + REPO.replace("/", "--"))


def _point_main(cache: Path, commit: str) -> None:
    """``refs/main`` of the fake repo at ``commit`` (without a newline, as huggingface_hub writes it)."""
    (_repo(cache) / "refs").mkdir(parents=True, exist_ok=True)
    (_repo(cache) / "refs" / "main").write_text(commit)


@pytest.fixture
def hub_cache(tmp_path, monkeypatch, tiny_model_factory, tokenizer):
    """A Hugging Face cache, offline, holding two commits of ``REPO``: A (the tiny BERT) and B (its weights moved),
    main at A. huggingface_hub reads HF_HUB_CACHE and HF_HUB_OFFLINE at import: its constants are set."""
    cache = tmp_path / "hf-hub"
    generator = torch.Generator().manual_seed(1)
    for commit in (COMMIT_A, COMMIT_B):
        model = tiny_model_factory("bert")
        if commit == COMMIT_B:
            with torch.no_grad():
                for param in model.parameters():
                    param.add_(0.5 * torch.randn(param.shape, generator=generator))
        model.save_pretrained(_repo(cache) / "snapshots" / commit)
        tokenizer.save_pretrained(_repo(cache) / "snapshots" / commit)
    _point_main(cache, COMMIT_A)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache


def _scorer() -> PMIScorer:
    """A scorer on ``REPO`` as a training run builds its encoder (by name: the main branch's weights), its head seeded
    and scaled so that its scores spread."""
    encoder = TextEncoder(EncoderSpec(model=REPO, max_length=64, encode_batch_size=8), device="cpu")
    torch.manual_seed(0)
    head = PMIHead(HeadConfig(dim=encoder.dim))
    with torch.no_grad():
        for param in head.parameters():
            param.mul_(3)
    return PMIScorer(encoder, TEMPLATES["en"], head, context_turns=3)


def _config(directory: Path) -> dict:
    return json.loads((directory / "config.json").read_text(encoding="utf-8"))


def test_a_scorer_saved_at_commit_a_loads_commit_a_after_main_moves(hub_cache, tmp_path):
    """The encoder was recorded by name alone: once main moved to B, the head trained on A's embeddings scored B's."""
    trained = _scorer()
    expected = trained.score(CONTEXTS, REPLIES)
    trained.save_pretrained(tmp_path / "scorer")

    _point_main(hub_cache, COMMIT_B)
    on_main = _scorer().score(CONTEXTS, REPLIES)  # the same head on main's weights now: other scores
    assert np.abs(on_main - expected).max() > 1e-3

    loaded = PMIScorer.from_pretrained(tmp_path / "scorer", device="cpu")
    np.testing.assert_allclose(loaded.score(CONTEXTS, REPLIES), expected, atol=1e-6)
    saved = _config(tmp_path / "scorer")
    assert saved["encoder_commit"] == COMMIT_A
    assert saved["encoder"]["model"] == REPO and saved["encoder"]["revision"] is None  # the spec saved as before
    # saved again, it records the same commit, and its spec without the commit the cache keys use in memory
    loaded.save_pretrained(tmp_path / "again")
    again = _config(tmp_path / "again")
    assert again["encoder_commit"] == COMMIT_A and again["encoder"]["revision"] is None


def test_a_snapshot_downloaded_by_its_commit_alone_loads(hub_cache, tmp_path):
    """`hf download REPO --revision SHA` writes the snapshot and no branch: the encoder's default pooling, read from
    the main branch's config, did not load."""
    trained = _scorer()
    expected = trained.score(CONTEXTS, REPLIES)
    trained.save_pretrained(tmp_path / "scorer")
    shutil.rmtree(_repo(hub_cache) / "refs")
    loaded = PMIScorer.from_pretrained(tmp_path / "scorer", device="cpu")
    np.testing.assert_allclose(loaded.score(CONTEXTS, REPLIES), expected, atol=1e-6)


def test_offline_without_the_commits_snapshot_the_error_says_how_to_get_it(hub_cache, tmp_path):
    """Main's snapshot loaded in its place, silently."""
    _scorer().save_pretrained(tmp_path / "scorer")
    _point_main(hub_cache, COMMIT_B)
    shutil.rmtree(_repo(hub_cache) / "snapshots" / COMMIT_A)
    with pytest.raises(ScorerLoadError) as caught:
        PMIScorer.from_pretrained(tmp_path / "scorer", device="cpu")
    message = str(caught.value)
    assert "\n" not in message
    assert str(tmp_path / "scorer" / "config.json") in message and "encoder_commit" in message
    assert f"hf download {REPO} --revision {COMMIT_A}" in message
    assert isinstance(caught.value, FileNotFoundError)  # an EncoderNotFoundError, as for an encoder found nowhere


def test_a_scorer_saved_without_the_commit_loads_main_as_before(hub_cache, tmp_path):
    """Backward compatibility: no ``encoder_commit``, the main branch's weights, and the cache key of before."""
    _scorer().save_pretrained(tmp_path / "scorer")
    config = _config(tmp_path / "scorer")
    config.pop("encoder_commit", None)
    (tmp_path / "scorer" / "config.json").write_text(json.dumps(config), encoding="utf-8")
    _point_main(hub_cache, COMMIT_B)

    loaded = PMIScorer.from_pretrained(tmp_path / "scorer", device="cpu")
    np.testing.assert_allclose(loaded.score(CONTEXTS, REPLIES), _scorer().score(CONTEXTS, REPLIES), atol=1e-6)
    assert loaded.encoder.spec.revision is None and loaded.encoder.spec.pooling is None
    assert loaded.encoder.spec.fingerprint(loaded.encoder.pooling) == HUB_ID_KEY


def test_cache_keys_part_commits_and_keep_the_old_ones(hub_cache, tmp_path):
    """Both commits' embeddings were cached under the bare Hub id: a scorer at B read A's from a shared cache."""
    assert EncoderSpec(model="minilm").fingerprint("mean") == SHIPPED_KEY
    assert _scorer().encoder.spec.fingerprint("mean") == HUB_ID_KEY  # a training run's encoder, by name, as before
    _scorer().save_pretrained(tmp_path / "at-a")
    _point_main(hub_cache, COMMIT_B)
    _scorer().save_pretrained(tmp_path / "at-b")

    embeddings = tmp_path / "embeddings"
    keys, hits = [], []
    for name in ("at-a", "at-b", "at-a"):
        scorer = PMIScorer.from_pretrained(tmp_path / name, device="cpu", cache_dir=embeddings)
        scorer.score(CONTEXTS, REPLIES)
        keys.append(scorer.encoder.spec.fingerprint(scorer.encoder.pooling))
        hits.append(scorer.encoder.stats.cache_hits)
        assert scorer.encoder.cache is not None
        scorer.encoder.cache.close()
    assert keys[0] != keys[1] and keys[0] == keys[2] and HUB_ID_KEY not in keys
    assert COMMIT_A in keys[0] and COMMIT_B in keys[1]
    assert hits[1] == 0  # B read none of A's embeddings
    assert hits[2] > 0  # A reads its own again


def test_an_invalid_or_shadowed_commit_record_is_refused(hub_cache, tmp_path, monkeypatch):
    """A damaged record was ignored (main loaded); a folder named like the Hub id loaded in the commit's place."""
    _scorer().save_pretrained(tmp_path / "scorer")
    config = _config(tmp_path / "scorer")
    (tmp_path / "scorer" / "config.json").write_text(json.dumps({**config, "encoder_commit": "main"}))
    with pytest.raises(ScorerLoadError, match=r"invalid field 'encoder_commit' \(expected a commit hash"):
        PMIScorer.from_pretrained(tmp_path / "scorer", device="cpu")

    (tmp_path / "scorer" / "config.json").write_text(json.dumps(config))
    shutil.copytree(_repo(hub_cache) / "snapshots" / COMMIT_B, tmp_path / "cwd" / REPO)
    monkeypatch.chdir(tmp_path / "cwd")
    with pytest.raises(ScorerLoadError, match=r"is a folder here, which would load in its place"):
        PMIScorer.from_pretrained(tmp_path / "scorer", device="cpu")


def test_a_revision_is_for_hub_ids_only(hub_cache, tmp_path):
    """transformers ignores a revision given with a folder: the folder's files, not the ones asked for."""
    with pytest.raises(ValueError, match="applies to Hub model ids only"):
        load_backbone("minilm", revision=COMMIT_A)
    with pytest.raises(ValueError, match="applies to Hub model ids only"):
        load_backbone(str(_repo(hub_cache) / "snapshots" / COMMIT_A), revision=COMMIT_A)

"""A saved scorer whose encoder drifted or whose config.json is damaged: refused by name, never a silent wrong score.

A scorer trained on a local encoder folder (``--model ./my-encoder``) records the digests of the folder's files that
decide its embeddings; a folder retrained or updated in place afterwards is refused when the scorer loads, naming the
file. A config.json field of the wrong type, or one every version has written and is now missing, is refused naming
the field (it was a raw TypeError or AttributeError, or silently today's default).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from pmi_reward.scoring.encoder import EncoderSpec, TextEncoder
from pmi_reward.scoring.head import HeadConfig, PMIHead
from pmi_reward.scoring.scorer import PMIScorer, ScorerLoadError
from pmi_reward.scoring.templates import TEMPLATES, PromptTemplate

# config.json's record of a local encoder folder's files (the on-disk format: spelled out, not imported)
ENCODER_FOLDER_DIGESTS = "encoder_folder_sha256"
PAIRS = (["I love pizza.", "Did you watch the match?"], ["Pasta is my favourite dish.", "Our team won the cup!"])


def _scorer(encoder: TextEncoder) -> PMIScorer:
    """A scorer on ``encoder`` with a head whose scores spread (an untrained one is nearly constant)."""
    torch.manual_seed(0)
    head = PMIHead(HeadConfig(dim=encoder.dim, cap=5.0))
    with torch.no_grad():
        for parameter in head.parameters():
            parameter.mul_(3)
    return PMIScorer(encoder, TEMPLATES["en"], head, {}, 2)


@pytest.fixture
def folder_scorer(tiny_encoder_factory, tmp_path, monkeypatch) -> tuple[Path, Path, np.ndarray]:
    """A tiny config-built encoder saved to ``project/models/enc`` and a scorer on it saved to
    ``project/out/scorer``, as `pmi-reward train --model models/enc` run in ``project`` saves one (the working
    directory is ``project`` after this): (the encoder folder, the scorer folder, its scores of ``PAIRS``)."""
    project = tmp_path / "project"
    folder = project / "models" / "enc"
    tiny = tiny_encoder_factory()
    tiny.model.save_pretrained(folder)
    tiny.tokenizer.save_pretrained(folder)
    monkeypatch.chdir(project)
    encoder = TextEncoder(EncoderSpec(model="models/enc", pooling="mean", max_length=64), device="cpu")
    scorer = _scorer(encoder)
    return folder, scorer.save_pretrained("out/scorer").resolve(), scorer.score(*PAIRS)


def _perturb(weights: Path) -> None:
    """The weights file rewritten in place with other values (the encoder retrained or updated there)."""
    state = load_file(weights)
    generator = torch.Generator().manual_seed(1)
    save_file({k: v + 0.05 * torch.randn(v.shape, generator=generator) for k, v in state.items()}, weights)


def _edit(scorer_dir: Path, edit) -> None:
    """config.json of ``scorer_dir`` rewritten after ``edit(config)``."""
    path = scorer_dir / "config.json"
    config = json.loads(path.read_text())
    edit(config)
    path.write_text(json.dumps(config))


def test_the_encoder_folders_files_are_recorded_and_an_unchanged_folder_loads_with_identical_scores(folder_scorer):
    """config.json records the sha256 of the folder's config, weights and tokenizer files (not of other files there,
    such as a training run's optimizer state); the scorer, loaded with the folder unchanged, scores as saved."""
    folder, saved, expected = folder_scorer
    (folder / "optimizer.pt").write_bytes(b"a training run's state")  # not the encoder's: neither recorded nor checked
    recorded = json.loads((saved / "config.json").read_text())[ENCODER_FOLDER_DIGESTS]
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= set(recorded)
    assert "optimizer.pt" not in recorded and all(len(digest) == 64 for digest in recorded.values())
    np.testing.assert_array_equal(PMIScorer.from_pretrained(saved).score(*PAIRS), expected)


@pytest.mark.parametrize(
    ("change", "file", "what"),
    [
        (lambda folder: _perturb(folder / "model.safetensors"), "model.safetensors", "changed since this scorer"),
        (
            lambda folder: (folder / "tokenizer.json").unlink(),
            "tokenizer.json",
            "missing, though the encoder folder held it",
        ),
        (
            lambda folder: shutil.copy(folder / "model.safetensors", folder / "model-extra.safetensors"),
            "model-extra.safetensors",
            "added to the encoder folder since",
        ),
    ],
    ids=["weights-retrained-in-place", "tokenizer-file-gone", "weights-file-added"],
)
def test_an_encoder_folder_changed_since_the_scorer_was_saved_is_refused_naming_the_file(
    folder_scorer, change, file, what
):
    """The folder retrained or updated in place after the scorer was trained: the scorer loaded it silently and its
    head, trained on the old embeddings, scored the new ones (repro: MiniLM copied, weights perturbed, scores
    [-3.97, 2.19] became [-1.36, -1.37]). It is refused, naming the file and what to do."""
    folder, saved, _ = folder_scorer
    change(folder)
    with pytest.raises(ScorerLoadError, match=rf"^{re.escape(str(folder / file))}:? .*{what}") as caught:
        PMIScorer.from_pretrained(saved)
    message = str(caught.value)
    assert (
        "The encoder folder changed since the scorer was trained" in message
        and "restore the folder, or retrain the scorer" in message
    )


def test_the_check_follows_the_folder_where_a_moved_project_finds_it(folder_scorer, tmp_path, monkeypatch):
    """The folder checked is the one loaded, as ``_find_encoder_folder`` finds it: the project moved and loaded from
    elsewhere, its unchanged encoder loads with identical scores; changed there, it is refused naming the moved
    file."""
    folder, saved, expected = folder_scorer
    moved, elsewhere = tmp_path / "moved", tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "project").rename(moved)
    monkeypatch.chdir(elsewhere)
    moved_scorer = moved / "out" / "scorer"
    np.testing.assert_array_equal(PMIScorer.from_pretrained(moved_scorer).score(*PAIRS), expected)
    _perturb(moved / "models" / "enc" / "model.safetensors")
    with pytest.raises(
        ScorerLoadError, match=rf"^{re.escape(str(moved / 'models' / 'enc' / 'model.safetensors'))} changed"
    ):
        PMIScorer.from_pretrained(moved_scorer)


def test_a_shared_encoder_is_checked_against_the_folder_too(folder_scorer):
    """A scorer given an already loaded encoder (the judge panel's sharing) is checked like one that loads its own:
    the folder changed since it was saved is refused."""
    folder, saved, _ = folder_scorer
    shared = PMIScorer.from_pretrained(saved).encoder
    _perturb(folder / "model.safetensors")
    with pytest.raises(ScorerLoadError, match="model.safetensors changed since this scorer was trained"):
        PMIScorer.from_pretrained(saved, encoder=shared)


def test_a_scorer_saved_before_the_digests_were_recorded_loads_unchecked_as_before(folder_scorer):
    """A config.json without ``encoder_folder_sha256`` (every scorer saved before) loads as it did: from the folder
    as it is now, unchecked, scoring what that folder embeds."""
    folder, saved, expected = folder_scorer
    _edit(saved, lambda config: config.pop(ENCODER_FOLDER_DIGESTS, None))
    np.testing.assert_array_equal(PMIScorer.from_pretrained(saved).score(*PAIRS), expected)
    _perturb(folder / "model.safetensors")
    changed = PMIScorer.from_pretrained(saved).score(*PAIRS)
    assert not np.allclose(changed, expected)  # the folder's new weights, as before this check existed
    fresh = TextEncoder(EncoderSpec(model="models/enc", pooling="mean", max_length=64), device="cpu")
    np.testing.assert_array_equal(changed, _scorer(fresh).score(*PAIRS))


@pytest.mark.parametrize("digests", [["model.safetensors"], {"model.safetensors": 7}, {"../x": "0" * 64}])
def test_a_malformed_folder_digest_record_is_refused_naming_the_field(folder_scorer, digests):
    _, saved, _ = folder_scorer
    _edit(saved, lambda config: config.update({ENCODER_FOLDER_DIGESTS: digests}))
    with pytest.raises(ScorerLoadError, match=f"config.json: invalid field '{ENCODER_FOLDER_DIGESTS}'"):
        PMIScorer.from_pretrained(saved)


def test_an_encoder_named_by_a_hub_id_or_shipped_name_records_no_digests(tiny_encoder_factory, tmp_path, monkeypatch):
    """Only a folder given by path is hashed: a Hub id's or a shipped model's weights are not read at save."""
    monkeypatch.chdir(tmp_path)
    for name in ("myorg/tiny-enc", "minilm"):
        encoder = tiny_encoder_factory()
        encoder.spec = EncoderSpec(model=name, pooling="mean", max_length=64)
        saved = _scorer(encoder).save_pretrained(tmp_path / name.replace("/", "-"))
        assert ENCODER_FOLDER_DIGESTS not in json.loads((saved / "config.json").read_text())


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            lambda c: c["encoder"].update(layer="-1"),
            r"invalid field 'encoder' \(layer must be a whole number, got '-1'",
        ),
        (lambda c: c["encoder"].update(model=None), r"invalid field 'encoder' \(model must be a model name or path"),
        (lambda c: c["encoder"].update(normalize="yes"), r"invalid field 'encoder' \(normalize must be true or false"),
        (lambda c: c["encoder"].update(pooling="cls"), r"invalid field 'encoder' \(pooling must be 'mean', 'last'"),
        (lambda c: c["encoder"].update(max_length=64.5), r"invalid field 'encoder' \(max_length must be a whole"),
        (lambda c: c["encoder"].pop("pooling"), r"invalid field 'encoder' \(missing field\(s\) \['pooling'\]"),
        (lambda c: c["encoder"].pop("model"), r"invalid field 'encoder' \(missing field\(s\) \['model'\]"),
        (lambda c: c["template"].pop("context_template"), r"invalid field 'template' \(missing .*'context_template'"),
        (lambda c: c["template"].update(pair_template=["{context}", "{response}"]), r"pair_template must be text"),
        (lambda c: c.pop("version"), r"missing field 'version'"),
    ],
    ids=[
        "layer-str",
        "model-null",
        "normalize-str",
        "pooling-unknown",
        "max_length-float",
        "no-pooling",
        "no-model",
        "no-context_template",
        "pair_template-list",
        "no-version-no-metadata",
    ],
)
def test_a_config_field_of_the_wrong_type_or_missing_is_refused_naming_it(folder_scorer, edit, message):
    """Each was a raw TypeError or AttributeError (``layer`` a string, ``model`` null), or silently today's default
    (no ``context_template``: contexts scored as "{context}"; no ``version``: read as version 1, its context turns
    dropped, whole contexts scored)."""
    _, saved, _ = folder_scorer
    _edit(saved, edit)
    with pytest.raises(ScorerLoadError, match=rf"^{re.escape(str(saved / 'config.json'))}: .*{message}"):
        PMIScorer.from_pretrained(saved)


def test_a_version_1_config_without_version_but_with_metadata_still_loads(folder_scorer):
    """Version 1 wrote ``metadata`` into config.json (and its template as name/pair/context/response): a file with
    ``metadata`` and no ``version`` is read as version 1, as before, its context-turn count from the provenance."""
    _, saved, expected = folder_scorer

    def as_version_1(config: dict) -> None:
        template = config["template"]
        config.pop("version")
        config.pop("context_turns")
        config["metadata"] = {"data": {"max_context_turns": 2}}
        config["template"] = {
            "name": "en",
            "pair": template["pair_template"],
            "context": template["context_template"],
            "response": template["response_template"],
        }

    _edit(saved, as_version_1)
    loaded = PMIScorer.from_pretrained(saved)
    assert loaded.context_turns == 2
    np.testing.assert_array_equal(loaded.score(*PAIRS), expected)
    _edit(saved, lambda config: config["template"].pop("context"))  # every version-1 file has it
    with pytest.raises(ScorerLoadError, match=r"invalid field 'template' \(missing field\(s\) \['context'\]"):
        PMIScorer.from_pretrained(saved)


@pytest.mark.parametrize(("field", "value"), [("layer", 9), ("max_length", 4096)])
def test_a_saved_layer_or_length_the_model_lacks_blames_config_json_not_a_flag(folder_scorer, field, value):
    """A saved ``encoder.layer`` out of the model's range was reported as "--layer 9: ...", a flag the user loading
    a scorer never gave; it names config.json's field."""
    _, saved, _ = folder_scorer
    _edit(saved, lambda config: config["encoder"].update({field: value}))
    with pytest.raises(
        ScorerLoadError, match=rf"^{re.escape(str(saved / 'config.json'))}: its encoder.{field} {value}"
    ) as caught:
        PMIScorer.from_pretrained(saved)
    assert "--layer" not in str(caught.value)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"layer": "-1"}, "layer must be a whole number, got '-1'"),
        ({"layer": True}, "layer must be a whole number, got True"),
        ({"encode_batch_size": 2.0}, "encode_batch_size must be a whole number"),
        ({"model": ""}, "model must be a model name or path, got ''"),
        ({"revision": 3}, "revision must be a string or null"),
    ],
)
def test_encoder_spec_refuses_a_field_of_the_wrong_type_naming_it(fields, message):
    with pytest.raises(ValueError, match=message):
        EncoderSpec(**{"model": "minilm", **fields})


def test_prompt_template_from_dict_requires_every_field():
    """``to_dict`` of either format writes every field; one missing was filled with today's default."""
    full = TEMPLATES["plain"].to_dict()
    assert PromptTemplate.from_dict(full) == TEMPLATES["plain"]
    for name in full:
        with pytest.raises(ValueError, match=f"missing field\\(s\\) \\['{name}'\\]"):
            PromptTemplate.from_dict({k: v for k, v in full.items() if k != name})


def test_a_files_digest_is_read_once_while_it_is_unchanged_and_again_when_it_changes(tmp_path, monkeypatch):
    """Each load of a scorer on a local encoder folder hashed all its weights (a panel's judges share one): the digest
    of a settled file is kept while its identity and state are unchanged; a file written within the last
    _SETTLED_S seconds is read each time (a rewrite within the timestamp's granularity keeps its mtime)."""
    import hashlib
    import os
    import time

    from pmi_reward.scoring import scorer as scorer_module

    reads = []
    real = scorer_module._digest_of.__wrapped__
    monkeypatch.setattr(scorer_module._digest_of, "__wrapped__", lambda *a: reads.append(a[0]) or real(*a))
    path = tmp_path / "weights.bin"
    monkeypatch.setattr(scorer_module, "_SETTLED_S", 3600.0)  # "recent" however slow this machine is
    path.write_bytes(b"a" * 1000)
    old = time.time() - 7200
    os.utime(path, (old, old))
    before = scorer_module._digest_of.cache_info()
    first = scorer_module._digest(path)
    assert scorer_module._digest(path) == first == hashlib.sha256(b"a" * 1000).hexdigest()
    after = scorer_module._digest_of.cache_info()
    assert (after.misses - before.misses, after.hits - before.hits) == (1, 1)  # read once, then kept
    path.write_bytes(b"b" * 1000)  # the same size, written now: another mtime, so another key
    assert scorer_module._digest(path) == hashlib.sha256(b"b" * 1000).hexdigest()
    recent = path.stat().st_mtime_ns
    path.write_bytes(b"c" * 1000)
    os.utime(path, ns=(recent, recent))  # a rewrite within the granularity: the same size and mtime
    assert scorer_module._digest(path) == hashlib.sha256(b"c" * 1000).hexdigest()
    assert len(reads) == 2  # the recent file's two reads; the settled one is read by the cache itself

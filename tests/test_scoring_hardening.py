"""The scoring core under conditions a user meets: a cache folder it may not write, a whole file scored at once, a
scorer loaded from another folder, a layer the model lacks, broken text, and a run killed while it embeds."""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import shutil
import sqlite3
from pathlib import Path

import numpy as np
import pytest
import torch

from pmi_reward.scoring import encoder as encoder_module
from pmi_reward.scoring import scorer as scorer_module
from pmi_reward.scoring.cache import EmbeddingCache, cache_key
from pmi_reward.scoring.card import model_card
from pmi_reward.scoring.encoder import EncoderSpec, TextEncoder
from pmi_reward.scoring.head import HeadConfig, PMIHead
from pmi_reward.scoring.scorer import PMIScorer, ScorerLoadError
from pmi_reward.scoring.templates import TEMPLATES

TEXTS = ["seen before", "a new one", "another new one, a little longer than the others"]
CACHE_LOGGER = "pmi_reward.scoring.cache"


def _populated(folder: Path, encoder_factory) -> np.ndarray:
    """A cache in ``folder`` holding the first text's embedding only; all the texts' embeddings (no cache)."""
    expected = encoder_factory().encode(TEXTS)
    writer = EmbeddingCache(folder)
    encoder_factory(cache=writer).encode(TEXTS[:1])
    writer.close()
    return expected


def _cache_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == CACHE_LOGGER]


def _refuse_writable_open(monkeypatch, read_only_too: bool) -> None:
    """``sqlite3.connect`` as a process that may not write the cache folder finds it: the read-write open fails
    (SQLite's READONLY, as another user's WAL cache raises it), and a ``mode=ro`` one too where ``read_only_too``
    (a WAL database whose folder does not let SQLite make its ``-shm`` file). Root ignores chmod, so the test
    suite, which may run as root, cannot make a real one."""
    connect = sqlite3.connect

    def refusing(database, *args, uri: bool = False, **kwargs):
        if not uri or read_only_too:
            err = sqlite3.OperationalError("attempt to write a readonly database")
            err.sqlite_errorcode = 8  # type: ignore[attr-defined]
            raise err
        return connect(database, *args, uri=uri, **kwargs)

    monkeypatch.setattr(sqlite3, "connect", refusing)


def test_a_cache_folder_that_cannot_be_written_is_read_only_or_absent_never_a_crash(
    tiny_encoder_factory, tmp_path, monkeypatch, caplog
):
    """A cache folder the process may read but not write (another user's ~/.cache, a team cache on a read-only
    mount) made ``EmbeddingCache()`` raise sqlite3.OperationalError: `pmi-reward train`, `serve` and
    ``from_pretrained(cache_dir=...)`` ended in a traceback. It is opened read-only (its rows still answer), or,
    where SQLite cannot read it so either, scoring runs without one; one warning names the path either way."""
    expected = _populated(tmp_path, tiny_encoder_factory)
    _refuse_writable_open(monkeypatch, read_only_too=False)
    with caplog.at_level(logging.WARNING, logger=CACHE_LOGGER):
        cache = EmbeddingCache(tmp_path)
        encoder = tiny_encoder_factory(cache=cache)
        np.testing.assert_allclose(encoder.encode(TEXTS), expected, atol=1e-6)
        np.testing.assert_allclose(encoder.encode(TEXTS), expected, atol=1e-6)
    assert not cache.writable and len(cache) == 1  # the first text read from it, the new ones not written
    assert encoder.stats.cache_hits == 2 and encoder.stats.texts == 4
    warned = _cache_warnings(caplog)
    assert len(warned) == 1 and str(cache.path) in warned[0] and "will not be saved" in warned[0]
    assert "reading it only" in warned[0]
    cache.close()

    caplog.clear()
    _refuse_writable_open(monkeypatch, read_only_too=True)
    with caplog.at_level(logging.WARNING, logger=CACHE_LOGGER):
        cache = EmbeddingCache(tmp_path)
        encoder = tiny_encoder_factory(cache=cache)
        np.testing.assert_allclose(encoder.encode(TEXTS), expected, atol=1e-6)
        cache.put([b"key"], np.ones((1, 4), dtype=np.float32))
    assert not cache.writable and len(cache) == 0 and cache.get([b"key"]) == {} and encoder.stats.cache_hits == 0
    warned = _cache_warnings(caplog)
    assert len(warned) == 1 and str(cache.path) in warned[0] and "running without a cache" in warned[0]
    assert "will not be saved" in warned[0]
    cache.close()


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores file permissions: chmod cannot make a read-only folder")
def test_a_really_read_only_cache_folder_opens(tiny_encoder_factory, tmp_path, caplog):
    """The same with real permissions, where the tests do not run as root: a populated cache folder, an empty one
    and one that cannot be made under a read-only folder."""
    populated, empty = tmp_path / "populated", tmp_path / "empty"
    expected = _populated(populated, tiny_encoder_factory)
    empty.mkdir()
    for folder in (populated, empty):
        folder.chmod(0o555)
    try:
        for folder in (populated, empty, empty / "below"):
            caplog.clear()
            with caplog.at_level(logging.WARNING, logger=CACHE_LOGGER):
                cache = EmbeddingCache(folder)
                np.testing.assert_allclose(tiny_encoder_factory(cache=cache).encode(TEXTS), expected, atol=1e-6)
            assert not cache.writable and len(_cache_warnings(caplog)) == 1
            cache.close()
    finally:
        for folder in (populated, empty):
            folder.chmod(0o755)


@pytest.mark.parametrize("code", [errno.EACCES, errno.EPERM, errno.EROFS])
def test_a_cache_folder_that_cannot_be_made_means_no_cache_even_as_root(
    tiny_encoder_factory, tmp_path, monkeypatch, caplog, code
):
    """The folder this process may not make (under a read-only folder or mount, in another user's tree): scoring
    runs without a cache, with one warning naming it. The real-permission test above is skipped as root, which CI
    runs as, so ``mkdir`` is made to refuse here as it does for a user; another failure (not a permission) is
    raised, not hidden."""
    refused = tmp_path / "readonly" / "below"
    real_mkdir = Path.mkdir

    def mkdir(self, *args, **kwargs):
        if self == refused:
            raise OSError(code, os.strerror(code), str(self))
        return real_mkdir(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", mkdir)
    expected = tiny_encoder_factory().encode(TEXTS)
    with caplog.at_level(logging.WARNING, logger=CACHE_LOGGER):
        cache = EmbeddingCache(refused)
        encoder = tiny_encoder_factory(cache=cache)
        np.testing.assert_allclose(encoder.encode(TEXTS), expected, atol=1e-6)
        cache.put([b"key"], np.ones((1, 4), dtype=np.float32))
    assert not cache.writable and len(cache) == 0 and cache.get([b"key"]) == {} and not refused.exists()
    assert encoder.stats.cache_hits == 0 and encoder.stats.texts == 3
    warned = _cache_warnings(caplog)
    assert len(warned) == 1 and str(cache.path) in warned[0] and "running without a cache" in warned[0]
    cache.close()
    code = errno.ENOSPC  # the patched mkdir now fails for a full disk: no permission problem, so it is raised
    with pytest.raises(OSError, match=os.strerror(errno.ENOSPC)):
        EmbeddingCache(refused)


def _scorer(encoder: TextEncoder, mode: str = "pair", lines: int = 0) -> PMIScorer:
    torch.manual_seed(0)
    head = PMIHead(HeadConfig(dim=encoder.dim, input_mode=mode, cap=5.0, line_turns=lines))
    with torch.no_grad():
        for p in head.parameters():
            p.mul_(3)  # an untrained head is nearly constant: spread the scores
    return PMIScorer(encoder, TEMPLATES["en"], head)


@pytest.mark.parametrize("mode,lines", [("pair", 2), ("prompt", 0)])
def test_score_builds_head_inputs_in_bounded_blocks(tiny_encoder_factory, monkeypatch, mode, lines):
    """``score`` built every pair's head inputs at once (about 45 KiB a pair at 768-d with line features): `pmi-reward
    score` on a large file ran out of memory after all of its encoding. It scores blocks of ``SCORE_BLOCK`` pairs,
    with the scores of one call."""
    scorer = _scorer(tiny_encoder_factory(batch_size=1), mode, lines)  # one text a forward: embeddings exact
    rng = np.random.default_rng(0)
    words = ["the", "a", "cat", "dog", "ran", "home", "pizza", "music", "rome", "tennis", "jazz", "choir"]
    contexts = ["\n".join(" ".join(rng.choice(words, 4)) for _ in range(3)) for _ in range(50)]
    responses = [" ".join(rng.choice(words, int(rng.integers(1, 8)))) for _ in range(50)]
    monkeypatch.setattr(scorer_module, "SCORE_BLOCK", 10**9, raising=False)
    whole = scorer.score(contexts, responses)
    rows: list[int] = []
    forward = scorer.head.forward

    def counting(u, v=None):
        rows.append(len(u))
        return forward(u, v)

    monkeypatch.setattr(scorer.head, "forward", counting)
    monkeypatch.setattr(scorer_module, "SCORE_BLOCK", 16, raising=False)
    blocked = scorer.score(contexts, responses)
    assert rows == [16, 16, 16, 2]
    assert blocked.dtype == np.float32 and blocked.shape == (50,) and np.ptp(blocked) > 0.1
    np.testing.assert_allclose(blocked, whole, rtol=0, atol=1e-6)


PAIR = (["I play the guitar."], ["Jazz relaxes me."])


def _local_encoder_scorer(
    tiny_encoder_factory, project: Path, monkeypatch, folder: str = "models/enc"
) -> tuple[PMIScorer, TextEncoder, np.ndarray]:
    """A scorer on the tiny encoder saved as the folder ``project/<folder>`` and named relatively, as `pmi-reward
    train --model <folder>` run in ``project`` names it (the working directory is ``project`` after this), and its
    score of one pair."""
    tiny = tiny_encoder_factory()
    tiny.model.save_pretrained(project / folder)
    tiny.tokenizer.save_pretrained(project / folder)
    monkeypatch.chdir(project)
    encoder = TextEncoder(EncoderSpec(model=folder, pooling="mean", max_length=64), device="cpu")
    scorer = _scorer(encoder)
    return scorer, encoder, scorer.score(*PAIR)


@pytest.mark.parametrize(
    ("folder", "scorer_dir"),
    [("models/enc", "out/scorer"), ("out/scorer/base", "out/scorer"), ("myorg/enc", "out/scorer")],
    ids=["beside", "inside", "hub-id-shaped-clone"],
)
def test_a_local_encoder_folder_is_saved_as_named_and_found_where_it_moved(
    tiny_encoder_factory, tmp_path, monkeypatch, folder, scorer_dir
):
    """A scorer on a local encoder folder (`pmi-reward train --model models/enc`; one inside the scorer's folder; a
    clone named like its Hub id, `hf download org/enc --local-dir org/enc`) keeps the name as given, so that a copy
    of the project (a checkout, a tarball, a serving box) loads from its root as it always did, and the card and
    ``/health`` name no path of this machine; it also records where the folder is, relative to the scorer and
    absolute, so that it loads from any other working directory too (by its absolute path it loaded only where it
    was trained)."""
    project, moved, elsewhere = tmp_path / "project", tmp_path / "moved", tmp_path / "elsewhere"
    elsewhere.mkdir()
    scorer, encoder, expected = _local_encoder_scorer(tiny_encoder_factory, project, monkeypatch, folder)
    saved = scorer.save_pretrained(scorer_dir)
    config = json.loads((saved / "config.json").read_text())
    assert config["encoder"]["model"] == folder
    absolute = (project / folder).resolve()
    assert config["encoder_folder"] == {
        "from_scorer": os.path.relpath(absolute, (project / scorer_dir).resolve()),
        "absolute": str(absolute),
    }
    assert str(tmp_path) not in (saved / "README.md").read_text() + (saved / "metadata.json").read_text()
    assert PMIScorer.from_pretrained(saved, encoder=encoder).encoder is encoder  # the run's encoder is shared
    project.rename(moved)  # the whole project moves; the original folder is gone
    monkeypatch.chdir(moved)
    loaded = PMIScorer.from_pretrained(scorer_dir)
    assert loaded.encoder.spec.model == folder  # as named: what /health shows, and a further tuning's base_encoder
    np.testing.assert_array_equal(loaded.score(*PAIR), expected)
    monkeypatch.chdir(elsewhere)  # the name means nothing here: found by its path from the scorer
    np.testing.assert_array_equal(PMIScorer.from_pretrained(moved / scorer_dir).score(*PAIR), expected)


def test_a_scorer_copied_without_its_encoder_finds_it_by_its_absolute_path_or_names_the_places_tried(
    tiny_encoder_factory, tmp_path, monkeypatch
):
    """A scorer folder copied alone (to a service's folder) finds its encoder by the absolute path it recorded; once
    that is gone too, the error names the scorer's config.json and each place it looked (a bare FileNotFoundError
    about an absolute path named neither the scorer nor config.json)."""
    project, copy, elsewhere = tmp_path / "project", tmp_path / "service" / "scorer", tmp_path / "elsewhere"
    elsewhere.mkdir()
    scorer, _, expected = _local_encoder_scorer(tiny_encoder_factory, project, monkeypatch)
    shutil.copytree(scorer.save_pretrained("out/scorer"), copy)
    monkeypatch.chdir(elsewhere)
    np.testing.assert_array_equal(PMIScorer.from_pretrained(copy).score(*PAIR), expected)
    project.rename(tmp_path / "gone")
    message = (
        f"{copy / 'config.json'}: its encoder.model 'models/enc' did not load: no folder at {copy}/../../models/enc "
        f"(its from_scorer path); {project / 'models' / 'enc'} (its absolute path); models/enc (from the working "
        f"directory {elsewhere}), and as a Hub id it did not load either"
    )
    with pytest.raises(ScorerLoadError, match="^" + re.escape(message)) as info:
        PMIScorer.from_pretrained(copy)
    assert isinstance(info.value, FileNotFoundError)  # as the loader's own error for a missing folder was


def test_the_recorded_encoder_folder_beats_a_same_named_one_in_the_working_directory(
    tiny_encoder_factory, tmp_path, monkeypatch
):
    """Another project's ``models/enc`` under the working directory stood in for the scorer's own encoder (the name
    as given was tried first): its scores, silently. The scorer's recorded folder comes first."""
    scorer, _, expected = _local_encoder_scorer(tiny_encoder_factory, tmp_path / "project", monkeypatch)
    saved = Path(scorer.save_pretrained("out/scorer")).resolve()
    other = tmp_path / "other"
    impostor = tiny_encoder_factory()  # another encoder of the same shape: its weights moved
    with torch.no_grad():
        for parameter in impostor.model.parameters():
            parameter.add_(0.5)
    impostor.model.save_pretrained(other / "models" / "enc")
    impostor.tokenizer.save_pretrained(other / "models" / "enc")
    monkeypatch.chdir(other)
    loaded = PMIScorer.from_pretrained(saved)
    np.testing.assert_array_equal(loaded.score(*PAIR), expected)
    assert Path(loaded.encoder.spec.model).resolve() == (tmp_path / "project" / "models" / "enc").resolve()


def test_a_scorer_tuned_further_records_its_base_encoder_as_named(tiny_encoder_factory, tmp_path, monkeypatch):
    """Fine-tuning a loaded scorer's encoder further (`--init_scorer`) records the encoder it started from as
    ``base_encoder`` in metadata.json and the card, which push_to_hub uploads: as named, never this machine's path."""
    from pmi_reward.training.trainable import finish_tuning

    scorer, _, _ = _local_encoder_scorer(tiny_encoder_factory, tmp_path / "project", monkeypatch)
    loaded = PMIScorer.from_pretrained(scorer.save_pretrained("out/frozen"))
    finish_tuning(loaded.encoder)  # what fit_scorer does after tuning it
    assert loaded.encoder.base_model == "models/enc"
    tuned = PMIScorer(loaded.encoder, loaded.template, loaded.head, {"base_encoder": loaded.encoder.base_model})
    saved = tuned.save_pretrained("out/tuned", repo_id="me/tuned")
    assert "encoder_folder" not in json.loads((saved / "config.json").read_text())  # its weights are inside
    assert str(tmp_path) not in (saved / "README.md").read_text() + (saved / "metadata.json").read_text()


def test_an_old_scorer_whose_relative_encoder_path_is_not_found_says_so(tiny_encoder_factory, tmp_path, monkeypatch):
    """A scorer saved with a relative encoder folder and no record of where it is (as all were before), loaded from
    another folder: the error was transformers' about huggingface.co, which never named the path. It names
    config.json and the path, and says where it is relative to."""
    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    elsewhere.mkdir()
    scorer, _, expected = _local_encoder_scorer(tiny_encoder_factory, project, monkeypatch)
    saved = scorer.save_pretrained(project / "out" / "scorer")
    config = json.loads((saved / "config.json").read_text())
    del config["encoder_folder"]  # as scorers were saved before
    (saved / "config.json").write_text(json.dumps(config))
    monkeypatch.chdir(elsewhere)
    message = r"(?s)config.json: its encoder.model 'models/enc' did not load.*relative to the directory the scorer"
    with pytest.raises(ScorerLoadError, match=message):
        PMIScorer.from_pretrained(saved)
    monkeypatch.chdir(project)  # from the training folder it loads, as it always did
    np.testing.assert_array_equal(PMIScorer.from_pretrained(saved).score(*PAIR), expected)


def test_a_layer_the_model_lacks_is_refused_when_the_encoder_is_built(tokenizer, tiny_model_factory):
    """``EncoderSpec.layer`` was never checked: `pmi-reward train --layer 12` on a 6-layer model built its pairs, then
    failed at the first encode with a bare IndexError (a traceback, not a user error)."""
    for layer in (3, -4, 12):
        spec = EncoderSpec(model="tiny-bert", pooling="mean", max_length=64, layer=layer)
        with pytest.raises(ValueError, match=rf"--layer {layer}: tiny-bert has 2 layers.*-3\.\.2"):
            TextEncoder(spec, device="cpu", model=tiny_model_factory("bert"), tokenizer=tokenizer)
    for layer in (2, 0, -3):  # the last layer's hidden state; the token embeddings, counted from either end
        spec = EncoderSpec(model="tiny-bert", pooling="mean", max_length=64, layer=layer)
        encoder = TextEncoder(spec, device="cpu", model=tiny_model_factory("bert"), tokenizer=tokenizer)
        assert encoder.encode(["hello"]).shape == (1, encoder.dim)


def test_a_lone_surrogate_is_refused_naming_the_argument_and_the_row(tiny_encoder):
    """A lone surrogate (JSON's "\\ud83d" without its pair, which json.loads accepts) reached the tokenizer: "TypeError:
    TextEncodeInput must be Union[...]", naming neither the argument nor the row."""
    scorer = _scorer(tiny_encoder)
    cut = json.loads('"nice \\ud83d"')
    with pytest.raises(
        ValueError, match=r"responses\[1\] is not valid text: a lone surrogate '\\ud83d' at character 5"
    ):
        scorer.score(["hi", "hello"], ["ok", cut])
    with pytest.raises(ValueError, match=r"contexts\[0\] is not valid text"):
        scorer.score([cut], ["ok"])
    assert np.isfinite(scorer.score(["🙂 hi"], ["nice 🙂"])).all()  # a whole emoji is text


def test_the_card_says_every_turn_and_names_the_pooling_used():
    """The card read "the last all turns" for a scorer without a context-turn limit, and "default pooling" for one
    saved with ``pooling: null`` (a SmolLM2 scorer's card never said it pools the last token)."""

    def rows(encoder: dict, turns: int | None, **kwargs) -> tuple[str, str]:
        config = {"encoder": encoder, "head": {"input_mode": "pair", "hidden": [8], "cap": 20.0}}
        card = model_card({**config, "context_turns": turns}, kwargs.pop("metadata", {}), **kwargs)
        lines = {line.split(" | ")[0].strip("| "): line for line in card.splitlines() if line.startswith("| ")}
        return lines["encoder"], lines["context read"]

    encoder, context = rows({"model": "smollm2-135m-instruct", "pooling": None, "max_length": 256}, None)
    assert "frozen; last-token pooling, up to 256 tokens" in encoder and "default pooling" not in encoder
    assert context == "| context read | every turn, one per line, oldest first |"
    encoder, context = rows({"model": "minilm", "pooling": None, "max_length": 256}, 3)
    assert "mean pooling" in encoder and context == "| context read | the last 3 turns, one per line, oldest first |"
    encoder, _ = rows({"model": "org/my-model", "pooling": None}, 3, pooling="last")  # as the saving scorer knows
    assert "last-token pooling" in encoder
    encoder, _ = rows({"model": "org/my-model", "pooling": None}, 3)  # nothing says: what the default is
    assert "the model's default pooling (mean for an encoder, the last token for a decoder LM)" in encoder
    tuned = {"model": "./encoder", "pooling": None}  # a fine-tuned SmolLM2: its base model's pooling
    encoder, _ = rows(tuned, 3, metadata={"base_encoder": "smollm2-135m-instruct"})
    assert "last-token pooling" in encoder


def test_an_interrupted_encode_keeps_what_it_finished_in_the_cache(tiny_encoder_factory, tmp_path, monkeypatch):
    """The cache was written once per encode call, after all of it: a `train` killed while it embedded (round 1
    embeds every context, then every reply, in one call each: most of `make scorer`'s 42 minutes) kept none of that
    call's embeddings, and the rerun started it over. Finished embeddings go to the cache every ``FLUSH_TEXTS``
    texts, with the batches, and so the embeddings, of one pass."""
    monkeypatch.setattr(encoder_module, "FLUSH_TEXTS", 8, raising=False)
    texts = [f"text {i} " + "word " * (i % 7) for i in range(40)]
    plain = tiny_encoder_factory(batch_size=4)
    expected = plain.encode(texts)

    batches: list[list[list[int]]] = []
    cache = EmbeddingCache(tmp_path)
    encoder = tiny_encoder_factory(batch_size=4, cache=cache)
    forward = encoder._forward

    def killed(batch, *args, **kwargs):
        if len(batches) == 5:  # 20 texts embedded, then the run is killed
            raise RuntimeError("killed")
        batches.append(batch["input_ids"].tolist())
        return forward(batch, *args, **kwargs)

    monkeypatch.setattr(encoder, "_forward", killed)
    with pytest.raises(RuntimeError, match="killed"):
        encoder.encode(texts)
    keys = [cache_key(encoder._fingerprint, "text", "{text}", "start", t) for t in texts]
    found = cache.get(keys)
    assert len(found) == 16  # the texts of the flushes at 8 and 16; the 4 after the last flush are lost
    for i, key in enumerate(keys):
        if key in found:
            np.testing.assert_array_equal(found[key], expected[i])  # bit-identical to an uninterrupted pass

    rerun = tiny_encoder_factory(batch_size=4, cache=cache)
    np.testing.assert_allclose(rerun.encode(texts), expected, atol=1e-6)
    assert rerun.stats.cache_hits == 16 and rerun.stats.texts == 24 and len(cache) == 40

    # an uninterrupted call: the same batches as without a cache, and the same embeddings to the bit
    seen = {}
    for name, enc in (
        ("cached", tiny_encoder_factory(batch_size=4, cache=EmbeddingCache(tmp_path / "b"))),
        ("plain", plain),
    ):
        seen[name] = _recording(enc, monkeypatch)
        np.testing.assert_array_equal(enc.encode(texts), expected)
    assert seen["cached"] == seen["plain"] and len(seen["plain"]) == 10


def _recording(encoder: TextEncoder, monkeypatch) -> list[list[list[int]]]:
    """The token ids of every batch ``encoder`` embeds from now on, as a list that fills as it goes."""
    batches: list[list[list[int]]] = []
    forward = encoder._forward

    def recorded(batch, *args, **kwargs):
        batches.append(batch["input_ids"].tolist())
        return forward(batch, *args, **kwargs)

    monkeypatch.setattr(encoder, "_forward", recorded)
    return batches

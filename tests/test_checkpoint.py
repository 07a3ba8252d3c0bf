"""Training checkpoints: a run killed after round k resumes to exactly the uninterrupted result; writes are atomic;
nothing is unpickled."""

import copy
import dataclasses
import json
import os
import pickle
import re
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import TOPICS
from safetensors import safe_open
from test_training import _Diverging, _topic_features

import pmi_reward.training.checkpoint as checkpoint
from pmi_reward.data.dialogues import Dialogue
from pmi_reward.data.negatives import NegativeSpec
from pmi_reward.data.pairs import PairSet
from pmi_reward.scoring.head import HeadConfig, PMIHead
from pmi_reward.scoring.scorer import PMIScorer
from pmi_reward.scoring.templates import TEMPLATES
from pmi_reward.training.fit import fit_scorer
from pmi_reward.training.loop import TrainConfig, train_head

TESTS = Path(__file__).resolve().parent
CONFIG = dict(batch_size=16, epochs=5, patience=10, seed=7, lr=3e-3)
NEGATIVES = NegativeSpec(k_random=2, k_in_dialogue=1, k_context=1)
HEAD = HeadConfig(dim=8, hidden=(32, 16))


@pytest.fixture(autouse=True)
def one_thread():
    """One intra-op thread (as in the killed subprocess): the same arithmetic everywhere, and no spin-waiting for
    a second core that a busy machine does not have."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _problem():
    rng = np.random.default_rng(0)
    dialogues = [Dialogue(f"d{n}", tuple(rng.permutation(TOPICS[list(TOPICS)[n % 4]]))) for n in range(80)]
    train, val = PairSet.from_dialogues(dialogues[:60]), PairSet.from_dialogues(dialogues[60:])
    return train, val, _topic_features(train, 0), _topic_features(val, 1)


def _train(checkpoint_dir=None, kill_at_round=None, rounds=None, **overrides):
    """train_head on the topic problem; ``kill_at_round``: SIGKILL this process as that round starts; ``rounds``: a
    list that gets one item per round trained (not resumed from the checkpoint)."""
    train, val, ft, fv = _problem()
    rounds, prepare = [] if rounds is None else rounds, ft.prepare

    def counting_prepare(ctx, resp):
        rounds.append(len(rounds) + 1)
        if len(rounds) == kill_at_round:
            os.kill(os.getpid(), signal.SIGKILL)
        return prepare(ctx, resp)

    ft.prepare = counting_prepare
    config = TrainConfig(**{**CONFIG, **overrides}, checkpoint_dir=checkpoint_dir)
    return train_head(HEAD, ft, train, fv, val, config, progress=False, negatives=NEGATIVES)


def _same(a, b) -> None:
    assert (
        a.untimed_history() == b.untimed_history() and a.best_epoch == b.best_epoch and a.best_val_auc == b.best_val_auc
    )
    for x, y in zip(a.head.state_dict().values(), b.head.state_dict().values(), strict=True):
        assert torch.equal(x, y)


def _round_in(directory: Path) -> int:
    from safetensors import safe_open

    with safe_open(str(directory / checkpoint.CHECKPOINT_NAME), "pt") as f:
        return json.loads(f.metadata()["state"])["epoch"]


def test_a_killed_run_resumes_to_the_uninterrupted_result(tmp_path):
    uninterrupted = _train()
    code = f"import torch, test_checkpoint as t; torch.set_num_threads(1); t._train({str(tmp_path)!r}, kill_at_round=3)"
    killed = subprocess.run(
        [sys.executable, "-c", code],
        cwd=TESTS,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS.parent), str(TESTS)])},
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert _round_in(tmp_path) == 2  # rounds 1-2 were saved before the kill
    _same(_train(str(tmp_path)), uninterrupted)
    assert _round_in(tmp_path) == 5
    _same(_train(str(tmp_path)), uninterrupted)  # a finished run resumes to its end at once


def test_a_crash_while_writing_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    uninterrupted = _train()
    real, calls = checkpoint.save_file, [0]

    def crash_on_third(tensors, path, metadata=None):
        calls[0] += 1
        if calls[0] == 3:
            Path(path).write_bytes(b"half a file")
            raise KeyboardInterrupt("killed mid-write")
        real(tensors, path, metadata=metadata)

    monkeypatch.setattr(checkpoint, "save_file", crash_on_third)
    with pytest.raises(KeyboardInterrupt):
        _train(str(tmp_path))
    assert _round_in(tmp_path) == 2 and [p.name for p in tmp_path.iterdir()] == [checkpoint.CHECKPOINT_NAME]
    monkeypatch.setattr(checkpoint, "save_file", real)
    _same(_train(str(tmp_path)), uninterrupted)


def test_a_checkpoint_of_another_run_or_a_corrupted_one_is_refused(tmp_path):
    _train(str(tmp_path), epochs=2)
    with pytest.raises(ValueError, match="other data or settings"):
        _train(str(tmp_path), seed=8)
    rounds: list[int] = []
    _same(_train(str(tmp_path), epochs=3, rounds=rounds), _train(epochs=3))  # only stopping later: resumes
    assert rounds == [1]  # round 3 alone was trained
    (tmp_path / checkpoint.CHECKPOINT_NAME).write_bytes(b"\x00" * 64)
    with pytest.raises(ValueError, match="corrupted training checkpoint"):
        _train(str(tmp_path))


def test_a_refusal_names_what_differs(tmp_path):
    """Issue 11: another run's checkpoint was resumed when only texts or settings differed. Each difference is
    refused, and the message names it."""
    _train(str(tmp_path), epochs=1)
    for overrides, named in (
        ({"seed": 8}, "training.seed (checkpoint: 7, this run: 8)"),
        ({"select_by": "loss"}, "training.select_by (checkpoint: 'auc', this run: 'loss')"),
        ({"in_batch_negatives": True}, "training.in_batch_negatives"),
    ):
        with pytest.raises(ValueError, match=re.escape(named)):
            _train(str(tmp_path), epochs=1, **overrides)
    train, val, ft, fv = _problem()
    other_texts = dataclasses.replace(train, responses=[r + "!" for r in train.responses])  # the same indices
    for args, named in (
        ((HEAD, ft, other_texts, fv, val), "train.pairs (other texts or values)"),
        ((dataclasses.replace(HEAD, hidden=(32,)), ft, train, fv, val), "head.hidden"),
    ):
        with pytest.raises(ValueError, match=re.escape(named)):
            train_head(*args, TrainConfig(**CONFIG, checkpoint_dir=str(tmp_path)), progress=False, negatives=NEGATIVES)
    with pytest.raises(ValueError, match=re.escape("negatives.k_random (checkpoint: 2, this run: 3)")):
        negatives = dataclasses.replace(NEGATIVES, k_random=3)
        train_head(
            HEAD, ft, train, fv, val, TrainConfig(**CONFIG, checkpoint_dir=str(tmp_path)), False, negatives=negatives
        )


def test_the_fingerprint_covers_the_encoder_template_and_line_features(tiny_encoder):
    """What makes the embeddings is part of the fingerprint: ``--context_template "Context: {context}"
    --no_normalize`` resumed another run's checkpoint before."""
    from pmi_reward.scoring.features import PairFeatures
    from pmi_reward.training.loop import _fingerprint

    train, val, _, _ = _problem()
    template = TEMPLATES["en"]

    def fingerprint(encoder=tiny_encoder, template=template, line_turns=0, **config):
        features = [PairFeatures(encoder, template, pairs, "pair", False, line_turns) for pairs in (train, val)]
        splits = [(pairs, f, None) for pairs, f in zip((train, val), features, strict=True)]
        return _fingerprint(HEAD, TrainConfig(**{**CONFIG, **config}), NEGATIVES, *splits)

    base = fingerprint()
    other_encoder = copy.copy(tiny_encoder)
    other_encoder.spec = dataclasses.replace(tiny_encoder.spec, normalize=not tiny_encoder.spec.normalize)
    for changed, key in (
        (
            fingerprint(template=dataclasses.replace(template, context_template="Context: {context}")),
            "template.context_template",
        ),
        (fingerprint(encoder=other_encoder), "encoder.normalize"),
        (fingerprint(line_turns=2), "features.line_turns"),
        (fingerprint(train_encoder="lora"), "training.train_encoder"),
    ):
        assert [k for k in base if base[k] != changed.get(k)] == [k for k in base if k.endswith(key)] != [], key
    assert fingerprint() == base  # deterministic


def test_scorers_and_checkpoints_load_without_pickle(tmp_path, monkeypatch, tiny_encoder):
    _train(str(tmp_path / "ckpt"), epochs=1)
    torch.manual_seed(0)
    PMIScorer(tiny_encoder, TEMPLATES["en"], PMIHead(HeadConfig(dim=tiny_encoder.dim))).save_pretrained(tmp_path / "s")

    def forbidden(*args, **kwargs):
        raise AssertionError("unpickling is not allowed")

    for module, name in ((pickle, "load"), (pickle, "loads"), (torch, "load")):
        monkeypatch.setattr(module, name, forbidden)
    PMIScorer.from_pretrained(tmp_path / "s", encoder=tiny_encoder)
    _train(str(tmp_path / "ckpt"), epochs=2)


def test_train_cli_takes_a_checkpoint_dir(capsys):
    from pmi_reward.cli.train import main

    with pytest.raises(SystemExit):
        main(["--help"])
    assert "--checkpoint_dir" in capsys.readouterr().out


def _drop_from_fingerprint(directory: Path, prefix: str) -> None:
    """Rewrite the checkpoint as a pmi-reward that had no option named ``prefix...`` would have written it."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    path = directory / checkpoint.CHECKPOINT_NAME
    with safe_open(str(path), "pt") as f:
        meta = json.loads(f.metadata()["state"])
    meta["fingerprint"] = {k: v for k, v in meta["fingerprint"].items() if not k.startswith(prefix)}
    save_file(load_file(path), str(path), metadata={"state": json.dumps(meta)})


def test_a_checkpoint_older_than_an_option_resumes_while_the_option_stays_at_its_default(tmp_path):
    """Adding an option (e.g. graded_in_dialogue) must not strand the checkpoints written before it: they resume
    runs that leave the option at its default, to the uninterrupted result, and refuse runs that set it."""
    uninterrupted = _train()
    _train(str(tmp_path), epochs=2)
    _drop_from_fingerprint(tmp_path, "training.graded_")
    _same(_train(str(tmp_path)), uninterrupted)
    _train(str(tmp_path / "other"), epochs=2)
    _drop_from_fingerprint(tmp_path / "other", "training.graded_")
    with pytest.raises(
        ValueError, match=re.escape("training.graded_in_dialogue (checkpoint: '<absent>', this run: 1)")
    ):
        _train(str(tmp_path / "other"), graded_in_dialogue=1)


def test_a_gpus_random_state_is_saved_and_restored(tmp_path, monkeypatch):
    """An encoder fine-tuned on a GPU draws its dropout from the GPU's generator: a checkpoint keeps that state
    too, and restores it where the same GPUs are there. torch.cuda's state calls are stood in for, seeding too: two
    stand-in GPUs on a machine with none or one (seeding the second failed on a one-GPU machine)."""
    states = [torch.arange(16, dtype=torch.uint8), torch.arange(16, 32, dtype=torch.uint8)]
    restored = []
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: [s.clone() for s in states])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_rng_state_all", restored.extend)
    monkeypatch.setattr(torch.cuda, "manual_seed_all", lambda seed: None)
    _train(str(tmp_path), epochs=2)
    _train(str(tmp_path), epochs=3)  # resumes after round 2
    assert len(restored) == 2 and all(torch.equal(a, b) for a, b in zip(restored, states, strict=True))
    restored.clear()
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)  # other GPUs: the CPU's state only
    _train(str(tmp_path), epochs=4)
    assert restored == []


def test_a_run_that_stops_sooner_does_not_resume_a_longer_one(tmp_path):
    """A checkpoint of 5 rounds resumed with epochs=3 returned rounds 4-5 (a best round the run never trains, under
    metadata saying 3); likewise a patience that would have stopped it earlier. Refused; a run that stops later
    resumes."""
    _train(str(tmp_path), epochs=5, patience=10)
    with pytest.raises(ValueError, match="ran 5 rounds; with epochs=3"):
        _train(str(tmp_path), epochs=3, patience=10)
    rounds: list[int] = []
    _same(_train(str(tmp_path), epochs=6, patience=10, rounds=rounds), _train(epochs=6, patience=10))
    assert rounds == [1]  # round 6 alone was trained


def test_a_run_that_diverged_resumes_to_its_result(tmp_path):
    """A round that diverges after good ones is checkpointed (val_auc null) and ends the run with the best round; a
    resume returns that result at once (it repeated the diverging round, bit for bit, and raised again)."""
    train, val, ft, fv = _problem()
    config = TrainConfig(**CONFIG, checkpoint_dir=str(tmp_path))

    def run():
        features = _Diverging(ft, 3)
        with pytest.warns(UserWarning, match="round 3: .*training diverged"):
            result = train_head(HEAD, features, train, fv, val, config, progress=False, negatives=NEGATIVES)
        return result, features.rounds

    first, trained = run()
    assert trained == 3 and first.history[-1]["val_auc"] is None and first.best_epoch in (1, 2)
    with safe_open(str(tmp_path / checkpoint.CHECKPOINT_NAME), "pt") as f:
        saved = json.loads(f.metadata()["state"])
    assert saved["epoch"] == 3 and saved["history"][-1]["val_auc"] is None and saved["best_epoch"] == first.best_epoch
    rounds: list[int] = []
    resumed = _train(str(tmp_path), rounds=rounds)  # the same run, its features not yet diverging: nothing trains
    assert rounds == []
    _same(resumed, first)


@pytest.mark.parametrize("mode", ["full", "lora"])
def test_a_resumed_encoder_fine_tune_equals_the_uninterrupted_one(tmp_path, tiny_encoder_factory, mode):
    """An encoder fine-tune (warm-up, dropout on, random negatives from the batch) stopped after round 1 and resumed
    to round 3 gives the uninterrupted run's rounds, head and encoder weights."""
    train, val, _, _ = _problem()

    def run(epochs, directory=None):
        config = TrainConfig(
            batch_size=16,
            encoder_batch_size=8,
            epochs=epochs,
            patience=5,
            warmup_rounds=1,
            steps_per_round=2,
            train_encoder=mode,
            encoder_lr=1e-3,
            bf16=False,
            checkpoint_dir=directory,
            seed=3,
        )
        encoder = tiny_encoder_factory()
        return fit_scorer(
            train, val, encoder, TEMPLATES["en"], config, HeadConfig(hidden=[16]), NegativeSpec(2, 0, 1), False
        )

    full, uninterrupted = run(3)
    run(1, str(tmp_path))
    resumed, result = run(3, str(tmp_path))
    _same(result, uninterrupted)
    assert [h["epoch"] for h in result.history] == [0, 1, 2, 3]
    tuned, pretrained = (e.model.state_dict() for e in (full.encoder, tiny_encoder_factory()))
    assert not all(torch.equal(tuned[k], pretrained[k]) for k in pretrained)  # the encoder did train
    for a, b in zip(tuned.values(), resumed.encoder.model.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    assert resumed.encoder.spec.revision == full.encoder.spec.revision  # the weights' digest


def test_a_fine_tune_resumes_without_its_warm_up_under_another_patience(tmp_path, tiny_encoder_factory, monkeypatch):
    """Resuming a fine-tune with another patience (allowed) reran the warm-up, whose head then differed (it had stopped
    early under the old patience), and the checkpoint was refused as "other data or settings". The warm-up is part of
    the checkpointed run: a resume skips it, and continues the rounds; other settings are still refused."""
    from pmi_reward.training import fit

    warm_ups, train_head_ = [], fit.train_head

    def spy(*args, **kwargs):
        result = train_head_(*args, **kwargs)
        warm_ups.extend([len(result.history)] if args[5].train_encoder == "none" else [])  # the warm-up's rounds
        return result

    monkeypatch.setattr(fit, "train_head", spy)
    rng = np.random.default_rng(0)
    dialogues = [Dialogue(f"d{n}", tuple(rng.permutation(TOPICS[list(TOPICS)[n % 4]]))) for n in range(80)]
    train, val = PairSet.from_dialogues(dialogues[:20]), PairSet.from_dialogues(dialogues[60:68])
    settings = dict(
        batch_size=8, lr=0.01, encoder_lr=1e-3, seed=0, bf16=False, checkpoint_dir=str(tmp_path), train_encoder="full",
        encoder_batch_size=16, steps_per_round=1, warmup_rounds=8,
    )  # fmt: skip

    def run(epochs, patience, start_head=None, **over):
        config = TrainConfig(**{**settings, "epochs": epochs, "patience": patience, **over})
        encoder, negatives = tiny_encoder_factory(), NegativeSpec(2, 0, 0)
        return fit_scorer(
            train, val, encoder, TEMPLATES["en"], config, HeadConfig(), negatives, False, start_head=start_head
        )

    _, first = run(2, 1)
    assert len(warm_ups) == 1 and warm_ups[0] < 8  # patience 1 stopped the warm-up early: 10 would not have
    assert [h["epoch"] for h in first.history] == [0, 1]
    _, resumed = run(4, 10)
    assert len(warm_ups) == 1  # not run again
    assert resumed.untimed_history()[:2] == first.untimed_history()
    assert [h["epoch"] for h in resumed.history] == [0, 1, 2, 3, 4]
    with pytest.raises(ValueError, match=r"other data or settings \(training.encoder_lr"):
        run(4, 10, encoder_lr=1e-4)
    with pytest.raises(ValueError, match="start_head"):  # a run from another head is another run
        run(4, 10, start_head=first.head)


def test_a_checkpoint_of_other_trained_parameters_is_refused_by_name(tmp_path):
    """A checkpoint whose trained parameters are not this run's (LoRA adapters on other modules: a pooler adapted
    before 2026-11-28) passed the fingerprint and then failed in load_state_dict with a raw RuntimeError."""
    from pmi_reward.training.checkpoint import load_round, save_round

    saved = torch.nn.ModuleDict({"head": torch.nn.Linear(2, 1), "pooler": torch.nn.Linear(2, 2)})
    optim = torch.optim.AdamW(saved.parameters())
    rng = np.random.default_rng(0)
    save_round(tmp_path, {"a": 1}, 1, saved, optim, (0.5, 1, saved.state_dict()), [], rng)
    mine = torch.nn.ModuleDict({"head": torch.nn.Linear(2, 1)})
    with pytest.raises(ValueError, match="written by a run that trained other parameters"):
        load_round(tmp_path, {"a": 1}, mine, torch.optim.AdamW(mine.parameters()), rng)

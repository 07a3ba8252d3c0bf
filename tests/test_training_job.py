"""The training core's run-level behaviour: which pairs the named files give each split (``build_pairs``), the
round bar's clock and the test split's progress, ``fit_scorer``'s start head, and a resumed run's figures.

All on the tiny config-built encoder (``pmi-reward train``'s encoder swapped for it) and small topic data."""

from __future__ import annotations

import copy
import csv
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import TOPICS

import pmi_reward.training.job as job
import pmi_reward.training.loop as loop
from pmi_reward.data.negatives import NegativeSpec
from pmi_reward.data.pairs import PairSet, load_pairs
from pmi_reward.data.records import DataError
from pmi_reward.scoring.features import PairFeatures
from pmi_reward.scoring.head import HeadConfig
from pmi_reward.scoring.scorer import PMIScorer
from pmi_reward.scoring.templates import TEMPLATES
from pmi_reward.training.fit import evaluate_auc, fit_scorer
from pmi_reward.training.job import TrainData, build_pairs, train_scorer
from pmi_reward.training.loop import TrainConfig, train_head

SMALL = HeadConfig(hidden=[16])


def _dialogue_file(path: Path, dialogues) -> Path:
    path.write_text("".join(json.dumps({"id": d.id, "turns": list(d.turns)}) + "\n" for d in dialogues))
    return path


def _pair_file(path: Path, n_dialogues: int, seed: int) -> Path:
    """Topic pairs (one dialogue per topic in turn), keyed by dialogue, as a CSV pair file."""
    rng = np.random.default_rng(seed)
    rows = []
    for d in range(n_dialogues):
        turns = list(rng.permutation(TOPICS[list(TOPICS)[d % len(TOPICS)]]))
        rows += [
            {"dialog_key": f"{seed}-{d}", "context": "\n".join(turns[:t]), "response": turns[t]}
            for t in range(1, len(turns))
        ]
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, ["dialog_key", "context", "response"])
        writer.writeheader()
        writer.writerows(rows)
    return path


def _texts(pairs: PairSet) -> list[tuple[str, str]]:
    return sorted(zip(pairs.context_texts, pairs.response_texts, strict=True))


@pytest.fixture
def tiny_train(monkeypatch, tiny_encoder):
    """``train_scorer`` on the tiny encoder instead of the one its spec names."""
    monkeypatch.setattr(job, "TextEncoder", lambda *args, **kwargs: tiny_encoder)
    return tiny_encoder


# 1. --val_file / --test_file without --train_file


def test_val_and_test_files_without_a_train_file_are_those_splits(tmp_path, topic_dialogues):
    """``--dialogues X --test_file Y`` (``--val_file Z``) ignored Y and Z: only a train file made the pair files be
    read, so the test AUC and the model selection were the dialogues' own, and a missing file went unnoticed."""
    dialogues = _dialogue_file(tmp_path / "d.jsonl", topic_dialogues[:40])
    val, test = _pair_file(tmp_path / "val.csv", 6, 1), _pair_file(tmp_path / "test.csv", 5, 2)
    alone = build_pairs(TrainData(dialogues=str(dialogues)))
    train_pairs, val_pairs, test_pairs, source = build_pairs(
        TrainData(dialogues=str(dialogues), val_file=str(val), test_file=str(test))
    )
    assert _texts(train_pairs) == _texts(alone[0])  # the training pairs are the dialogues' alone
    assert _texts(val_pairs) == _texts(load_pairs(val)) and _texts(test_pairs) == _texts(load_pairs(test))
    assert (source["val_file"], source["test_file"], source["train_file"]) == (str(val), str(test), None)
    assert source["dialogues"] == str(dialogues)
    # with a train file too: its pairs join the dialogues' training pairs; the named test file is the test split
    more = _pair_file(tmp_path / "train.csv", 3, 3)
    both = build_pairs(TrainData(dialogues=str(dialogues), train_file=str(more), test_file=str(test)))
    assert len(both[0]) == len(alone[0]) + len(load_pairs(more)) and _texts(both[1]) == _texts(alone[1])
    assert _texts(both[2]) == _texts(load_pairs(test))
    # a validation file lets the dialogues go without a validation split
    no_val = build_pairs(TrainData(dialogues=str(dialogues), val_fraction=0.0, val_file=str(val)))
    assert _texts(no_val[1]) == _texts(load_pairs(val)) and len(no_val[0]) > len(alone[0])
    assert job._origin(TrainData(dialogues="chitchat", test_file="t.csv"), 2) == "the test pairs of t.csv"
    assert job._origin(TrainData(dialogues="chitchat", test_file="t.csv"), 0) == (
        "the training pairs of chitchat (its training dialogues)"
    )


def test_a_missing_val_or_test_file_is_an_error_naming_it(tmp_path, topic_dialogues):
    dialogues = _dialogue_file(tmp_path / "d.jsonl", topic_dialogues[:40])
    for option in ("val_file", "test_file"):
        missing = tmp_path / f"no-{option}.csv"
        with pytest.raises(DataError, match=f"{missing}: no such file"):
            build_pairs(TrainData(dialogues=str(dialogues), **{option: str(missing)}))
    val = _pair_file(tmp_path / "val.csv", 4, 1)
    with pytest.raises(SystemExit, match=r"and/or --train_file \(--val_file only gives held-out pairs\)"):
        build_pairs(TrainData(val_file=str(val)))


def test_train_reports_the_named_test_files_auc(tmp_path, topic_dialogues, tiny_train):
    """End to end: the summary's and the metadata's test AUC are the named file's, and the file is recorded."""
    dialogues = _dialogue_file(tmp_path / "d.jsonl", topic_dialogues[:40])
    test = _pair_file(tmp_path / "test.csv", 5, 2)
    data = TrainData(
        output_dir=str(tmp_path / "scorer"),
        dialogues=str(dialogues),
        test_file=str(test),
        no_cache=True,
        progress=False,
    )
    negatives = NegativeSpec(k_random=2, k_context=0)
    summary = train_scorer(data, tiny_train.spec, TEMPLATES["en"], SMALL, negatives, TrainConfig(epochs=1))
    scorer = PMIScorer.from_pretrained(tmp_path / "scorer", encoder=tiny_train)
    assert scorer.metadata["data"]["test_file"] == str(test) and scorer.metadata["test_auc"] == summary["test_auc"]
    expected = evaluate_auc(scorer, load_pairs(test), negatives, seed=2)
    assert summary["test_auc"] == pytest.approx(expected, abs=1e-6)


# 3. the round bar's clock, and the test split's progress


def test_the_round_bar_starts_after_the_first_rounds_embedding(monkeypatch, tiny_encoder, topic_dialogues):
    """Round 1 embeds every training and validation text (most of a frozen encoder's run) inside the round bar, so
    its ETA counted that embedding as a round: ~26 h shown where ~20 min were left. The bar now starts after it."""
    train, val = PairSet.from_dialogues(topic_dialogues[:30]), PairSet.from_dialogues(topic_dialogues[30:40])
    encoder = tiny_encoder  # a new one per test: its counts are this run's
    at_start = []
    real = loop.progress_bar

    def spy(iterable=None, desc=None, *args, **kwargs):
        if str(desc).startswith("train "):
            at_start.append(encoder.stats.texts)
        return real(iterable, desc, *args, **kwargs)

    monkeypatch.setattr(loop, "progress_bar", spy)
    config = HeadConfig(dim=encoder.dim, hidden=[16])
    ft, fv = (PairFeatures(encoder, TEMPLATES["en"], p, "pair", progress=False) for p in (train, val))
    result = train_head(config, ft, train, fv, val, TrainConfig(epochs=3, batch_size=16), progress=False)
    assert len(result.history) == 3 and encoder.stats.texts > 0
    assert at_start == [encoder.stats.texts]  # everything the run embeds, embedded before the bar's clock starts


def test_the_test_split_is_scored_with_the_runs_progress(tmp_path, monkeypatch, topic_dialogues, tiny_train):
    """The test split's embedding (thousands of texts with mpnet) ran after the round bar with no progress at all."""
    seen = []

    def spy(*args, **kwargs):
        seen.append(kwargs.get("progress"))
        return evaluate_auc(*args, **kwargs)

    monkeypatch.setattr(job, "evaluate_auc", spy)
    dialogues = _dialogue_file(tmp_path / "d.jsonl", topic_dialogues[:40])
    for progress in (True, False):
        data = TrainData(
            output_dir=str(tmp_path / f"scorer-{progress}"), dialogues=str(dialogues), no_cache=True, progress=progress
        )
        train_scorer(data, tiny_train.spec, TEMPLATES["en"], SMALL, NegativeSpec(2, 0, 1), TrainConfig(epochs=1))
    assert seen == [True, False]


# 4. fit_scorer's start head


def test_fit_scorer_trains_a_copy_of_its_start_head(tiny_encoder, topic_dialogues):
    """``fit_scorer(start_head=old.head)`` trained the caller's head in place: the old scorer became the new one."""
    train, val = PairSet.from_dialogues(topic_dialogues[:30]), PairSet.from_dialogues(topic_dialogues[30:40])
    negatives = NegativeSpec(k_random=2, k_context=0)
    old, _ = fit_scorer(
        train, val, tiny_encoder, TEMPLATES["en"], TrainConfig(epochs=1, lr=1e-4), SMALL, negatives, progress=False
    )
    before = copy.deepcopy(old.head.state_dict())
    old_scores = old.score(["I love pizza."], ["I baked bread today."])
    config = TrainConfig(epochs=3, lr=0.1, seed=1)
    new, result = fit_scorer(
        train, val, tiny_encoder, TEMPLATES["en"], config, SMALL, negatives, progress=False, start_head=old.head
    )
    assert result.best_epoch > 0 and new.head is not old.head  # training moved on from the start
    assert all(torch.equal(before[k], v) for k, v in old.head.state_dict().items())
    assert np.array_equal(old.score(["I love pizza."], ["I baked bread today."]), old_scores)
    twin, _ = fit_scorer(  # the same run on a copy the caller made: the same result
        train,
        val,
        tiny_encoder,
        TEMPLATES["en"],
        config,
        SMALL,
        negatives,
        progress=False,
        start_head=copy.deepcopy(old.head),
    )
    assert all(torch.equal(twin.head.state_dict()[k], v) for k, v in new.head.state_dict().items())


# 5. a resumed run's figures


class _Clock:
    """A stand-in for the ``time`` module in the loop: each reading ``step`` seconds after the last."""

    def __init__(self, step: float) -> None:
        self.now, self.step = 0.0, step

    def perf_counter(self) -> float:
        self.now += self.step
        return self.now


def test_a_resumed_run_counts_the_checkpoints_seconds_and_says_it_resumed(
    tmp_path, monkeypatch, topic_dialogues, tiny_train
):
    """A resumed ``train`` wrote this process's seconds as the run's (the history's clock jumped back at the
    resumed round) and nothing said it had resumed. The first process here is slow (1000 s a clock reading), the
    second fast, so the first's time shows in the second's figures only if it is carried."""
    dialogues = _dialogue_file(tmp_path / "d.jsonl", topic_dialogues[:40])
    checkpoints = tmp_path / "ckpt"

    def run(epochs: int, out: str, clock: _Clock) -> tuple[dict, list[dict], dict]:
        monkeypatch.setattr(loop, "time", clock)
        data = TrainData(output_dir=str(tmp_path / out), dialogues=str(dialogues), no_cache=True, progress=False)
        config = TrainConfig(epochs=epochs, patience=10, checkpoint_dir=str(checkpoints))
        summary = train_scorer(data, tiny_train.spec, TEMPLATES["en"], SMALL, NegativeSpec(2, 0, 1), config)
        history = json.loads((tmp_path / out / "train_history.json").read_text())
        return summary, history, json.loads((tmp_path / out / "metadata.json").read_text())

    first, first_history, first_meta = run(2, "a", _Clock(1000.0))
    second, history, meta = run(4, "b", _Clock(0.001))
    assert history[:2] == first_history and second["epochs_run"] == 4  # the checkpoint's rounds, as they were
    carried = first_history[-1]["seconds"]
    seconds = [h["seconds"] for h in history]
    assert seconds == sorted(seconds) and seconds[2] > carried  # the clock goes on from the checkpoint's
    assert second["seconds"] == meta["seconds"] and carried < second["seconds"] < carried + 1
    assert first["resumed_from_round"] is None and first_meta["resumed_from_round"] is None
    assert second["resumed_from_round"] == 2 and meta["resumed_from_round"] == 2

"""A process forked while another thread is inside a scorer call (a fork ``Pool`` or ``datasets.map(num_proc=...)``
started while verl's reward loop scores from its threads) inherited the encoder's tokenizer lock or the embedding
cache's lock held by a thread it does not have, and its first call waited for ever. A fork now waits for the
tokenization or cache access in flight; the child gets new locks and its own SQLite connection."""

from __future__ import annotations

import multiprocessing
import threading
import time

import numpy as np
import pytest
import torch

import pmi_reward.rewards.verl as verl_adapter
from pmi_reward.rewards.reward import PMIReward
from pmi_reward.scoring import forking
from pmi_reward.scoring.cache import EmbeddingCache, cache_key

CONTEXT = "I love jazz.\nWho do you listen to?"
FORK = multiprocessing.get_context("fork")


def _in_child(target, timeout: float = 60.0):
    """Run ``target`` in a forked child; its return value, or a failure saying the child hung or failed."""
    answers = FORK.Queue()
    process = FORK.Process(target=lambda: answers.put(target()))
    process.start()
    process.join(timeout)
    hung = process.is_alive()
    if hung:
        process.kill()
        process.join()
    assert not hung, "the forked child never finished"
    assert process.exitcode == 0
    return answers.get(timeout=10)


def _slow_tokenizer(monkeypatch, encoder, inside: threading.Event, release: threading.Event) -> None:
    """The encoder's tokenizer, called under its ``_tokenizer_lock``, signals ``inside`` and then waits for
    ``release``."""
    cls = type(encoder.tokenizer)
    real = cls.__call__

    def slow(self, *args, **kwargs):
        if not release.is_set():
            inside.set()
            release.wait(10)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(cls, "__call__", slow)


def _fork_while(busy, inside: threading.Event, release: threading.Event, target):
    """Fork (running ``target`` in the child) while a thread of this process, computing on two torch threads, runs
    ``busy`` and is held inside."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # intra-op threads at work in the parent's forward as it forks (OMP_NUM_THREADS=1 hid it)
    thread = threading.Thread(target=busy, daemon=True)
    thread.start()
    assert inside.wait(10)
    threading.Timer(0.5, release.set).start()  # the fork waits for the call in flight to give its lock back
    try:
        return _in_child(target)
    finally:
        release.set()
        thread.join(10)
        torch.set_num_threads(threads)


def test_a_fork_during_a_tokenization_does_not_leave_the_child_waiting(tiny_encoder, monkeypatch):
    inside, release = threading.Event(), threading.Event()
    expected = tiny_encoder.encode([CONTEXT])
    _slow_tokenizer(monkeypatch, tiny_encoder, inside, release)
    got = _fork_while(
        lambda: tiny_encoder.encode(["a text embedded while the process forks"]),
        inside,
        release,
        lambda: (tiny_encoder.encode([CONTEXT]), torch.get_num_threads()),
    )
    np.testing.assert_allclose(got[0], expected, atol=1e-6)
    assert got[1] == 1  # GNU OpenMP's threads do not survive a fork: the child computes on one


def test_a_fork_during_a_cache_write_gives_the_child_its_own_connection(tmp_path, monkeypatch):
    cache = EmbeddingCache(tmp_path)
    inside, release = threading.Event(), threading.Event()
    real_db = cache._db

    class SlowDb:  # the write waits inside ``with self._lock`` (sqlite3.Connection's methods cannot be patched)
        def __getattr__(self, name):
            return getattr(real_db, name)

        def __enter__(self):
            return real_db.__enter__()

        def __exit__(self, *exc):
            return real_db.__exit__(*exc)

        def executemany(self, *args):
            if not release.is_set():
                inside.set()
                release.wait(10)
            return real_db.executemany(*args)

    monkeypatch.setattr(cache, "_db", SlowDb())
    parent_db = id(cache._db)
    key, other = cache_key("a"), cache_key("b")

    def child() -> tuple[int, int]:
        cache.put([other], np.ones((1, 3), dtype=np.float32))
        return id(cache._db), len(cache.get([key, other]))

    child_db, found = _fork_while(lambda: cache.put([key], np.zeros((1, 3))), inside, release, child)
    assert child_db != parent_db  # SQLite forbids using a connection across a fork
    assert found == 2  # the parent's write finished before the fork; the child's own went through
    monkeypatch.setattr(cache, "_db", real_db)
    assert set(cache.get([key, other])) == {key, other}  # the child's write reached the file the parent reads


def test_verl_child_forked_while_the_parent_scores_with_a_cache(tiny_scorer_dir, tmp_path, monkeypatch):
    """The review's case: verl's in-process reward, an embedding cache, a fork while the batcher's worker is inside a
    tokenization (it hung every time)."""
    kwargs = {"scorer": str(tiny_scorer_dir), "device": "cpu", "cache_dir": str(tmp_path / "emb")}
    verl_adapter._load_reward.cache_clear()
    try:
        plain = PMIReward.from_pretrained(tiny_scorer_dir, device="cpu")
        expected = plain([CONTEXT], ["Coltrane, of course."])[0]
        verl_adapter.compute_score("d", "Miles Davis mostly.", None, {"context": CONTEXT}, **kwargs)
        encoder = verl_adapter._reward(*verl_adapter._settings(kwargs)).scorer.encoder
        inside, release = threading.Event(), threading.Event()
        _slow_tokenizer(monkeypatch, encoder, inside, release)
        got = _fork_while(
            lambda: verl_adapter.compute_score("d", "a reply in flight", None, {"context": CONTEXT}, **kwargs),
            inside,
            release,
            # a reply the parent never embedded: the child tokenizes, and writes the embedding cache
            lambda: verl_adapter.compute_score("d", "Coltrane, of course.", None, {"context": CONTEXT}, **kwargs),
        )
    finally:
        verl_adapter._load_reward.cache_clear()
    assert got["score"] == pytest.approx(expected, abs=1e-5)


def test_a_lock_not_held_across_a_fork_is_only_renewed_and_a_gone_owner_is_forgotten():
    class Owner:
        def __init__(self) -> None:
            self.lock = threading.Lock()

    kept, gone = Owner(), Owner()
    forking.hold_across_fork(kept, "lock", threading.Lock, hold=False)
    forking.hold_across_fork(gone, "lock", threading.Lock)
    del gone
    kept.lock.acquire()  # as a call in flight in another thread: the fork does not wait for it
    try:
        start = time.monotonic()
        assert _in_child(lambda: kept.lock.acquire(timeout=5)) is True  # the child's lock is a new, free one
        assert time.monotonic() - start < forking.FORK_WAIT_S / 2
    finally:
        kept.lock.release()
    assert all(not isinstance(owner, Owner) or owner is kept for owner in list(forking._owners))


def test_registering_an_attribute_again_replaces_it():
    class Owner:
        pass

    owner = Owner()
    owner.lock = threading.Lock()
    forking.hold_across_fork(owner, "lock", threading.Lock)
    forking.hold_across_fork(owner, "lock", threading.RLock)
    assert list(forking._owners[owner]) == ["lock"]
    assert forking._owners[owner]["lock"][0] is threading.RLock


def test_a_fork_straight_after_a_computation_waits_for_the_intra_op_threads_to_settle(monkeypatch):
    """A child forked within moments of a forward on 2 threads waited for ever inside MKL's memory manager (half the
    time, straight after a forward); a fork long after one does not wait."""
    slept: list[float] = []
    monkeypatch.setattr(forking.time, "sleep", slept.append)
    monkeypatch.setattr(forking, "SETTLE_S", 60.0)  # "straight after" however slow this machine is (nothing sleeps)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        forking.computed()
        forking._before_fork()
        forking._after_fork_in_parent()
        monkeypatch.setattr(forking, "_last_computed", forking.time.monotonic() - 10 * forking.SETTLE_S)
        forking._before_fork()
        forking._after_fork_in_parent()
        torch.set_num_threads(1)
        forking.computed()
        forking._before_fork()  # one thread: nothing to settle
        forking._after_fork_in_parent()
    finally:
        torch.set_num_threads(threads)
    assert len(slept) == 1 and 0 < slept[0] <= forking.SETTLE_S

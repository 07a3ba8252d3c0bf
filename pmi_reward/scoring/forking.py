"""Locks that a fork does not leave held: a process forked while another thread is inside a scorer call.

``os.fork`` copies only the forking thread, and every lock in whatever state the other threads had it: a lock held
by a thread that is not copied stays held in the child forever, so the child's first call waits for ever (a fork
``Pool`` or ``datasets.map(num_proc=...)`` started while verl's reward loop scores from its threads). The locks that
guard state a call changes as it goes (a fast tokenizer's truncation setting, an SQLite connection mid-write) are
taken before the fork, so that nothing is half-done in the copy, and given back after it; the child gets new locks
(and ``in_child`` rebuilds what cannot cross a fork, as an SQLite connection or an ONNX Runtime session). This is
what ``logging`` does for its handlers' locks. A child computes on one torch thread (as torch's DataLoader workers
do): GNU OpenMP's threads do not survive a fork, and a child of a parent that had used several waited for ever.
A fork within ``SETTLE_S`` of the end of a computation (``computed``) waits out the rest of it first: the intra-op
threads go on inside MKL's memory manager for a moment after the forward returns, and a child forked then waited for
ever at its first matrix product (``tests/test_forking.py``, on 2 threads).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

__all__ = ["hold_across_fork", "keep_for_ever", "computed"]

logger = logging.getLogger(__name__)

FORK_WAIT_S = 60.0  # how long a fork waits for one call to give a lock back before it goes on without it

_Entry = tuple[Callable[[], Any], Callable[[Any], None] | None, bool]  # new_lock, in_child, hold
_owners: weakref.WeakKeyDictionary[Any, dict[str, _Entry]] = weakref.WeakKeyDictionary()
_held: list[Any] = []  # the locks taken before the fork in progress, given back after it in the parent
_kept: list[Any] = []  # objects a child must never close or free (an SQLite connection made before the fork)
_registry_lock = threading.Lock()
SETTLE_S = 0.1  # how long after a computation a fork waits for the intra-op threads to settle
_last_computed = float("-inf")  # time.monotonic() at the end of the last computation (``computed``)


def hold_across_fork(
    owner: Any,
    attr: str,
    new_lock: Callable[[], Any],
    in_child: Callable[[Any], None] | None = None,
    hold: bool = True,
) -> None:
    """Take ``owner.<attr>`` before every fork of this process (waiting for the call holding it to finish) and give it
    back after it; in the child, set ``owner.<attr>`` to ``new_lock()`` and call ``in_child(owner)``. With
    ``hold=False`` the fork does not wait for the lock (what it guards is safe to copy mid-call): the child only gets
    a new one. The owner is held weakly (an object gone is forgotten); registering an attribute again replaces it."""
    with _registry_lock:
        _owners.setdefault(owner, {})[attr] = (new_lock, in_child, hold)


def keep_for_ever(thing: Any) -> None:
    """Keep ``thing`` alive in this process for good: a child drops what it inherited from its parent (an SQLite
    connection, which SQLite forbids using across a fork) without closing it, which could undo the parent's state."""
    _kept.append(thing)


def computed() -> None:
    """Note that a computation on torch's intra-op threads has just ended (called before its lock is given back)."""
    global _last_computed
    _last_computed = time.monotonic()


def _settle() -> None:
    """Wait out ``SETTLE_S`` from the last computation where torch computes on several threads."""
    torch = sys.modules.get("torch")
    wait = SETTLE_S - (time.monotonic() - _last_computed)
    try:
        if wait > 0 and torch is not None and torch.get_num_threads() > 1:
            time.sleep(wait)
    except Exception:  # noqa: BLE001 - an at-fork hook must not fail the fork
        pass


def _before_fork() -> None:
    with _registry_lock:  # a snapshot: an owner made while the fork waits for a lock is not held (nor blocked)
        locks = [(owner, attr) for owner, entries in _owners.items() for attr, entry in entries.items() if entry[2]]
    for owner, attr in locks:
        lock = getattr(owner, attr)
        if lock.acquire(timeout=FORK_WAIT_S):
            _held.append(lock)
        else:
            logger.warning(
                "fork: %s.%s was still held after %.0f s; the child may wait for it for ever (fork between "
                "scorer calls, or use the spawn start method)",
                type(owner).__name__,
                attr,
                FORK_WAIT_S,
            )
    _settle()


def _after_fork_in_parent() -> None:
    while _held:
        _held.pop().release()


def _after_fork_in_child() -> None:
    global _registry_lock
    _held.clear()  # the copies of the locks taken are left behind: each owner gets a new one
    _registry_lock = threading.Lock()
    for owner, entries in list(_owners.items()):
        for attr, (new_lock, in_child, _) in list(entries.items()):
            setattr(owner, attr, new_lock())
            if in_child is not None:
                try:
                    in_child(owner)
                except Exception:  # noqa: BLE001 - an at-fork hook's error is only printed: one owner's must not stop the rest
                    logger.exception("fork: rebuilding %s in the child failed", type(owner).__name__)
    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.get_num_threads() > 1:
            # GNU OpenMP's thread team does not survive a fork: a child of a parent that computed on several
            # intra-op threads waited for ever at its first parallel op. One thread, as torch's DataLoader workers.
            torch.set_num_threads(1)
    except Exception:  # noqa: BLE001 - a torch build that refuses it: the child keeps its threads
        logger.exception("fork: setting the child's torch threads to 1 failed")


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent, after_in_child=_after_fork_in_child)

"""Deleting the embedding cache's folder under a running process (the README calls it safe, to free the disk): the
process lets go of the deleted files and opens a fresh cache at the same path. Before, its SQLite connection kept
reading and writing the unlinked files, which no `du` could see and nothing freed until the process exited."""

from __future__ import annotations

import logging
import os
import shutil
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from pmi_reward.scoring.cache import EmbeddingCache, cache_key

pytestmark = pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="reads the open files off /proc/self/fd")


def _rows(tag: str, n: int) -> tuple[list[bytes], np.ndarray]:
    keys = [cache_key("test", tag, str(i)) for i in range(n)]
    return keys, np.arange(n * 4, dtype=np.float32).reshape(n, 4) + len(tag)


def _deleted_files_held(folder: Path) -> list[str]:
    """This process's open files that were under ``folder`` and are deleted now."""
    held = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # closed since the listing
            continue
        if target.endswith("(deleted)") and target.startswith(str(folder.resolve())):
            held.append(target)
    return held


def _stored(folder: Path) -> int:
    """Rows in the cache file at ``folder``, read by a connection of its own (as another process would)."""
    fresh = EmbeddingCache(folder)
    try:
        return len(fresh)
    finally:
        fresh.close()


def test_deleting_the_folder_under_a_live_cache_frees_its_files_and_new_rows_go_to_a_fresh_cache(tmp_path):
    folder = tmp_path / "embeddings"
    cache = EmbeddingCache(folder)
    old_keys, old_vectors = _rows("old", 50)
    cache.put(old_keys, old_vectors)
    assert len(cache.get(old_keys)) == 50
    shutil.rmtree(folder)
    assert _deleted_files_held(folder)  # the connection holds the unlinked database (and its WAL)

    new_keys, new_vectors = _rows("new", 20)
    cache.put(new_keys, new_vectors)
    assert folder.is_dir() and cache.writable
    assert _stored(folder) == 20  # the new rows are in the folder, on disk where du sees them
    found = cache.get(new_keys + old_keys)
    assert sorted(found) == sorted(new_keys)  # the deleted rows are gone: those texts are embedded again
    np.testing.assert_array_equal(np.stack([found[k] for k in new_keys]), new_vectors)
    assert _deleted_files_held(folder) == []
    cache.close()


def test_a_lookup_notices_the_delete_too_and_a_replaced_file_is_followed(tmp_path):
    folder = tmp_path / "embeddings"
    cache = EmbeddingCache(folder)
    keys, vectors = _rows("a", 10)
    cache.put(keys, vectors)
    shutil.rmtree(folder)
    assert cache.get(keys) == {}  # a miss, not the deleted rows
    assert folder.is_dir() and _deleted_files_held(folder) == []

    # rotated: another cache file moved into its place (a new inode at the same path)
    other = tmp_path / "other"
    rotated = EmbeddingCache(other)
    rotated.put(*_rows("b", 3))
    rotated.close()
    shutil.rmtree(folder)
    shutil.move(other, folder)
    assert len(cache.get(_rows("b", 3)[0])) == 3
    cache.close()


def test_two_connections_sharing_the_folder_both_follow_it_and_keep_each_others_rows(tmp_path):
    """The first to notice makes the new files; the other's closing its old connection must not delete them (SQLite
    neither checkpoints into nor deletes the WAL at the path of a database that has moved)."""
    folder = tmp_path / "embeddings"
    first, second = EmbeddingCache(folder), EmbeddingCache(folder)
    first.put(*_rows("old", 30))
    shutil.rmtree(folder)
    first_keys, first_vectors = _rows("first", 7)
    first.put(first_keys, first_vectors)  # makes the folder again, its rows in the new WAL
    second_keys, second_vectors = _rows("second", 5)
    second.put(second_keys, second_vectors)  # notices, closes its old connection, opens the new file
    assert len(second.get(first_keys)) == 7 and len(first.get(second_keys)) == 5
    assert _stored(folder) == 12
    assert _deleted_files_held(folder) == []
    first.close()
    second.close()


def test_another_process_and_this_one_both_reopen_the_deleted_cache(tmp_path):
    folder = tmp_path / "embeddings"
    child = textwrap.dedent(
        """
        import os
        import sys
        import numpy as np
        from pmi_reward.scoring.cache import EmbeddingCache, cache_key
        folder = os.path.realpath(sys.argv[1])
        cache = EmbeddingCache(folder)
        for line in sys.stdin:
            keys = [cache_key("test", line.strip(), str(i)) for i in range(4)]
            cache.put(keys, np.ones((4, 4), dtype=np.float32))
            held = []
            for fd in os.listdir("/proc/self/fd"):
                try:
                    held.append(os.readlink(f"/proc/self/fd/{fd}"))
                except OSError:  # closed since the listing
                    pass
            print(sum(t.startswith(folder) and t.endswith("(deleted)") for t in held), flush=True)
        """
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", child, str(folder)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        proc.stdin.write("before\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "0"
        ours = EmbeddingCache(folder)
        ours.put(*_rows("ours-before", 3))
        shutil.rmtree(folder)
        ours.put(*_rows("ours-after", 2))
        proc.stdin.write("after\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "0"  # the child let go of the deleted files too
    finally:
        proc.stdin.close()
        assert proc.wait(timeout=60) == 0
    assert _stored(folder) == 2 + 4
    assert len(ours.get(_rows("ours-after", 2)[0])) == 2
    assert _deleted_files_held(folder) == []
    ours.close()


def test_threads_writing_and_reading_while_the_folder_is_deleted(tmp_path, caplog):
    """The folder moved aside and deleted (whole, so no thread's fresh files are removed by name) several times
    while four threads write and read: each delete is followed once, under the cache's lock, and nothing fails."""
    folder = tmp_path / "embeddings"
    cache = EmbeddingCache(folder)
    errors: list[BaseException] = []
    stop = threading.Event()

    def work(n: int) -> None:
        try:
            step = 0
            while not stop.is_set():
                keys, vectors = _rows(f"t{n}-{step}", 8)
                cache.put(keys, vectors)
                found = cache.get(keys)  # a delete since the write leaves them out: embedded again
                if any(not np.array_equal(found[k], v) for k, v in zip(keys, vectors, strict=True) if k in found):
                    raise AssertionError(f"thread {n}, step {step}: rows read back differ from those written")
                step += 1
        except BaseException as err:  # reported by the main thread
            errors.append(err)

    def followed() -> int:
        return sum("its folder was deleted" in r.getMessage() for r in caplog.records)

    def written_after(deletes: int) -> None:
        """Wait until the threads followed ``deletes`` deletes and wrote rows into the fresh folder: paced by the
        threads, not by a sleep, a delete never finds the folder gone already (a busy machine, a slow thread)."""
        deadline = time.monotonic() + 60
        while not (followed() == deletes and folder.is_dir() and _stored(folder) > 0):
            assert time.monotonic() < deadline, f"the threads did not write after delete {deletes} within 60 s"
            time.sleep(0.01)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    with caplog.at_level(logging.INFO, logger="pmi_reward.scoring.cache"):
        for t in threads:
            t.start()
        for k in range(3):
            written_after(k)
            os.rename(folder, tmp_path / f"trash{k}")
            shutil.rmtree(tmp_path / f"trash{k}")
        written_after(3)
        stop.set()
        for t in threads:
            t.join(timeout=60)
    assert errors == []
    assert followed() == 3
    assert cache.writable and folder.is_dir() and _deleted_files_held(folder) == []
    assert _stored(folder) == len(cache) > 0
    cache.close()


def test_a_folder_deleted_again_while_it_is_made_anew_is_tried_again(tmp_path, monkeypatch):
    """`rm -r` still at work as the cache opens its fresh file: the connect finds no folder (SQLite's CANTOPEN, which
    otherwise means a folder it may not write); the cache tries again rather than run without one for good."""
    from pmi_reward.scoring import cache as module

    folder = tmp_path / "embeddings"
    cache = EmbeddingCache(folder)
    cache.put(*_rows("a", 2))
    shutil.rmtree(folder)
    connect = module.sqlite3.connect
    calls = []

    def connect_after_the_folder_went(*args, **kwargs):
        calls.append(args)
        if len(calls) == 1:
            shutil.rmtree(folder)  # gone again between the mkdir and the connect
        return connect(*args, **kwargs)

    monkeypatch.setattr(module.sqlite3, "connect", connect_after_the_folder_went)
    keys, vectors = _rows("b", 3)
    cache.put(keys, vectors)
    monkeypatch.setattr(module.sqlite3, "connect", connect)
    assert len(calls) >= 2 and cache.writable and _stored(folder) == 3
    assert _deleted_files_held(folder) == []
    cache.close()


def test_a_closed_cache_is_not_opened_again_by_a_delete(tmp_path):
    folder = tmp_path / "embeddings"
    cache = EmbeddingCache(folder)
    cache.put(*_rows("a", 2))
    cache.close()
    shutil.rmtree(folder)
    with pytest.raises(Exception, match="closed"):
        cache.get(_rows("a", 2)[0])
    assert not folder.exists()


def test_the_file_alone_deleted_or_replaced_is_not_followed_and_the_cache_keeps_working(tmp_path, caplog):
    """``embeddings.sqlite`` alone deleted (or a backup moved over it) leaves the old database's -wal and -shm beside
    it: a fresh connection read them against the new file ("disk I/O error" and no cache for the rest of the run
    where another process mapped them; the backup corrupted where not). The process keeps its connection, said once."""
    folder = tmp_path / "embeddings"
    cache = EmbeddingCache(folder)
    keys, vectors = _rows("a", 30)
    cache.put(keys, vectors)
    backup = tmp_path / "backup"
    EmbeddingCache(backup).close()
    os.replace(backup / "embeddings.sqlite", folder / "embeddings.sqlite")
    with caplog.at_level(logging.WARNING, logger="pmi_reward.scoring.cache"):
        found = cache.get(keys)
        more_keys, more_vectors = _rows("b", 5)
        cache.put(more_keys, more_vectors)
        assert len(cache.get(more_keys)) == 5
    np.testing.assert_array_equal(np.stack([found[k] for k in keys]), vectors)
    assert cache.writable and cache._db is not None
    said = [r.getMessage() for r in caplog.records if "while its folder stays" in r.getMessage()]
    assert len(said) == 1 and "replaced" in said[0] and "delete the whole folder" in said[0]
    cache.close()


def test_a_relative_folder_stays_the_same_cache_after_a_chdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cache = EmbeddingCache("cache")
    keys, vectors = _rows("a", 10)
    cache.put(keys, vectors)
    (tmp_path / "run").mkdir()
    monkeypatch.chdir(tmp_path / "run")
    assert len(cache.get(keys)) == 10
    assert not (tmp_path / "run" / "cache").exists()
    cache.close()


def test_a_lookup_sqlite_fails_is_a_miss_said_once(tmp_path, caplog):
    """A corrupt or locked cache made every encode call raise (an RL reward then gave None at every step)."""
    cache = EmbeddingCache(tmp_path / "embeddings")
    keys, vectors = _rows("a", 3)
    cache.put(keys, vectors)

    class Failing:
        def execute(self, *args):
            raise sqlite3.DatabaseError("database disk image is malformed")

        def close(self):
            pass

    real, cache._db = cache._db, Failing()
    with caplog.at_level(logging.WARNING, logger="pmi_reward.scoring.cache"):
        assert cache.get(keys) == {} and cache.get(keys) == {}
    assert sum("lookup failed" in r.getMessage() for r in caplog.records) == 1
    cache._db = real
    cache.close()
    with pytest.raises(sqlite3.ProgrammingError):  # a closed cache is still the caller's error
        cache.get(keys)


def test_a_lookup_between_rm_r_unlinking_the_file_and_removing_the_folder_still_follows_the_folder(tmp_path):
    """``rm -r`` unlinks the file before it removes the folder: a lookup in between saw "the file alone" and stopped
    watching for good, so the process kept the deleted files for the rest of the run."""
    folder = tmp_path / "embeddings"
    cache = EmbeddingCache(folder)
    keys, vectors = _rows("a", 10)
    cache.put(keys, vectors)
    os.unlink(folder / "embeddings.sqlite")
    assert len(cache.get(keys)) == 10  # the file alone gone: the connection is kept
    shutil.rmtree(folder)
    assert cache.get(keys) == {}  # the folder gone too: followed
    assert folder.is_dir() and _deleted_files_held(folder) == []
    cache.close()


def _child_state(cache: EmbeddingCache) -> tuple:
    import multiprocessing

    answers = multiprocessing.get_context("fork").Queue()

    def run() -> None:
        try:
            answers.put((cache._db is not None, cache.writable, len(cache.get(_rows("a", 4)[0]))))
        except Exception as err:  # noqa: BLE001 - reported to the parent
            answers.put(repr(err))

    process = multiprocessing.get_context("fork").Process(target=run)
    process.start()
    process.join(30)
    return answers.get(timeout=5)


def test_a_child_forked_after_the_file_alone_went_runs_without_a_cache(tmp_path, caplog):
    """The child opened a fresh file beside the parent's -wal and -shm ("disk I/O error", a traceback per worker)."""
    folder = tmp_path / "embeddings"
    cache = EmbeddingCache(folder)
    cache.put(*_rows("a", 4))
    os.unlink(folder / "embeddings.sqlite")
    assert _child_state(cache) == (False, False, 0)
    assert not (folder / "embeddings.sqlite").exists()  # no fresh file beside the old -wal and -shm
    assert len(cache.get(_rows("a", 4)[0])) == 4
    cache.close()


def test_a_closed_cache_stays_closed_in_a_forked_child(tmp_path):
    cache = EmbeddingCache(tmp_path / "embeddings")
    cache.put(*_rows("a", 4))
    cache.close()
    assert "closed" in str(_child_state(cache)).lower()

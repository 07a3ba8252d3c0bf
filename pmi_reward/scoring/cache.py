"""An on-disk embedding cache (SQLite, float32 blobs) so repeated runs and training rounds never re-encode."""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from .forking import hold_across_fork, keep_for_ever

__all__ = ["EmbeddingCache", "CacheFileError", "cache_key"]

logger = logging.getLogger(__name__)

_CHUNK = 900  # below SQLite's host-parameter limit
# SQLite's primary result codes of a database this process cannot write at all: PERM, READONLY, CANTOPEN, AUTH
_READ_ONLY_CODES = frozenset({3, 8, 14, 23})
_NO_PERMISSION = frozenset({errno.EACCES, errno.EPERM, errno.EROFS})  # a cache folder this process may not make
_REOPEN_TRIES = 3  # opening a fresh cache where the old one was deleted, while the folder keeps vanishing


_Identity = tuple[tuple[int, int] | None, tuple[int, int] | None]  # (folder, file) (st_dev, st_ino)


def _stat_id(path: Path) -> tuple[int, int] | None:
    """``path``'s (st_dev, st_ino), None where nothing is there now (other stat errors raise)."""
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    return st.st_dev, st.st_ino


def _read_only(err: sqlite3.Error) -> bool:
    """Whether ``err`` says the database cannot be written at all (SQLite's READONLY, PERM, CANTOPEN, AUTH; by the
    message where Python does not give the code), as opposed to a failure that may clear (locked, busy, full)."""
    code = getattr(err, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in _READ_ONLY_CODES
    return "readonly" in str(err) or "unable to open" in str(err)


class CacheFileError(sqlite3.DatabaseError, OSError):
    """``embeddings.sqlite`` is no database SQLite can read (its first page overwritten by a disk error, a copy
    taken mid-write, another file at its path): to delete. A ``sqlite3.DatabaseError``, as it was, and an
    ``OSError``, as any other unreadable file, so that a command reports it in one line (exit code 2), not with a
    traceback."""


def cache_key(*parts: str) -> bytes:
    """A 20-byte key for an embedding: the encoder fingerprint, the input kind and the texts."""
    h = hashlib.sha1()
    for part in parts:
        data = part.encode("utf-8", "surrogatepass")
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.digest()


class EmbeddingCache:
    """Maps keys to float32 vectors in ``<directory>/embeddings.sqlite``; safe to share between processes and between
    threads of one (one connection, its calls taken in turn). A cache that cannot be written (a read-only mount,
    another user's file or folder, a full disk) still answers lookups where SQLite can read it: its writes are
    skipped, with one warning; one it cannot even read (a folder it may not write, where SQLite cannot make the
    files a WAL database is read through) gives every lookup a miss, with one warning: scoring goes on, but the
    embeddings it computes are not saved.

    A cache folder deleted under a running process (to free the disk) or replaced as a whole is noticed at the next
    lookup or write, by the folder's and the file's device and inode: the old connection is closed, freeing the
    deleted files, and a fresh cache is opened at the same path (its folder made again), so texts are embedded and
    saved there again. ``embeddings.sqlite`` gone or replaced while its folder stays (said once) is not followed
    until the folder goes too (``rm -r`` unlinks the file first): the old database's ``-wal`` and ``-shm`` files are
    still beside it, where another process may map them, and a fresh connection would read them against the new file
    (a "disk I/O error", or the new file corrupted); a process forked then runs without a cache. A cache opened
    without a file (one it could not open at all) does not look again. A lookup SQLite fails (a file corrupted past
    its first page, locked past the timeout) is a miss, said once per kind, not an error of the caller's. A file
    SQLite cannot open as a database at all (its header overwritten, not a database) is refused when the cache
    opens: ``CacheFileError`` (a ``sqlite3.DatabaseError`` and an ``OSError``) names it, to delete; where a
    deleted or replaced folder is opened afresh mid-run, such a file means running on without a cache, with one
    warning."""

    def __init__(self, directory: str | Path) -> None:
        # absolute, as SQLite holds it: a relative folder read after an os.chdir would be another folder
        self.path = Path(os.path.abspath(directory)) / "embeddings.sqlite"
        self._closed = False
        self._lock = threading.Lock()
        # a fork waits for a lookup or a write in flight; the child opens a connection of its own
        hold_across_fork(self, "_lock", threading.Lock, in_child=EmbeddingCache._reopen)
        self._open()

    def _open(self) -> None:
        """Connect to ``path`` (made where missing), read-write, else read-only, else with no cache at all, and
        note which file it is (``_file``) so that a deleted or replaced one is noticed (``_follow_file``)."""
        self.writable = True  # False once a write failed for good: later ones are skipped
        self._skipped: set[str] = set()  # the failures warned about that skipped one write each
        self._db: sqlite3.Connection | None = None  # None: no usable cache (every lookup misses, writes skipped)
        self._file: _Identity | None = None  # the folder's and file's (st_dev, st_ino) at open; None: not watched
        self._alone = False  # the file went or was replaced while its folder stayed: only the folder is followed
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            if err.errno not in _NO_PERMISSION:
                raise
            self._without_cache(err)
            return
        try:
            self._db = db = sqlite3.connect(self.path, timeout=60, check_same_thread=False)
            self._wal(db)
            db.execute("CREATE TABLE IF NOT EXISTS emb (key BLOB PRIMARY KEY, vec BLOB NOT NULL)")
            self._file = self._watch()
        except sqlite3.DatabaseError as err:
            if self._db is not None:
                self._db.close()
                self._db = None
            if isinstance(err, sqlite3.OperationalError) and _read_only(err):  # another user's folder, a read-only fs
                self._open_read_only(err)
                return
            if isinstance(err, sqlite3.OperationalError):  # locked past the timeout: not a broken file
                raise
            raise CacheFileError(f"{self.path}: not a readable embedding cache ({err}); delete it") from None

    def _open_read_only(self, cause: sqlite3.Error) -> None:
        """Open the cache for lookups only (``mode=ro``), or, where SQLite cannot read it so either (a WAL database
        whose folder does not let it make its ``-shm`` file, a folder without the file), run without one."""
        self.writable = False
        try:
            self._db = sqlite3.connect(f"{self.path.resolve().as_uri()}?mode=ro", uri=True, check_same_thread=False)
            self._db.execute("SELECT 1 FROM emb LIMIT 1").fetchall()  # the open itself is lazy: read once here
        except sqlite3.DatabaseError as err:
            if self._db is not None:
                self._db.close()
                self._db = None
            self._without_cache(f"{cause}; read-only too: {err}")
            return
        self._file = self._watch()
        logger.warning(
            "embedding cache %s: cannot write it (%s); reading it only: new embeddings will not be saved",
            self.path,
            cause,
        )

    def _without_cache(self, cause: object) -> None:
        """No cache at all: every lookup a miss, every write skipped, said once here."""
        self.writable, self._db, self._file = False, None, None
        logger.warning(
            "embedding cache %s: cannot open it (%s); running without a cache: embeddings will not be saved",
            self.path,
            cause,
        )

    def _identity(self) -> _Identity:
        """The (st_dev, st_ino) of ``path``'s folder and of ``path``, None for one that is not there now (the file
        first: a folder moved or removed between the two reads as a folder changed, not as a file gone alone)."""
        file = _stat_id(self.path)
        return _stat_id(self.path.parent), file

    def _watch(self) -> _Identity | None:
        """The identity of the file just opened, None (not watched) where a stat cannot say."""
        try:
            return self._identity()
        except OSError:
            return None

    def _follow_file(self) -> None:
        """Under ``_lock``, once per lookup or write: where the folder was deleted or replaced, close the connection
        (freeing the deleted files; SQLite neither checkpoints into nor deletes the files now at that path when it
        closes a moved database) and open a fresh cache at ``path``, as at the start; where the file alone was, stop
        watching (the class's docstring says why). A stat that fails otherwise (a folder made unreadable) leaves the
        connection as it is."""
        if self._file is None:
            return
        try:
            now = self._identity()
        except OSError:
            return
        if now == self._file:
            return
        if now[0] == self._file[0]:  # the same folder: the file went (or an rm -r is at work), beside the -wal, -shm
            if not self._alone:
                self._alone = True
                logger.warning(
                    "embedding cache %s: the file is %s while its folder stays; this process keeps its connection "
                    "until the folder goes (to clear the cache under a running process, delete the whole folder)",
                    self.path,
                    "gone" if now[1] is None else "replaced",
                )
            return
        logger.info("embedding cache %s: its folder was deleted or replaced; opening a fresh cache there", self.path)
        if self._db is not None:
            self._db.close()
        for _ in range(_REOPEN_TRIES):
            try:
                self._open()
            except (OSError, sqlite3.DatabaseError) as err:  # locked past the timeout, not a cache, a file for a folder
                self._without_cache(err)
            if self._db is not None or self.path.parent.is_dir():
                return
            # the folder went while it was made again (an `rm -r` still at work): not a folder it cannot write

    def _reopen(self) -> None:
        """A forked child's own connection: SQLite forbids using one across a fork. The inherited one is kept, never
        closed, as closing it in the child could release what the parent holds."""
        if self._db is not None:
            keep_for_ever(self._db)
        if self._closed:  # a closed cache stays closed
            return
        if not self.path.parent.is_dir():  # deleted since: a child that never scores must not make it again
            self.writable, self._db, self._file = False, None, None
            return
        try:
            now = self._identity()
        except OSError:
            now = None
        if self._alone or (
            self._file is not None and now is not None and now != self._file and now[0] == self._file[0]
        ):
            # the file alone went or was replaced under the parent, which maps its -wal and -shm: not beside them
            self.writable, self._db, self._file = False, None, None
            logger.info("embedding cache %s: its file changed under the parent; this child runs without one", self.path)
            return
        self.__init__(self.path.parent)  # type: ignore[misc]

    def __getstate__(self) -> dict:
        """A copy (deepcopy, pickle) reopens the file: a connection and a lock do not travel."""
        return {"directory": str(self.path.parent.resolve())}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["directory"])  # type: ignore[misc]

    @staticmethod
    def _wal(db: sqlite3.Connection) -> None:
        """Switch to write-ahead logging; processes opening a new cache at once can find it locked for the switch
        (which does not wait on the busy timeout): retried for up to a minute."""
        deadline = time.monotonic() + 60
        while True:
            try:
                db.execute("PRAGMA journal_mode=WAL")
                return
            except sqlite3.OperationalError as err:
                if "locked" not in str(err) or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def get(self, keys: Sequence[bytes]) -> dict[bytes, np.ndarray]:
        found: dict[bytes, np.ndarray] = {}
        with self._lock:
            self._follow_file()
            if self._db is None:
                return found
            try:
                for i in range(0, len(keys), _CHUNK):
                    chunk = keys[i : i + _CHUNK]
                    marks = ",".join("?" * len(chunk))
                    for key, blob in self._db.execute(f"SELECT key, vec FROM emb WHERE key IN ({marks})", chunk):
                        found[bytes(key)] = np.frombuffer(blob, dtype=np.float32)
            except sqlite3.ProgrammingError:  # a closed cache: the caller's error
                raise
            except sqlite3.DatabaseError as err:  # the rest are misses: they are embedded, not lost
                if f"get: {err}" not in self._skipped:
                    self._skipped.add(f"get: {err}")
                    logger.warning(
                        "embedding cache %s: lookup failed (%s); its texts are embedded again", self.path, err
                    )
        return found

    def put(self, keys: Sequence[bytes], vectors: np.ndarray) -> None:
        """Store the vectors; a write that fails is skipped with a warning, never raised: the embeddings were
        computed, and a reward call must not lose them to its cache. A cache found read-only (or full, or
        unwritable: SQLite's READONLY, PERM, CANTOPEN, AUTH) is not written again; any other failure (locked or busy
        past the timeout, WAL's locking protocol, a full disk, an I/O error: they may clear) skips only that write,
        with one warning per kind."""
        if not self.writable:
            return
        rows = [(k, np.ascontiguousarray(v, dtype=np.float32).tobytes()) for k, v in zip(keys, vectors, strict=True)]
        with self._lock:
            self._follow_file()
            db = self._db
            if not self.writable or db is None:
                return
            try:
                with db:
                    db.executemany("INSERT OR REPLACE INTO emb (key, vec) VALUES (?, ?)", rows)
            except sqlite3.DatabaseError as err:
                if isinstance(err, sqlite3.ProgrammingError):  # a closed connection: the caller's bug
                    raise
                if _read_only(err):
                    self.writable = False
                    logger.warning("embedding cache %s: cannot write it (%s); reading it only now", self.path, err)
                elif str(err) not in self._skipped:
                    self._skipped.add(str(err))
                    logger.warning("embedding cache %s: write skipped (%s); later writes are tried", self.path, err)

    def __len__(self) -> int:
        if self._db is None:
            return 0
        with self._lock:
            return self._db.execute("SELECT COUNT(*) FROM emb").fetchone()[0]

    def close(self) -> None:
        self._file, self._closed = None, True  # a closed cache stays closed, its file deleted or not, in a child too
        if self._db is not None:
            self._db.close()

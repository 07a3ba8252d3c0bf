"""A key -> value cache kept in memory and appended to a JSONL file, for baselines whose LM calls are costly
(MEEP's sampled answers, the chat LM's log-likelihoods): a rerun reads what an earlier run computed."""

from __future__ import annotations

import itertools
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ...data.records import DataError

__all__ = ["JsonlCache"]


class JsonlCache(dict):
    """A dict of ``key -> value`` loaded from ``path`` (one ``{"key": ..., field: value}`` record per line, when it
    exists); ``add`` stores new entries and appends them to the file.

    A run killed while appending leaves a last line cut short (no newline after it): that line is skipped, and the
    next append first removes it, so that the entries before it are kept and none after it is spoilt. Any other
    line that is not a record is a DataError naming it.

    ``max_entries`` bounds what is kept in memory, the oldest entries dropped first (a dict keeps insertion order):
    a cache that a long run fills with keys never asked for again (an RL reward's new replies, every step) stays
    the same size. The file, if any, still keeps every entry. None: no bound."""

    def __init__(self, path: str | Path | None = None, field: str = "value", max_entries: int | None = None) -> None:
        super().__init__()
        if max_entries is not None and max_entries < 1:
            raise ValueError(f"JsonlCache max_entries must be at least 1 (or None: no bound), got {max_entries}")
        self.path, self.field, self.max_entries = (Path(path) if path else None), field, max_entries
        self._cut_at: int | None = None  # where a last line cut short starts: the next append removes it first
        self._unended = False  # the last line is a whole record without its newline: the next append ends it
        if self.path and self.path.is_file():
            data = self.path.read_bytes()
            lines = data.split(b"\n")
            self._unended = bool(lines[-1])
            for n, line in enumerate(lines, 1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line.decode("utf-8"))
                    self[record["key"]] = record[field]
                except (ValueError, KeyError, TypeError) as err:  # UnicodeDecodeError is a ValueError
                    if n == len(lines):  # the last line, with no newline after it: an append cut short
                        self._cut_at, self._unended = len(data) - len(line), False
                        continue
                    raise DataError(
                        f"{self.path}, line {n}: not a cache record ({type(err).__name__}: {err}); delete the file "
                        "to compute its entries again"
                    ) from None
            self._trim()

    def _trim(self) -> None:
        """Drop the oldest entries past ``max_entries``."""
        if self.max_entries is not None:
            for key in list(itertools.islice(self, max(len(self) - self.max_entries, 0))):
                del self[key]

    def add(self, entries: Mapping[str, Any]) -> None:
        """Store ``entries`` (in memory, oldest past ``max_entries`` dropped, and appended to the file)."""
        self.update(entries)
        self._trim()
        if self.path:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if self._cut_at is not None:
                with self.path.open("r+b") as f:
                    f.truncate(self._cut_at)
            with self.path.open("a", encoding="utf-8") as f:
                if self._unended:
                    f.write("\n")
                self._cut_at, self._unended = None, False
                lines = (json.dumps({"key": k, self.field: v}, ensure_ascii=False) + "\n" for k, v in entries.items())
                f.writelines(lines)

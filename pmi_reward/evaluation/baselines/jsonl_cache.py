"""A key -> value cache kept in memory and appended to a JSONL file, for baselines whose LM calls are costly
(MEEP's sampled answers, the chat LM's log-likelihoods): a rerun reads what an earlier run computed."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["JsonlCache"]


class JsonlCache(dict):
    """A dict of ``key -> value`` loaded from ``path`` (one ``{"key": ..., field: value}`` record per line, when it
    exists); ``add`` stores new entries and appends them to the file."""

    def __init__(self, path: str | Path | None = None, field: str = "value") -> None:
        super().__init__()
        self.path, self.field = (Path(path) if path else None), field
        if self.path and self.path.is_file():
            for line in self.path.read_text(encoding="utf-8").splitlines():
                record = json.loads(line)
                self[record["key"]] = record[field]

    def add(self, entries: Mapping[str, Any]) -> None:
        self.update(entries)
        if self.path:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a", encoding="utf-8") as f:
                lines = (json.dumps({"key": k, self.field: v}, ensure_ascii=False) + "\n" for k, v in entries.items())
                f.writelines(lines)

"""Reading and writing tables of records (CSV, TSV, JSONL, JSON) with errors that name the file, row and field."""

from __future__ import annotations

import csv
import io
import json
import os
import sys
import tempfile
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

__all__ = ["DataError", "read_records", "write_records", "require_text", "atomic_write"]

csv.field_size_limit(min(sys.maxsize, 2**31 - 1))


class DataError(ValueError):
    """Bad input data; the message says which file, row and field."""


def _where(path: Path, row: int | None = None, field: str | None = None) -> str:
    parts = [str(path)]
    if row is not None:
        parts.append(f"row {row}")
    if field is not None:
        parts.append(f"field {field!r}")
    return ", ".join(parts)


def read_records(path: str | Path) -> list[dict]:
    """All records of a .csv/.tsv/.jsonl/.json file as dicts (row numbers in errors count data rows from 1)."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise DataError(f"{path}: not UTF-8 text (byte {err.start}: {err.reason})") from None
    if text.startswith("\ufeff"):
        text = text[1:]
    if not text.strip():
        raise DataError(f"{path}: the file is empty")
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".ndjson"):
        records = []
        for n, line in enumerate(text.split("\n"), 1):  # JSON Lines ends records at \n only
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise DataError(f"{_where(path, n)}: invalid JSON ({err.msg})") from None
            if not isinstance(record, dict):
                raise DataError(f"{_where(path, n)}: expected a JSON object, got {type(record).__name__}")
            records.append(record)
        return records
    if suffix == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise DataError(f"{path}: invalid JSON at line {err.lineno} ({err.msg})") from None
        if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
            raise DataError(f"{path}: expected a JSON list of objects")
        return data
    if suffix in (".csv", ".tsv"):
        # a stream, not str.splitlines(): that also splits on \x85, \u2028 etc. inside quoted fields
        reader = csv.DictReader(io.StringIO(text, newline=""), delimiter="\t" if suffix == ".tsv" else ",")
        if not reader.fieldnames:
            raise DataError(f"{path}: no header row")
        records = []
        for n, row in enumerate(reader, 1):
            if None in row:
                raise DataError(f"{_where(path, n)}: more values than header columns")
            records.append(row)
        return records
    raise DataError(f"{path}: unsupported file type {suffix!r} (use .csv, .tsv, .jsonl or .json)")


def require_text(records: Sequence[dict], path: str | Path, field: str, allow_empty: bool = False) -> list[str]:
    """The string values of ``field`` in every record, or a DataError naming the first bad row."""
    path = Path(path)
    if not records:
        raise DataError(f"{path}: no data rows")
    if field not in records[0]:
        raise DataError(f"{path}: missing column {field!r} (columns: {sorted(records[0])})")
    values = []
    for n, record in enumerate(records, 1):
        value = record.get(field)
        if value is None:
            raise DataError(f"{_where(path, n, field)}: missing value")
        if not isinstance(value, str):
            raise DataError(f"{_where(path, n, field)}: expected text, got {type(value).__name__}")
        if not allow_empty and not value.strip():
            raise DataError(f"{_where(path, n, field)}: empty text")
        values.append(value)
    return values


def write_records(path: str | Path, records: Iterable[dict]) -> None:
    """Write records as .csv/.tsv/.jsonl (by suffix); CSV columns are the union of keys in first-seen order."""
    path = Path(path)
    records = list(records)
    path.parent.mkdir(parents=True, exist_ok=True)
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".ndjson"):
        with path.open("w", encoding="utf-8") as f:
            for record in records:
                f.write(json.dumps(record, ensure_ascii=False) + "\n")
        return
    if suffix == ".json":
        path.write_text(json.dumps(records, ensure_ascii=False, indent=1), encoding="utf-8")
        return
    if suffix in (".csv", ".tsv"):
        columns = list(dict.fromkeys(k for r in records for k in r))
        with path.open("w", encoding="utf-8", newline="") as f:
            writer = csv.DictWriter(f, columns, delimiter="\t" if suffix == ".tsv" else ",")
            writer.writeheader()
            writer.writerows(records)
        return
    raise DataError(f"{path}: unsupported output type {suffix!r} (use .csv, .tsv, .jsonl or .json)")


def atomic_write(path: Path, write: Callable[[str], object]) -> None:
    """Call ``write(tmp)`` on a temporary file beside ``path``, then move it into place in one step, so that a
    reader (or a run killed mid-write) sees the old file or the new one, never half of one."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)

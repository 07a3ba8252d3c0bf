"""Reading and writing tables of records (CSV, TSV, JSONL, JSON) with errors that name the file, row and field."""

from __future__ import annotations

import csv
import io
import json
import math
import os
import re
import secrets
import shutil
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "DataError",
    "WRITABLE",
    "read_records",
    "write_records",
    "require_text",
    "json_safe",
    "check_output",
    "check_output_dir",
    "atomic_write",
    "replace_directory",
]

WRITABLE = (".csv", ".tsv", ".jsonl", ".ndjson", ".json")

csv.field_size_limit(min(sys.maxsize, 2**31 - 1))

_LINE_BREAK = re.compile(r"\r\n?|\n")  # the csv module's row ends, not str.splitlines()'s \x85, \u2028 etc.


class DataError(ValueError):
    """Bad input data; the message says which file, row and field."""


def _where(path: Path, row: int | str | None = None, field: str | None = None) -> str:
    parts = [str(path)]
    if row is not None:
        parts.append(f"row {row}")
    if field is not None:
        parts.append(f"field {field!r}")
    return ", ".join(parts)


def read_records(path: str | Path) -> list[dict]:
    """All records of a .csv/.tsv/.jsonl/.json file as dicts (row numbers in errors count data rows from 1). A CSV/TSV
    cell is read as written, its \\r\\n and lone \\r kept (as in a JSON string), not made \\n."""
    path = Path(path)
    if path.is_dir():
        raise DataError(f"{path}: a folder, not a file (give a .csv, .tsv, .jsonl or .json file)")
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    try:
        # newline="": the text as written; read_text()'s universal newlines turned a quoted CSV cell's \r\n and lone
        # \r into \n, so the user's text changed (in `pmi-reward score`'s output too) and a lone-\r context, one
        # turn from JSONL or the API, was several turns from CSV
        with path.open(encoding="utf-8", newline="") as f:
            text = f.read()
    except UnicodeDecodeError as err:
        raise DataError(f"{path}: not UTF-8 text (byte {err.start}: {err.reason})") from None
    if text.startswith("\ufeff"):
        text = text[1:]
    if not text.strip():
        raise DataError(f"{path}: the file is empty")
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".ndjson", ".json"):
        # a raw \r is never inside a JSON string (it must be escaped there), so it only ends a line: \r\n and lone
        # \r line ends read as \n, as universal newlines read them
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    if suffix in (".jsonl", ".ndjson"):
        records: list[dict] = []
        for line_no, line in enumerate(text.split("\n"), 1):  # JSON Lines ends records at \n only
            if not line.strip():
                continue
            # rows count records, as every later error counts them; a blank line is none
            n: int | str = len(records) + 1 if len(records) + 1 == line_no else f"{len(records) + 1} (line {line_no})"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise DataError(f"{_where(path, n)}: invalid JSON ({err.msg})") from None
            except (ValueError, RecursionError) as err:  # a number too long for int(), nesting too deep
                raise DataError(f"{_where(path, n)}: invalid JSON ({_unreadable(err)})") from None
            if not isinstance(record, dict):
                raise DataError(f"{_where(path, n)}: expected a JSON object, got {type(record).__name__}")
            if "\\ud" in line or "\\uD" in line:
                _check_surrogates(record, path, n)
            records.append(record)
        return records
    if suffix == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise DataError(f"{path}: invalid JSON at line {err.lineno} ({err.msg})") from None
        except (ValueError, RecursionError) as err:
            raise DataError(f"{path}: invalid JSON ({_unreadable(err)})") from None
        if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
            raise DataError(f"{path}: expected a JSON list of objects")
        if "\\ud" in text or "\\uD" in text:
            for n, record in enumerate(data, 1):
                _check_surrogates(record, path, n)
        return data
    if suffix in (".csv", ".tsv"):
        # a stream, not str.splitlines(): that also splits on \x85, \u2028 etc. inside quoted fields; the csv module
        # ends rows at \r\n, \r or \n outside quotes and keeps a quoted cell's line breaks as written; strict, so
        # that an unclosed quote is an error rather than a field that swallows the rows after it
        delimiter = "\t" if suffix == ".tsv" else ","
        reader = csv.DictReader(io.StringIO(text, newline=""), delimiter=delimiter, strict=True)
        records = []
        columns = None
        try:
            columns = reader.fieldnames
            if not columns:
                raise DataError(f"{path}: no header row")
            duplicates = sorted({c for c in columns if c and columns.count(c) > 1})
            if duplicates:
                raise DataError(f"{path}: duplicate column {duplicates[0]!r} in the header row")
            for n, row in enumerate(reader, 1):
                if None in row:
                    raise DataError(f"{_where(path, n)}: more values than header columns")
                if None in row.values() and spans_rows(row.values(), len(columns), delimiter):
                    # a short row with a field whose later lines read as whole rows: most likely a quote opened the
                    # field and ran on over the rows after it, but a row that leaves off its last columns and quotes
                    # a multi-line field with such a line reads the same, so the message names both (a short row
                    # alone leaves its missing columns None, as a reader expects, even when a multi-line field holds
                    # a delimiter or two)
                    raise DataError(
                        f"{_where(path, n)}: fewer values than header columns (a later line of one of its fields "
                        f"holds {len(columns) - 1} or more {delimiter!r}, as a whole row does): if a quote was left "
                        "open, that field ran on over the rows after it, so close it; if not, end the row with an "
                        "empty value for each missing column"
                    )
                records.append(row)
        except csv.Error as err:
            where = _where(path, len(records) + 1) if columns else f"{path}, header row"
            raise DataError(f"{where}: malformed CSV ({err})") from None
        return records
    raise DataError(f"{path}: unsupported file type {suffix!r} (use .csv, .tsv, .jsonl or .json)")


def spans_rows(values: Iterable[str | None], columns: int, delimiter: str) -> bool:
    """Whether a field, after a line break, holds a line with a whole row's delimiters: the rows a quote left open
    swallowed (a quoted field's own text seldom holds that many on one line; its first line is the row's own). A
    line break is \\r\\n, \\r or \\n, as the csv module ends rows: cells are read as written, so the rows
    swallowed from a file with \\r\\n or \\r line ends keep them."""
    return any(v and any(line.count(delimiter) >= columns - 1 for line in _LINE_BREAK.split(v)[1:]) for v in values)


def _unreadable(err: Exception) -> str:
    return "nested too deeply" if isinstance(err, RecursionError) else str(err)


def _check_surrogates(record: dict, path: Path, row: int | str) -> None:
    """JSON's \\u escapes can spell half of a UTF-16 surrogate pair, which is no text (a tokenizer rejects it deep
    inside, a UTF-8 writer cannot write it): a DataError naming the field."""
    for field, value in record.items():
        try:
            json.dumps({field: value}, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError as err:
            bad = ord(err.object[err.start])
            raise DataError(
                f"{_where(path, row, field)}: not valid text (an unpaired surrogate \\u{bad:04x})"
            ) from None


def require_text(records: Sequence[dict], path: str | Path, field: str, allow_empty: bool = False) -> list[str]:
    """The string values of ``field`` in every record, or a DataError naming the first bad row."""
    path = Path(path)
    if not records:
        raise DataError(f"{path}: no data rows")
    if not any(field in r for r in records):
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


def json_safe(value: Any) -> Any:
    """``value`` with every non-finite float (NaN, inf) replaced by None: JSON has no NaN, and a file that holds one
    is not valid JSON."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def _dumps(value: Any, **kwargs: Any) -> str:
    return json.dumps(json_safe(value), ensure_ascii=False, allow_nan=False, **kwargs)


def write_records(path: str | Path, records: Iterable[dict]) -> None:
    """Write records as .csv/.tsv/.jsonl/.json (by suffix), atomically: a reader, or a run killed mid-write, sees
    the old file or the complete new one. CSV columns are the union of keys in first-seen order, a list or object
    in a cell is JSON text; NaN is written as null (JSON) or an empty cell (CSV)."""
    path = Path(path)
    records = [json_safe(r) for r in records]
    path.parent.mkdir(parents=True, exist_ok=True)
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".ndjson"):

        def write(tmp: str) -> None:
            with open(tmp, "w", encoding="utf-8") as f:
                for record in records:
                    f.write(_dumps(record) + "\n")

    elif suffix == ".json":

        def write(tmp: str) -> None:
            Path(tmp).write_text(_dumps(records, indent=1), encoding="utf-8")

    elif suffix in (".csv", ".tsv"):

        def write(tmp: str) -> None:
            columns = list(dict.fromkeys(k for r in records for k in r))
            with open(tmp, "w", encoding="utf-8", newline="") as f:
                writer = csv.DictWriter(f, columns, delimiter="\t" if suffix == ".tsv" else ",")
                writer.writeheader()
                writer.writerows(_flat(r) for r in records)

    else:
        raise DataError(f"{path}: unsupported output type {suffix!r} (use .csv, .tsv, .jsonl or .json)")
    atomic_write(path, write)


def _flat(record: dict) -> dict:
    """A record as CSV cells: lists and objects as JSON text (the csv module writes Python's repr, which no JSON
    reader reads back)."""
    return {k: _dumps(v) if isinstance(v, (dict, list)) else v for k, v in record.items()}


def _writable_folder(path: Path, what: str) -> None:
    """The nearest existing folder of ``path`` must be a folder this process may write into."""
    folder = path.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        raise DataError(f"{what} {path}: {folder} is not a folder")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise DataError(f"{what} {path}: no permission to write in {folder}")


def check_output(
    path: str | Path,
    overwrite: bool = False,
    inputs: Sequence[str | Path | None] = (),
    suffixes: Sequence[str] = WRITABLE,
    what: str = "--output",
) -> Path:
    """Check an output file before any work starts: a known suffix, a folder we may write into, not one of the
    ``inputs`` (a file, or a folder: none of its files), and not an existing file unless ``overwrite``. A DataError
    saying what is wrong otherwise."""
    path = Path(path)
    if path.suffix.lower() not in suffixes:
        raise DataError(f"{what} {path}: unsupported output type {path.suffix!r} (use {', '.join(suffixes)})")
    for given in inputs:
        if given is None or not Path(given).exists() or not path.exists():
            continue
        if path.samefile(given):
            raise DataError(f"{what} {path} is the input file {given}; write to another file")
        if Path(given).is_dir() and path.resolve().is_relative_to(Path(given).resolve()):
            raise DataError(f"{what} {path} is a file of the input folder {given}; write to another file")
    if path.is_dir():
        raise DataError(f"{what} {path} is a folder; give a file name")
    if path.exists() and not overwrite:
        raise DataError(f"{what} {path} exists; pass --overwrite to replace it")
    _writable_folder(path, what)
    return path


def _replaced_folder(path: str | Path, what: str) -> Path:
    """The folder that replacing ``path`` whole puts in place: ``.`` and ``..`` resolved, and a symlink's target (the
    link keeps pointing at the new folder; moving the link aside left the target's old contents in use). The current
    folder and every folder that holds it (``/`` too) are refused: moved aside and deleted, it would leave the running
    process and the shell it was started from in a deleted folder (and ``.`` or ``/`` have no name to rename)."""
    try:
        target = Path(path).resolve()
    except (OSError, RuntimeError) as err:  # a symlink loop
        raise DataError(f"{what} {path}: {err}") from None
    try:
        cwd = Path.cwd().resolve()
    except OSError:  # the current folder was deleted (during a long run): nothing of it to protect
        return target
    if target == cwd or target in cwd.parents:
        raise DataError(
            f"{what} {path} is the current folder or holds it ({target}), and it is replaced whole: name a folder "
            f"inside it, e.g. {Path(path) / 'scorer'}"
        )
    return target


def _holds_no_inputs(folder: Path, path: Path, what: str, inputs: Mapping[str, str | Path | None]) -> None:
    """None of ``inputs`` (option name: path, symlinks and ``..`` resolved) may be ``folder`` or lie inside it: the
    run would read it, and then its save, replacing the folder whole, would delete it."""
    for name, given in inputs.items():
        if not given:
            continue
        try:
            where = Path(given).resolve()
        except (OSError, RuntimeError) as err:  # a symlink loop
            raise DataError(f"{name} {given}: {err}") from None
        if where.is_relative_to(folder):
            raise DataError(
                f"{name} {given} is inside {what} {path} ({folder}), which the save replaces whole: it would be "
                f"deleted after the run read it, --overwrite or not; give another {what}, or move it out"
            )


def check_output_dir(
    path: str | Path,
    overwrite: bool = False,
    what: str = "--output_dir",
    whole: bool = True,
    inputs: Mapping[str, str | Path | None] | None = None,
) -> Path:
    """Check an output folder before any work starts: not a file, empty or absent unless ``overwrite``, and in a
    folder we may write into. ``whole``: the folder is replaced whole (``replace_directory``), so what is checked is
    the folder a symlink points at, the current folder (or one holding it) is refused, and so is a folder holding
    one of ``inputs`` (option name: path; what the run reads or keeps, whether it exists yet or not); False for a
    folder that files are written into (a checkpoint folder)."""
    path = Path(path)
    target = _replaced_folder(path, what) if whole else path
    if target.exists() and not target.is_dir():
        raise DataError(f"{what} {path} is a file, not a folder")
    if whole:
        _holds_no_inputs(target, path, what, inputs or {})
    if target.is_dir() and any(target.iterdir()) and not overwrite:
        raise DataError(f"{what} {path} exists and is not empty; pass --overwrite to replace it")
    _writable_folder(target, what)
    return path


def atomic_write(path: Path, write: Callable[[str], object]) -> None:
    """Call ``write(tmp)`` on a temporary file beside ``path``, then move it into place in one step, so that a
    reader (or a run killed mid-write) sees the old file or the new one, never half of one. The file gets the mode
    of the file it replaces, or the umask's (a kill -9 can leave the hidden temporary file behind)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))  # the kernel applies the umask
    mode = (path if path.is_file() else tmp).stat().st_mode & 0o7777
    try:
        write(str(tmp))
        os.chmod(tmp, mode)  # a writer that recreates the file (safetensors does, as 0600) gets the mode back
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def replace_directory(path: str | Path, fill: Callable[[Path], object]) -> Path:
    """Call ``fill(tmp)`` on a fresh folder beside ``path``, then put it in ``path``'s place, so that ``path`` holds
    the old folder or the complete new one (a folder it replaces is moved aside first, then deleted). A symlink's
    target is replaced, beside it (the link then points at the new folder); the current folder is refused (see
    ``check_output_dir``). Returns ``path`` as given."""
    given = Path(path)
    path = _replaced_folder(given, "output folder")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    tmp.mkdir(0o777)  # the kernel applies the umask
    try:
        fill(tmp)
        if path.exists():
            old = path.with_name(f".{path.name}.{secrets.token_hex(4)}.old")
            os.replace(path, old)
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return given

"""The recipe scripts' check of their input paths, made before any work: a missing path ends the script with status 2
and one line on stderr naming that path and what it should hold, where it ended in a traceback from deep inside a
loader (after the output folder was made, or a whole dataset's study had run).

A script imports it with the ``recipes/`` folder on ``sys.path`` (the scripts are run by path, not as modules)."""

from __future__ import annotations

import sys
from collections.abc import Iterable
from pathlib import Path

USAGE = 2  # the status of a user's mistake, as ``pmi-reward`` and argparse exit with

STUDY_DATA = (
    "the PMIScore paper authors' study data (../shared/data/pmiscore beside the checkout: see ../shared/README.md)"
)


def _shown(path: Path) -> str:
    """``path`` as given, and where a relative one points from (the defaults are relative to the working folder)."""
    return str(path) if path.is_absolute() else f"{path} (from {Path.cwd()})"


def require_inputs(prog: str, expected: str, files: Iterable[str | Path], folder: str | Path | None = None) -> None:
    """Exit with status 2 and one stderr line ``PROG: PATH: no such file; EXPECTED`` for the first of ``files`` (under
    ``folder`` when given: a missing ``folder`` is named itself, not each file in it) that is not a file; return when
    all are. ``expected`` says what the option should hold, e.g. ``f"--data_dir should be {STUDY_DATA}"``."""
    problem = None
    if folder is not None and not Path(folder).is_dir():
        kind = "not a folder" if Path(folder).exists() else "no such folder"
        problem = f"{_shown(Path(folder))}: {kind}"
    else:
        for name in files:
            path = Path(folder) / name if folder is not None else Path(name)
            if not path.is_file():
                problem = f"{_shown(path)}: {'not a file' if path.exists() else 'no such file'}"
                break
    if problem is not None:
        print(" ".join(f"{prog}: {problem}; {expected}".split()), file=sys.stderr)
        raise SystemExit(USAGE)

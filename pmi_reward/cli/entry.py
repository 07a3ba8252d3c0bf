"""The ``pmi-reward`` console script: ``pmi_reward.cli.main.main``, with a Ctrl-C or SIGTERM during its import ended
in one line.

The package's ``__init__`` imports its public names lazily, so importing this module does not wait for torch (3-10
s): a Ctrl-C in those seconds (a wrong flag noticed at once) interrupted the console script's own import line: a
traceback of 15-40 lines and the process ended by SIGINT, or, when the KeyboardInterrupt met torch's C++ start-up,
"terminate called after throwing an instance of 'pybind11::error_already_set'" and an abort. This module imports
nothing but ``os``, ``signal`` and ``sys`` before it takes over SIGINT and SIGTERM for the import: either ends the
process at once, with one line on stderr and exit code 130 (Ctrl-C) or 143 (SIGTERM), as ``pmi_reward.cli.main``
ends a command a moment later. Nothing is raised into the import, and an import has written nothing that would need
cleaning up.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from types import FrameType
from typing import Any

__all__ = ["main"]

_WORDS = {signal.SIGINT: "interrupted", signal.SIGTERM: "terminated"}


def _name() -> str:
    """``pmi-reward <command>`` as the command line names it (``pmi-reward`` alone before any command)."""
    first = sys.argv[1] if len(sys.argv) > 1 else ""
    return f"pmi-reward {first}" if first and not first.startswith("-") else "pmi-reward"


def _leave(signum: int, frame: FrameType | None) -> None:
    """End the process now: one line on stderr, exit code 128 + the signal (130, 143), as a shell reports it."""
    os.write(2, f"{_name()}: {_WORDS[signal.Signals(signum)]}\n".encode())
    os._exit(128 + signum)


def main() -> int:
    """Run ``pmi-reward`` on ``sys.argv``; a Ctrl-C or SIGTERM while the package is imported ends the process at once
    (exit code 130 or 143, one line on stderr). A signal its parent set to be ignored (``nohup``, a background job's
    SIGINT) stays ignored."""
    defaults: dict[signal.Signals, Callable[[int, FrameType | None], Any] | signal.Handlers] = {
        signal.SIGINT: signal.default_int_handler,
        signal.SIGTERM: signal.SIG_DFL,
    }
    taken = [sig for sig, default in defaults.items() if signal.getsignal(sig) is default]
    for sig in taken:
        signal.signal(sig, _leave)
    try:
        from pmi_reward.cli.main import main as run
    finally:
        for sig in taken:
            signal.signal(sig, defaults[sig])
    return run()

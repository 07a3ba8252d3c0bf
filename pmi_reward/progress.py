"""Progress bars that suit where they are drawn: ``progress_bar``, what the package's long loops show.

On a terminal (and as a notebook's widget) a bar redraws every 0.1 s, tqdm's default. Written to a file or a CI
log (stderr not a terminal), each redraw is a carriage-return record that a log viewer shows as a line of its
own: at tqdm's default about ten a second (some 25,000 lines for a 40-minute scorer training). There a bar
redraws every ``LOG_INTERVAL`` seconds.

The user's tqdm environment variables win, read at each bar (tqdm reads its own once, when imported, and an
argument the caller gives, as ``disable=not progress`` is here, overrode them): ``TQDM_MININTERVAL`` sets the
seconds between redraws everywhere, and ``TQDM_DISABLE=1`` turns the bars off.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from typing import IO, Any

from tqdm.auto import tqdm

__all__ = ["TTY_INTERVAL", "LOG_INTERVAL", "progress_bar", "redraw_interval", "bars_disabled"]

TTY_INTERVAL = 0.1  # seconds between redraws on a terminal (tqdm's default)
LOG_INTERVAL = 30.0  # seconds between redraws in a file or a CI log: a line every 30 s, not ten a second
TQDM_MAXINTERVAL = 10.0  # tqdm's default maxinterval: its monitor thread forces a redraw after that long

_OFF = {"", "0", "false", "no", "off"}
# tqdm.auto's bar is a notebook widget inside Jupyter, whose stderr is no terminal but shows the bar live
_WIDGET = any(c.__module__ == "tqdm.notebook" for c in tqdm.__mro__)


def _is_tty(stream: IO[str] | None) -> bool:
    """Whether ``stream`` is a terminal (a closed or replaced stream without ``isatty`` is not)."""
    try:
        return bool(stream is not None and stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


def redraw_interval(stream: IO[str] | None = None) -> float:
    """Seconds between a bar's redraws on ``stream`` (by default stderr, where tqdm draws): ``TQDM_MININTERVAL``
    when set to a number, else ``TTY_INTERVAL`` on a terminal (or a notebook's widget) and ``LOG_INTERVAL``
    elsewhere."""
    given = os.environ.get("TQDM_MININTERVAL", "").strip()
    if given:
        try:
            return max(0.0, float(given))
        except ValueError:
            pass  # not a number: as if unset (tqdm keeps such a value as a string, and fails on it)
    live = _is_tty(sys.stderr if stream is None else stream) or (_WIDGET and stream is None)
    return TTY_INTERVAL if live else LOG_INTERVAL


def bars_disabled() -> bool:
    """Whether ``TQDM_DISABLE`` asks for no bars (set to anything but empty, 0, false, no or off)."""
    return os.environ.get("TQDM_DISABLE", "").strip().lower() not in _OFF


def progress_bar(iterable: Iterable[Any] | None = None, desc: str | None = None, **kwargs: Any) -> tqdm:
    """``tqdm(iterable, desc, **kwargs)`` redrawn every ``redraw_interval()`` seconds on its stream (``file``,
    stderr by default) unless the caller gives ``mininterval``, and off under ``TQDM_DISABLE``. A redraw interval
    above tqdm's ``maxinterval`` raises that too: its monitor thread would otherwise redraw a fast bar every 10 s."""
    interval = kwargs.setdefault("mininterval", redraw_interval(kwargs.get("file")))
    kwargs.setdefault("maxinterval", max(TQDM_MAXINTERVAL, interval))
    if bars_disabled():
        kwargs["disable"] = True
    return tqdm(iterable, desc, **kwargs)

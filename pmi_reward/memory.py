"""``peak_rss_mib``: this process's peak memory in one unit on every POSIX system, in a module that imports only the
standard library (the benchmarks that report it measure their own imports too)."""

from __future__ import annotations

import resource
import sys

__all__ = ["peak_rss_mib"]


def peak_rss_mib() -> float:
    """This process's peak resident memory so far, in MiB (the figure a run's summary and provenance record).

    ``ru_maxrss`` counts kilobytes on Linux but bytes on macOS, where the Linux arithmetic (``/ 1024``) gave KiB
    labelled MiB, a figure 1024 times too large."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024

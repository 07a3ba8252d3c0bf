"""Generic replies: stock phrases that fit any context, which an engagement reward must not pay for.

``GENERIC_PROBES`` is the fixed list the scorer recipes and tests score against real contexts: a PMI reward
should put them near 0 nats or below (they are as likely after any context as after this one), and below the
true reply.
"""

from __future__ import annotations

__all__ = ["GENERIC_PROBES"]

GENERIC_PROBES: tuple[str, ...] = (
    "That's interesting.",
    "ok",
    "lol",
    "Yes.",
    "I don't know.",
    "Cool.",
    "Haha",
    "That's nice.",
    "Really?",
    "I see.",
)

"""A length-neutral PMI reward: PMI minus the PMI a reply of that length is expected to get.

PMI grows with what a reply says, and a longer reply can say more; a policy rewarded with raw PMI can buy
reward with length alone. ``LengthBaseline`` is the reward scorer's own mean PMI of human replies, binned by
their length in words (fitted without any judge, on the human replies of the policy's training prompts:
``pmi_reward.policy.trainers`` does it with ``--length_neutral``); with ``RewardOptions.length_baseline`` set to
its file, the reward path subtracts the baseline at each reply's length (linear between bin centres, flat
beyond the ends) before centring and scaling. A longer reply then earns more only if it is more informative
than human replies of that length usually are.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from ..data.records import atomic_write

__all__ = ["LengthBaseline", "reply_words", "fit_length_baseline"]


def reply_words(text: str) -> int:
    """A reply's length in whitespace-separated words (the baseline's unit)."""
    return len(text.split())


@dataclass(frozen=True)
class LengthBaseline:
    """Mean PMI of human replies by length: bin centres (mean words), the mean PMI and the count in each bin."""

    lengths: tuple[float, ...]
    pmi: tuple[float, ...]
    counts: tuple[int, ...]
    source: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.lengths or not (len(self.lengths) == len(self.pmi) == len(self.counts)):
            raise ValueError("a length baseline needs one or more bins, with a length, a PMI and a count each")
        if any(b <= a for a, b in zip(self.lengths, self.lengths[1:], strict=False)):
            raise ValueError("length baseline bins must have increasing lengths")
        if not all(math.isfinite(v) for v in (*self.lengths, *self.pmi)):
            raise ValueError("length baseline values must be finite")

    def expected(self, n_words: Sequence[float] | np.ndarray) -> np.ndarray:
        """The expected PMI at each length (linear between bin centres, flat beyond the first and last)."""
        return np.interp(np.asarray(n_words, dtype=np.float64), self.lengths, self.pmi)

    def save(self, path: str | Path) -> Path:
        """Write the baseline to ``path`` in one step (a temporary file moved into place), so that no reader ever
        sees a half-written file (under DDP the main process writes it and the other ranks then read it)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps({"unit": "words", **asdict(self)}, indent=1)
        atomic_write(path, lambda tmp: Path(tmp).write_text(text))
        return path

    @classmethod
    def load(cls, path: str | Path) -> LengthBaseline:
        """Read a baseline file; a clear error naming the file when it is missing or malformed."""
        try:
            data = json.loads(Path(path).read_text())
            return cls(tuple(data["lengths"]), tuple(data["pmi"]), tuple(data["counts"]), data.get("source") or {})
        except FileNotFoundError:
            raise FileNotFoundError(f"length_baseline {path}: no such file") from None
        except (ValueError, KeyError, TypeError) as err:
            raise ValueError(f"length_baseline {path}: not a length baseline ({err})") from None


def fit_length_baseline(
    pmi: Sequence[float] | np.ndarray, replies: Sequence[str], bins: int = 10, source: dict | None = None
) -> LengthBaseline:
    """Mean PMI of ``replies`` (human replies, scored by the reward scorer) in ``bins`` length-quantile bins."""
    values = np.asarray(pmi, dtype=np.float64)
    lengths = np.array([reply_words(r) for r in replies], dtype=np.float64)
    if len(values) != len(lengths):
        raise ValueError(f"got {len(values)} scores but {len(lengths)} replies")
    keep = np.isfinite(values) & (lengths > 0)
    values, lengths = values[keep], lengths[keep]
    if not len(values):
        raise ValueError("no scored, non-empty replies to fit a length baseline on")
    edges = np.unique(np.quantile(lengths, np.linspace(0, 1, bins + 1)[1:-1]))
    which = np.digitize(lengths, edges, right=True)
    centres, means, counts = [], [], []
    for b in np.unique(which):
        inside = which == b
        centres.append(float(lengths[inside].mean()))
        means.append(float(values[inside].mean()))
        counts.append(int(inside.sum()))
    return LengthBaseline(tuple(centres), tuple(means), tuple(counts), dict(source or {}, replies=int(len(values))))

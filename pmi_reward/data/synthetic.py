"""Synthetic dialogue data with known PMI: joint distributions over prototype contexts and responses.

A joint p(x, y) over ``size`` x ``size`` prototype indices is built from a structure (``diagonal``: each
context has its own response; ``block``: four topics, any response of the topic fits; ``independent``:
no relation) weighted by Dirichlet marginals, as in the PMIScore paper. Pairs sampled from it carry
the analytic PMI log p(x, y) - log p(x) - log p(y), so an estimator can be checked against the truth
without any LLM. Prototype strings stand in for the texts; an optional paraphraser (any callable, e.g.
an LLM, or the built-in ``light_paraphrase``) fills the ``*_paraphrased`` columns.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .records import write_records

__all__ = [
    "KINDS",
    "PROTOTYPES",
    "JointDistribution",
    "make_joint",
    "sample_pairs",
    "make_records",
    "light_paraphrase",
    "write_splits",
    "true_pmi",
]

KINDS = ("diagonal", "block", "independent")

_MOODS = [
    "happy",
    "sad",
    "angry",
    "nervous",
    "relaxed",
    "bored",
    "upset",
    "calm",
    "excited",
    "tired",
    "anxious",
    "cheerful",
    "disappointed",
    "proud",
    "sleepy",
    "thrilled",
    "shy",
    "lonely",
    "grateful",
    "confused",
]
_CITIES = [
    "Lisbon",
    "Cairo",
    "Lima",
    "Oslo",
    "Hanoi",
    "Nairobi",
    "Quebec",
    "Krakow",
    "Havana",
    "Seville",
    "Kyoto",
    "Bergen",
    "Tbilisi",
    "Porto",
    "Valletta",
    "Hobart",
    "Bruges",
    "Cusco",
    "Riga",
    "Zanzibar",
]
_DISHES = [
    "lasagna",
    "falafel",
    "paella",
    "ramen",
    "goulash",
    "pho",
    "risotto",
    "tacos",
    "curry",
    "pierogi",
    "gnocchi",
    "kimchi",
    "moussaka",
    "couscous",
    "tempura",
    "borscht",
    "ceviche",
    "dumplings",
    "crepes",
    "biryani",
]
_TOPICS = {  # block structure: 4 topics x 5 contexts, and 5 responses that fit any context of the topic
    "travel": (
        [f"I am flying to {c}." for c in ["Rome", "Seoul", "Mexico City", "Vienna", "Cape Town"]],
        [
            "Have a safe flight!",
            "Don't forget your passport.",
            "Send me pictures of the sights.",
            "A new city is always an adventure.",
            "Try the local food while you are there.",
        ],
    ),
    "study": (
        [f"I have an exam in {s}." for s in ["algebra", "geology", "economics", "French", "anatomy"]],
        [
            "Good luck with your revision!",
            "Flashcards always helped me study.",
            "Make sure you sleep well the night before.",
            "You have prepared well, you will pass.",
            "Studying with friends can make it easier.",
        ],
    ),
    "sport": (
        [f"I started training for {s}." for s in ["a marathon", "rowing", "boxing", "climbing", "a triathlon"]],
        [
            "Remember to stretch before practice.",
            "Staying active keeps you healthy.",
            "Drink plenty of water while training.",
            "Rest days matter as much as workouts.",
            "A coach can help you improve faster.",
        ],
    ),
    "weather": (
        [f"It is {w} outside today." for w in ["stormy", "foggy", "freezing", "scorching", "humid"]],
        [
            "Dress for the weather before you go out.",
            "Maybe stay in with a good book.",
            "Check the forecast for tomorrow too.",
            "Weather like this changes my plans.",
            "At least the seasons keep things interesting.",
        ],
    ),
}

PROTOTYPES: dict[str, tuple[list[str], list[str]]] = {
    "diagonal": ([f"I feel {m} today." for m in _MOODS], [f"It sounds like you are {m}." for m in _MOODS]),
    "block": ([c for cs, _ in _TOPICS.values() for c in cs], [r for _, rs in _TOPICS.values() for r in rs]),
    "independent": ([f"Have you ever been to {c}?" for c in _CITIES], [f"I could eat {d} every day." for d in _DISHES]),
}


@dataclass(frozen=True)
class JointDistribution:
    """p(x, y) with its marginals; ``pmi`` is the analytic log p(x, y) - log p(x) - log p(y)."""

    kind: str
    p_xy: np.ndarray
    p_x: np.ndarray
    p_y: np.ndarray

    @property
    def pmi(self) -> np.ndarray:
        with np.errstate(divide="ignore"):
            return np.log(self.p_xy) - np.log(self.p_x)[:, None] - np.log(self.p_y)[None, :]


def make_joint(
    kind: str,
    size: int = 20,
    alpha: float = 1.0,
    noise: float = 0.2,
    exact: bool = False,
    seed: int | np.random.Generator = 0,
) -> JointDistribution:
    """A random joint of the given structure, weighted by Dirichlet(alpha) marginals, then renormalised.

    Structure weights are uniform random on the diagonal / in the four diagonal blocks / everywhere
    (``independent``, as in the paper, so its PMI is small but not zero), plus ``noise`` times their mean
    everywhere. ``exact=True`` drops both random parts: ``independent`` becomes p(x) p(y) exactly
    (PMI = 0) and the others have zero mass off their structure.
    """
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    if kind == "block" and size % 4:
        raise ValueError("the block structure needs a size divisible by 4")
    rng = np.random.default_rng(seed)
    px, py = rng.dirichlet([alpha] * size), rng.dirichlet([alpha] * size)
    base: np.ndarray
    if kind == "diagonal":
        base = np.diag(np.ones(size) if exact else rng.random(size))
    elif kind == "block":
        b = size // 4
        base = np.kron(np.eye(4), np.ones((b, b)))
        if not exact:
            base = base * rng.random((size, size))
    else:
        base = np.ones((size, size)) if exact else rng.random((size, size))
    if not exact and noise > 0:
        base = base + rng.random((size, size)) * noise * base.mean()
    joint = base * px[:, None] * py[None, :]
    joint /= joint.sum()
    return JointDistribution(kind, joint, joint.sum(axis=1), joint.sum(axis=0))


def sample_pairs(
    joint: JointDistribution, n: int, seed: int | np.random.Generator = 0
) -> tuple[np.ndarray, np.ndarray]:
    """``n`` (x, y) index pairs drawn i.i.d. from the joint."""
    rng = np.random.default_rng(seed)
    flat = rng.choice(joint.p_xy.size, size=n, p=joint.p_xy.ravel())
    return np.divmod(flat, joint.p_xy.shape[1])


_OPENERS = ["", "", "Well, ", "Honestly, ", "You know, ", "So, "]
_CLOSERS = ["", "", " :)", "!", " Really.", " Just saying."]


def light_paraphrase(text: str, rng: np.random.Generator) -> str:
    """A cheap, LLM-free surface variation: an optional opener and closer around the prototype."""
    opener, closer = _OPENERS[rng.integers(len(_OPENERS))], _CLOSERS[rng.integers(len(_CLOSERS))]
    body = text[0].lower() + text[1:] if opener else text
    if closer and body.endswith((".", "!", "?")) and closer[0] in ".!":
        body = body[:-1]
    return opener + body + closer


def _prototype(kind: str, side: int, i: int) -> str:
    texts = PROTOTYPES[kind][side]
    return texts[i] if i < len(texts) else f"{'Context' if side == 0 else 'Response'} prototype {i}."


def make_records(
    joint: JointDistribution, n: int, seed: int = 0, paraphrase: Callable[[str, np.random.Generator], str] | None = None
) -> list[dict]:
    """``n`` sampled pairs as rows with the shared CSV columns (``x_id, y_id, context, response, p_xy, p_x,
    p_y, context_paraphrased, response_paraphrased``); without a paraphraser the paraphrases are the texts."""
    topics = len(PROTOTYPES["block"][0])
    if joint.kind == "block" and joint.p_xy.shape[0] != topics:
        raise ValueError(
            f"block texts come in 4 topics of {topics // 4}: a block joint of size {joint.p_xy.shape[0]} would "
            f"pair them against its structure (use size {topics})"
        )
    rng = np.random.default_rng(seed)
    xs, ys = sample_pairs(joint, n, rng)
    rows = []
    for x, y in zip(xs.tolist(), ys.tolist(), strict=True):
        context, response = _prototype(joint.kind, 0, x), _prototype(joint.kind, 1, y)
        rows.append(
            {
                "x_id": x,
                "y_id": y,
                "context": context,
                "response": response,
                "p_xy": float(joint.p_xy[x, y]),
                "p_x": float(joint.p_x[x]),
                "p_y": float(joint.p_y[y]),
                "context_paraphrased": paraphrase(context, rng) if paraphrase else context,
                "response_paraphrased": paraphrase(response, rng) if paraphrase else response,
            }
        )
    return rows


def write_splits(
    kind: str,
    out_dir: str | Path,
    n: int = 5000,
    fractions: tuple[float, float, float] = (0.6, 0.2, 0.2),
    seed: int = 0,
    paraphrase: Callable[[str, np.random.Generator], str] | None = None,
    **joint_kwargs,
) -> dict[str, Path]:
    """Sample one joint and write ``train/val/test.csv`` under ``out_dir/kind`` (the shared data layout)."""
    joint = make_joint(kind, seed=seed, **joint_kwargs)
    rows = make_records(joint, n, seed + 1, paraphrase)
    cuts = np.cumsum([int(round(f * n)) for f in fractions[:2]])
    parts = {"train": rows[: cuts[0]], "val": rows[cuts[0] : cuts[1]], "test": rows[cuts[1] :]}
    paths = {}
    for name, part in parts.items():
        paths[name] = Path(out_dir) / kind / f"{name}.csv"
        write_records(paths[name], part)
    return paths


def true_pmi(p_xy, p_x, p_y) -> np.ndarray:
    """Analytic PMI of rows from their probability columns."""
    return (
        np.log(np.asarray(p_xy, dtype=np.float64))
        - np.log(np.asarray(p_x, dtype=np.float64))
        - np.log(np.asarray(p_y, dtype=np.float64))
    )

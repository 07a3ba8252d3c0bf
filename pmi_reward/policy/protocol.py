"""The evaluation protocol on Chit-Chat: which dialogues train the scorers, the policy, the tuning and the finals.

Dialogues are indices into ``load_dialogues("chitchat")`` (4,017 dialogues with two or more turns):

| band | dialogues | used for |
|---|---|---|
| scorers | 0-1999 | reward and judge scorers |
| policy | 2000-3399 | policy-training prompts |
| tune | 3400-3699 | evaluation while hyper-parameters are tuned |
| heldout | 3700- | the final evaluation, once per final run |

``entries`` reads the dialogue ranges a command's parsed options use (a scorer's training dialogues, a policy's
prompts, an evaluation's contexts); ``problems`` checks a set of them against the bands and against each
other (the test suite runs it on every shipped and recipe config); ``run_warnings`` checks, at evaluation time,
the judges' and the reward's training dialogues (from their metadata) and the tuned policies' prompts (from
their ``run_summary.json``) against the evaluation contexts.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["CORPUS", "BANDS", "Span", "Entry", "span", "overlaps", "inside", "entries", "problems", "run_warnings"]

CORPUS = "chitchat"
BANDS: dict[str, tuple[int, int | None]] = {
    "scorers": (0, 2000),
    "policy": (2000, 3400),
    "tune": (3400, 3700),
    "heldout": (3700, None),
}

Span = tuple[int, int | None]  # [first, stop), stop None: to the end


@dataclass(frozen=True)
class Entry:
    """One use of a dialogue range: where it is declared, for what (scorer | policy | evaluation), and the range."""

    source: str
    role: str
    corpus: str
    span: Span


def span(first: int, count: int | None) -> Span:
    """The range of ``count`` dialogues from ``first`` (None: to the end)."""
    return first, (first + count) if count else None


def overlaps(a: Span, b: Span) -> bool:
    a_stop, b_stop = a[1] if a[1] is not None else float("inf"), b[1] if b[1] is not None else float("inf")
    return a[0] < b_stop and b[0] < a_stop


def inside(a: Span, band: Span) -> bool:
    stop, band_stop = a[1] if a[1] is not None else float("inf"), band[1] if band[1] is not None else float("inf")
    return band[0] <= a[0] and stop <= band_stop


def _fmt(s: Span) -> str:
    return f"{s[0]}-{s[1] - 1}" if s[1] is not None else f"{s[0]}-end"


def entries(source: str, parsed: Iterable[Any]) -> list[Entry]:
    """The dialogue ranges in one command's parsed options (dataclass instances)."""
    from ..training.job import TrainData
    from .evaluate import EvalPromptArguments
    from .prompts import PromptArguments

    out = []
    for args in parsed:
        if isinstance(args, TrainData) and args.dialogues:
            out.append(Entry(source, "scorer", args.dialogues, span(args.skip_dialogues, args.max_dialogues)))
        elif isinstance(args, PromptArguments) and not args.prompt_file:
            role = "evaluation" if isinstance(args, EvalPromptArguments) else "policy"
            out.append(Entry(source, role, args.dialogues, span(args.first_dialogue, args.max_dialogues)))
    return out


def _band_problems(e: Entry) -> list[str]:
    if e.corpus != CORPUS:
        return []
    if e.role == "scorer" and not inside(e.span, BANDS["scorers"]):
        return [f"{e.source}: scorer dialogues {_fmt(e.span)} outside {_fmt(BANDS['scorers'])}"]
    if e.role == "policy" and not inside(e.span, BANDS["policy"]):
        return [f"{e.source}: policy prompts {_fmt(e.span)} outside {_fmt(BANDS['policy'])}"]
    if e.role == "evaluation" and not (inside(e.span, BANDS["tune"]) or inside(e.span, BANDS["heldout"])):
        return [f"{e.source}: evaluation contexts {_fmt(e.span)} neither inside tune nor inside heldout"]
    return []


def problems(all_entries: Sequence[Entry]) -> list[str]:
    """Every violation of the protocol: a range outside its band, or two ranges of different roles (or a tuning
    and a held-out evaluation) that share dialogues."""
    found = [p for e in all_entries for p in _band_problems(e)]
    for i, a in enumerate(all_entries):
        for b in all_entries[i + 1 :]:
            if a.corpus != b.corpus or not overlaps(a.span, b.span):
                continue
            tune_vs_heldout = (
                a.role == b.role == "evaluation"
                and a.corpus == CORPUS
                and inside(a.span, BANDS["tune"]) != inside(b.span, BANDS["tune"])
            )
            if a.role != b.role or tune_vs_heldout:
                found.append(
                    f"{a.source} ({a.role} {_fmt(a.span)}) and {b.source} ({b.role} {_fmt(b.span)}) share dialogues"
                )
    return found


def run_warnings(evaluation: Entry, scorer_metas: dict[str, dict], policy_summaries: dict[str, dict]) -> list[str]:
    """Warnings for an evaluation whose contexts a judge, the reward or a tuned policy has seen in training."""
    from .panel import training_range

    out = []
    for name, meta in scorer_metas.items():
        seen = training_range(meta)
        if seen and seen[0] == evaluation.corpus and overlaps((seen[1], seen[2]), evaluation.span):
            out.append(f"scorer {name} was trained on dialogues {seen[1]}-{seen[2] - 1}: they overlap the evaluation's")
    for name, summary in policy_summaries.items():
        prompts = summary.get("prompts") or {}
        if prompts.get("dialogues") == evaluation.corpus and not prompts.get("prompt_file"):
            trained = span(int(prompts.get("first_dialogue") or 0), prompts.get("max_dialogues"))
            if overlaps(trained, evaluation.span):
                out.append(f"policy {name} was trained on prompts from dialogues {_fmt(trained)}: they overlap")
    return out

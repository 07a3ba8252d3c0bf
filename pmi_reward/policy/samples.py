"""The generations behind an evaluation, to read: ``samples.jsonl`` (every reply of every policy with each judge's
PMI, its length in tokens and whether it was cut) and ``samples.md`` (the first contexts, each with the base's,
every policy's first reply and the human reply side by side)."""

from __future__ import annotations

import json
from pathlib import Path

from ..data.conversation import prompt_to_context
from .sampling import Replies

HUMAN = "human reference"  # the human reply's row, written beside the policies' rows

__all__ = ["sample_records", "samples_markdown", "write_samples", "read_samples"]


def sample_records(result: dict, references: list[str] | None) -> list[dict]:
    """One record per context: the context, the human reply, and per policy its replies with scores."""
    replies, scores = result["replies"], result["scores"]
    counts = {name: rep.token_counts() for name, rep in replies.items()}
    records = []
    for i, context in enumerate(result["contexts"]):
        record: dict = {"context": context}
        if references is not None:
            record["reference"] = references[i]
        for name, rep in replies.items():
            record[name] = [
                {
                    "reply": text,
                    "pmi": {j: round(float(by[name][i][k]), 3) for j, by in scores.items()},
                    "tokens": counts[name][i][k],
                    "cut": bool(rep.truncated[i][k]),
                }
                for k, text in enumerate(rep.texts[i])
            ]
        records.append(record)
    return records


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|") or "*(empty)*"


def samples_markdown(result: dict, prompts: list, n_contexts: int = 30) -> str:
    """The first ``n_contexts`` contexts with each policy's first reply (PMI by every judge) side by side."""
    judges = list(result["scores"])
    parts = [
        f"# Sampled replies, side by side\n\nThe first {min(n_contexts, len(prompts))} evaluation contexts (fixed by "
        "the evaluation's config), each policy's first sampled reply, and the human reply. PMI in nats by "
        f"judge ({', '.join(judges)}); *cut*: the reply hit the token limit.\n"
    ]
    for i in range(min(n_contexts, len(prompts))):
        turns = (prompt_to_context(prompts[i]) or "").split("\n")
        context = "\n".join(f"> {t}" for t in turns)
        lines = [f"## {i + 1}\n\n{context}\n", f"| policy | reply | PMI ({' / '.join(judges)}) |", "|---|---|---|"]
        for name, rep in result["replies"].items():
            pmi = " / ".join(f"{result['scores'][j][name][i][0]:+.2f}" for j in judges)
            cut = " *(cut)*" if rep.truncated[i][0] else ""
            lines.append(f"| {name} | {_cell(rep.texts[i][0])}{cut} | {pmi} |")
        parts.append("\n".join(lines) + "\n")
    return "\n".join(parts)


def write_samples(out: Path, result: dict, prompts: list, references: list[str] | None, n_contexts: int) -> None:
    """Write ``samples.jsonl`` and ``samples.md`` into ``out``."""
    with (out / "samples.jsonl").open("w") as f:
        for record in sample_records(result, references):
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
    (out / "samples.md").write_text(samples_markdown(result, prompts, n_contexts))


def _text(value: object, what: str) -> str:
    """A samples record's text field (``str()`` would read a null or a number as the text "None" or "3")."""
    if not isinstance(value, str):
        raise ValueError(f"{what}: expected text, got {type(value).__name__}")
    return value


def read_samples(path: str | Path) -> tuple[list[str], list[str] | None, dict[str, Replies]]:
    """A ``samples.jsonl`` read back for judging again: the contexts, the human replies (None when absent) and
    each policy's replies (texts, token counts, cut flags) in the file's order, the base first."""
    contexts: list[str] = []
    references: list[str | None] = []
    replies: dict[str, Replies] = {}
    counts: dict[str, list[list[int]]] = {}
    with Path(path).open() as f:
        lines = [(n, line) for n, line in enumerate(f, 1) if line.strip()]
    if not lines:
        raise ValueError(f"{path}: no samples")
    for n, line in lines:
        try:
            record = json.loads(line)
            contexts.append(_text(record["context"], "context"))
            references.append(record.get("reference"))
            names = [k for k in record if k not in ("context", "reference")]
            if not [k for k in names if k != HUMAN]:
                raise ValueError("no policy's replies (a policy name with its list of replies)")
            if replies and names != list(replies):
                raise ValueError(f"policies {names} differ from the first row's {list(replies)}")
            for name in names:
                rep = replies.setdefault(name, Replies([], [], [], counts.setdefault(name, [])))
                if not record[name]:
                    raise ValueError(f"{name}: no replies")
                if rep.texts and len(record[name]) != len(rep.texts[0]):
                    raise ValueError(f"{name}: {len(record[name])} replies, the first row {len(rep.texts[0])}")
                rep.texts.append([_text(r["reply"], f"{name} reply") for r in record[name]])
                rep.tokens.append([[] for _ in record[name]])
                counts[name].append([int(r["tokens"]) for r in record[name]])
                rep.truncated.append([bool(r["cut"]) for r in record[name]])
        except (ValueError, KeyError, TypeError) as err:
            raise ValueError(f"{path}, row {n}: not a samples record ({type(err).__name__}: {err})") from err
    return contexts, None if None in references else [str(r) for r in references], replies

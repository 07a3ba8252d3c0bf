"""The generations behind an evaluation, to read: ``samples.jsonl`` (every reply of every policy with each judge's
PMI, null where the judge left it unscored, its length in tokens and whether it was cut) and ``samples.md`` (the
first contexts, each with the base's, every policy's first reply and the human reply side by side)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from .sampling import Replies

HUMAN = "human reference"  # the human reply's row, written beside the policies' rows

__all__ = [
    "policy_width",
    "judge_scores",
    "sample_records",
    "samples_markdown",
    "merge_records",
    "write_samples",
    "write_records",
    "read_samples",
]


def policy_width(replies: dict[str, Replies], base: str) -> int | None:
    """Replies per context of the tuned policies (the first one's; None without one): the base may have more
    (``--base_samples``), best-of-n rows and the human reply their own."""
    tuned = [r for n, r in replies.items() if n not in (base, HUMAN) and not n.startswith("best-of-") and r.texts]
    return len(tuned[0].texts[0]) if tuned else None


def judge_scores(records: list[dict], policy: str, judge: str) -> np.ndarray:
    """(contexts, replies) PMI of ``policy``'s replies by ``judge``, from ``samples.jsonl`` records (NaN where the
    judge left a reply unscored: null)."""
    return np.array([[s["pmi"][judge] for s in record[policy]] for record in records], dtype=np.float64)


def _pmi(value: float) -> float | None:
    """A judge's PMI as written to ``samples.jsonl``: 3 decimals; null where it left the reply unscored (JSON has
    no NaN)."""
    return round(float(value), 3) if math.isfinite(value) else None


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
                    "pmi": {j: _pmi(by[name][i][k]) for j, by in scores.items()},
                    "tokens": counts[name][i][k],
                    "cut": bool(rep.truncated[i][k]),
                }
                for k, text in enumerate(rep.texts[i])
            ]
        records.append(record)
    return records


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|") or "*(empty)*"


def samples_markdown(records: list[dict], n_contexts: int = 30) -> str:
    """The first ``n_contexts`` records (``sample_records``) with each policy's first reply (PMI by every judge) side
    by side."""
    shown = records[:n_contexts]
    policies = [k for k in shown[0] if k not in ("context", "reference")] if shown else []
    judges = list(shown[0][policies[0]][0]["pmi"]) if policies else []
    parts = [
        f"# Sampled replies, side by side\n\nThe first {len(shown)} evaluation contexts (fixed by "
        "the evaluation's config), each policy's first sampled reply, and the human reply. PMI in nats by "
        f"judge ({', '.join(judges)}); *cut*: the reply hit the token limit.\n"
    ]
    for i, record in enumerate(shown):
        context = "\n".join(f"> {t}" for t in record["context"].split("\n"))
        lines = [f"## {i + 1}\n\n{context}\n", f"| policy | reply | PMI ({' / '.join(judges)}) |", "|---|---|---|"]
        for name in policies:
            first = record[name][0]
            pmi = " / ".join("–" if first["pmi"][j] is None else f"{first['pmi'][j]:+.2f}" for j in judges)
            cut = " *(cut)*" if first["cut"] else ""
            lines.append(f"| {name} | {_cell(first['reply'])}{cut} | {pmi} |")
        parts.append("\n".join(lines) + "\n")
    return "\n".join(parts)


def _same_pmi(a: float | None, b: float | None, tolerance: float = 5e-3) -> bool:
    """Whether two PMI of one reply agree (both unscored, or within ``tolerance``): they are written rounded to 3
    decimals, and one judge's score of a reply moves slightly with the batch around it (float32 sums), so one reply
    can be written one rounding step apart in two runs; another judge under the same name differs by far more."""
    if a is None or b is None or not (math.isfinite(a) and math.isfinite(b)):
        return (a is None or not math.isfinite(a)) and (b is None or not math.isfinite(b))
    return abs(a - b) <= tolerance


def merge_records(
    first: list[dict],
    second: list[dict],
    base: str = "base",
    names: tuple[str, str] = ("the first evaluation", "the second evaluation"),
) -> list[dict]:
    """Two evaluations' records as one, ``second``'s policies added to ``first``'s, the human reply last. Only for
    evaluations of the same contexts whose base replies are the same (the same config and seeds), so that every row
    compares like for like; a judge's PMI is kept only where both evaluations ran that judge, and only when it is
    the same judge: one that gives the shared base replies another PMI in each (another scorer under the same name)
    is refused with a ValueError naming it and both evaluations (``names``: their files)."""
    if len(first) != len(second):
        raise ValueError(f"merge_records: {len(first)} contexts against {len(second)}")
    merged = []
    for i, (a, b) in enumerate(zip(first, second, strict=True), 1):
        if a["context"] != b["context"] or a.get("reference") != b.get("reference"):
            raise ValueError(f"merge_records: context {i} differs between the two evaluations")
        if base not in a or base not in b or [r["reply"] for r in a[base]] != [r["reply"] for r in b[base]]:
            raise ValueError(f"merge_records: context {i}: the base's replies differ (another config or seed?)")
        clash = (set(a) & set(b)) - {"context", "reference", base, HUMAN}
        if clash:
            raise ValueError(f"merge_records: both evaluations hold policies {sorted(clash)}")
        record = {k: v for k, v in a.items() if k != HUMAN}
        record.update({k: v for k, v in b.items() if k not in record and k != HUMAN})
        if HUMAN in a:
            record[HUMAN] = a[HUMAN]
        merged.append(record)
    judges = set(first[0][base][0]["pmi"]) & set(second[0][base][0]["pmi"]) if merged else set()
    for judge in sorted(judges):
        for i, (a, b) in enumerate(zip(first, second, strict=True), 1):
            for k, (x, y) in enumerate(zip(a[base], b[base], strict=True), 1):
                if not _same_pmi(x["pmi"].get(judge), y["pmi"].get(judge)):
                    raise ValueError(
                        f"merge_records: judge {judge!r} gives the same base reply (context {i}, reply {k}) PMI "
                        f"{x['pmi'].get(judge)} in {names[0]} but {y['pmi'].get(judge)} in {names[1]}: another "
                        "judge under the same name (rename one, or judge both again with one panel)"
                    )
    for record in merged:
        for name in [k for k in record if k not in ("context", "reference")]:
            record[name] = [r | {"pmi": {j: v for j, v in r["pmi"].items() if j in judges}} for r in record[name]]
    return merged


def write_samples(out: Path, result: dict, references: list[str] | None, n_contexts: int) -> None:
    """Write ``samples.jsonl`` and ``samples.md`` into ``out``."""
    write_records(out, sample_records(result, references), n_contexts)


def write_records(out: Path, records: list[dict], n_contexts: int) -> None:
    """``samples.jsonl`` (every record) and ``samples.md`` (the first ``n_contexts``) into ``out``."""
    # replies are written raw (ensure_ascii=False): UTF-8, whatever the locale (LC_ALL=C could not encode them)
    with (out / "samples.jsonl").open("w", encoding="utf-8") as f:
        for record in records:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
    (out / "samples.md").write_text(samples_markdown(records, n_contexts), encoding="utf-8")


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
    try:
        with Path(path).open(encoding="utf-8") as f:  # as write_records writes it, whatever the locale
            lines = [(n, line) for n, line in enumerate(f, 1) if line.strip()]
    except UnicodeDecodeError as err:
        raise ValueError(f"{path}: not UTF-8 text ({err.reason}), as samples files are written") from None
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

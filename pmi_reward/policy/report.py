"""How a policy evaluation is shown: the judges and what they share with the reward, the panel's gains with a
verdict per policy, the reward-hacking diagnostics, and the gain inside reply-length bins.

``write_report`` writes ``results.md`` (these tables) and ``results.json`` (the rows and the run's settings; a
statistic with no value, NaN, is null there: JSON has no NaN).
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ..data.records import json_safe
from ..evaluation.report import markdown_table
from .panel import Judge, describe
from .samples import policy_width

__all__ = [
    "judges_table",
    "panel_table",
    "diagnostics_table",
    "bins_table",
    "report_text",
    "context_source",
    "write_report",
]


def _ci(row: dict, key: str, lo: str, hi: str) -> str:
    """``+0.12 [-0.03, +0.27]``; blank where there is no estimate (e.g. the length-adjusted gain when reply length
    and policy cannot be told apart), ``[–]`` where there is no interval (an estimate from a single context)."""
    if row.get(key) is None or row[key] != row[key]:
        return ""
    if row[lo] != row[lo] or row[hi] != row[hi]:
        return f"{row[key]:+.2f} [–]"
    return f"{row[key]:+.2f} [{row[lo]:+.2f}, {row[hi]:+.2f}]"


def _pct(value: float | None) -> str:
    return "" if value is None or value != value else f"{value:.1%}"


def _reward_cell(row: dict) -> str:
    """The reward scorer's mean PMI; where it left replies unscored, their share (and no mean)."""
    unscored = row.get("reward_unscored") or 0.0
    return f"– ({unscored:.1%} unscored)" if unscored > 0 else _num(row.get("reward_pmi"), "+.2f")


def _num(value: float | None, fmt: str = ".3f") -> str:
    return "" if value is None or value != value else format(value, fmt)


def judges_table(judges: list[Judge], reward_meta: dict | None) -> str:
    """One line per judge: what it is, its validation AUC and what it shares with the reward scorer."""
    lines = []
    if reward_meta is not None:
        auc = reward_meta.get("best_val_auc")
        lines.append(["reward scorer", describe(reward_meta), _num(auc), "", "", "", ""])
    for j in judges:
        s = j.shares
        lines.append(
            [
                j.name,
                describe(j.meta),
                _num(j.val_auc),
                ("yes" if s["encoder"] else "no") if s else "?",
                s.get("data", "?") if s else "?",
                ("yes" if s["seed"] else "no") if s else "?",
                "**yes**" if j.independent else "no",
            ]
        )
    head = [
        "judge",
        "encoder, seed, training data",
        "val AUC",
        "same encoder",
        "training data vs reward",
        "same seed",
        "shares nothing",
    ]
    return markdown_table(head, lines)


def panel_table(rows: list[dict], judges: list[Judge]) -> str:
    """One line per policy and judge: PMI, gain over base, length-adjusted gain, win-rate (judge's val AUC beside)."""
    lines = []
    for r in rows:
        for j in judges:
            g = r["judges"][j.name]
            lines.append(
                [
                    r["policy"],
                    f"{j.name}{' (independent)' if j.independent else ''}",
                    _num(j.val_auc),
                    _ci(g, "pmi_mean", "pmi_lo", "pmi_hi"),
                    _ci(g, "gain", "gain_lo", "gain_hi"),
                    _ci(g, "len_adj_gain", "len_adj_lo", "len_adj_hi"),
                    _pct(g.get("win_rate")),
                    _pct(g.get("unscored")),
                ]
            )
    head = [
        "policy",
        "judge",
        "judge val AUC",
        "PMI [95% CI]",
        "gain vs base [95% CI]",
        "length-adjusted gain [95% CI]",
        "win-rate",
        "unscored",
    ]
    return markdown_table(head, lines)


def diagnostics_table(rows: list[dict]) -> str:
    """One line per policy: the replies per context its text figures read, the reward's view, length, truncation,
    diversity, templates, questions, KL."""
    lines = []
    for r in rows:
        kl = r.get("kl_reply")
        kl_text = f"<= {kl:.2f}" if kl is not None and r.get("kl_is_bound") else _num(kl, ".2f")
        count = r.get("text_replies")  # evaluate's count (the base's cut to the tuned policies')
        lines.append(
            [
                r["policy"],
                "" if count is None else str(count),
                _reward_cell(r),
                f"{r['words']:.1f}",
                _num(r.get("tokens"), ".1f"),
                _pct(r.get("cut")),
                _num(r["distinct_2"]),
                _num(r["distinct_2_within"]),
                _num(r["distinct_2_across"]),
                _pct(r["top20_openings"]),
                _pct(r["questions"]),
                _pct(r["generic"]),
                _pct(r["copy"]),
                _pct(r["empty"]),
                kl_text,
                _num(r.get("kl_token")),
            ]
        )
    head = [
        "policy",
        "replies/context",
        "PMI (reward scorer)",
        "words",
        "tokens",
        "cut at limit",
        "distinct-2",
        "distinct-2 within",
        "distinct-2 across",
        "top-20 openings",
        "questions",
        "generic",
        "copy",
        "empty",
        "KL/reply",
        "KL/token",
    ]
    return markdown_table(head, lines)


def bins_table(rows: list[dict], judges: list[Judge]) -> str:
    """Gain inside each reply-length bin (bins from the base's length quartiles), per policy and judge."""
    first = next((r for r in rows if "bins" in r["judges"][judges[0].name]), None)
    if first is None:
        return ""
    labels = [b["bin"] for b in first["judges"][judges[0].name]["bins"]]
    lines = []
    for r in rows:
        for j in judges:
            g = r["judges"][j.name]
            if "bins" not in g:
                continue
            cells = [
                f"{b['gain']:+.2f} ({b['n_policy']}/{b['n_base']})"
                if b["gain"] == b["gain"]
                else f"– ({b['n_policy']}/{b['n_base']})"
                for b in g["bins"]
            ]
            lines.append([r["policy"], j.name, *cells, _num(g["binned_gain"], "+.2f")])
    return markdown_table(["policy", "judge", *labels, "weighted"], lines)


def report_text(result: dict, judges: list[Judge], reward_meta: dict | None, header: str = "") -> str:
    """The whole markdown report of an evaluation."""
    rows = result["rows"]
    verdicts = "\n".join(f"- **{r['policy']}**: {r['verdict']}" for r in rows if "verdict" in r)
    warnings = "".join(f"\n> WARNING: {w}\n" for w in result.get("warnings", []))
    return (
        f"{header}{warnings}\n### Judges\n\n{judges_table(judges, reward_meta)}\n\n"
        "A gain counts when every judge that shares nothing with the reward (another encoder and no training "
        "data in common; a shared seed number is then moot) has a 95% CI above 0.\n\n"
        f"### Engagement gain by judge\n\n{panel_table(rows, judges)}\n\n{verdicts}\n\n"
        "An empty reply (nothing visible) scores 0.0 (its share: *empty* below). unscored: share of the policy's "
        "replies the judge gave no PMI (it failed or returned a non-finite score, unfinished reasoning, unreadable "
        "text). Where a judge left any reply of a policy unscored, its PMI is not computed, and where it left any of "
        "the policy's or the base's, neither are its gains nor win-rate (blank: no mean over the scored replies "
        "alone); the verdict is then not established.\n\n"
        f"### Reward-hacking diagnostics\n\n{diagnostics_table(rows)}\n\n"
        "replies/context: the replies per context these text figures read (the base's cut to the tuned policies' "
        "count). Distinct-2, distinct-2 within and the top-20 openings share fall as more replies are counted: "
        "compare them only between rows with the same replies/context (best-of-n rows and the human reply have "
        "fewer). cut at limit: generation did not end with EOS. Distinct-2 within: over the samples of one context, "
        "averaged; across: one reply per context. top-20 openings: share of replies opening (first 3 words) with "
        "one of the 20 most frequent openings. KL: mean over the policy's replies of log pi/pi_base (nats; "
        "best-of-n: the analytic bound).\n\n"
        f"### Gain inside reply-length bins (policy/base replies per bin)\n\n{bins_table(rows, judges)}\n"
    )


def context_source(prompt_args, args) -> str:
    """Where an evaluation's contexts came from, as the report's header names them: an earlier run's samples file,
    a prompt file, or a dialogue range."""
    if args.from_samples:
        return f"from {args.from_samples}"
    if prompt_args.prompt_file:
        return f"from {prompt_args.prompt_file}"
    first, count = prompt_args.first_dialogue, prompt_args.max_dialogues
    where = f"{first}-{first + count - 1}" if count else f"{first}+"
    return f"{prompt_args.dialogues} dialogues {where}"


def _samples_text(rows: list[dict], n_base: int, width: int | None) -> str:
    """How many replies per context each row holds: the tuned policies', the base's where it differs, and those of
    the rows with their own count (best-of-n rows, the human reply)."""
    per_policy = width if width is not None else n_base
    text = f"{per_policy} sample{'s' * (per_policy != 1)} per policy"
    if width is not None and width != n_base:  # the base drawn more often (--base_samples)
        text += f", {n_base} for the base"
    others: dict[int, list[str]] = {}
    for r in rows[1:]:
        if r.get("replies") is not None and r["replies"] != per_policy:
            others.setdefault(r["replies"], []).append(r["policy"])
    for count, names in others.items():
        text += f", {count} for {' and '.join(names)}"
    return text


def write_report(
    out: Path, result: dict, judges: list[Judge], reward_meta: dict | None, prompt_args, args, settings
) -> str:
    """Write ``results.md`` and ``results.json``; return the markdown. The header names where the contexts and
    replies came from: a dialogue range, a prompt file, or an earlier run's samples file (its own reply count)."""
    n_contexts = len(result["contexts"])
    replies = result.get("replies") or {}
    base = next(iter(replies), None)
    n_base = len(replies[base].texts[0]) if base is not None and replies[base].texts else args.samples
    width = policy_width(replies, base) if base is not None else None
    samples = _samples_text(result["rows"], n_base, width)
    source = context_source(prompt_args, args)
    if args.from_samples:
        sampling = "replies read back, sampled by that run"
    else:
        sampling = (
            f"T={settings.temperature}, top_p={settings.top_p}, max_new_tokens={settings.max_new_tokens}, "
            f"seed={settings.seed}"
        )
    header = (
        f"{n_contexts} contexts ({source}) x {samples} ({sampling}); bootstrap CIs over contexts. "
        f"Evaluation took {result.get('seconds', 0) / 60:.1f} min.\n"
    )
    text = report_text(result, judges, reward_meta, header)
    (out / "results.md").write_text(text, encoding="utf-8")
    payload: dict[str, Any] = {
        "rows": result["rows"],
        "judges": result.get("judges"),
        "reward_scorer": reward_meta,
        "warnings": result.get("warnings", []),
        "length_edges": result.get("length_edges"),
        "seconds": result.get("seconds"),
        "device": result.get("device"),
        "args": asdict(args),
        "sampling": asdict(settings),
        "prompts": asdict(prompt_args),
        "prompts_on_trust": bool(result.get("prompts_on_trust")),
    }
    (out / "results.json").write_text(json.dumps(json_safe(payload), indent=1, default=str, allow_nan=False))
    return text

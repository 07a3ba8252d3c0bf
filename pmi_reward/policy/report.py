"""How a policy evaluation is shown: the table of policies, and the note on how independent the judge is."""

from __future__ import annotations

from typing import Any

from ..evaluation.report import markdown_table
from ..scoring.scorer import PMIScorer

__all__ = ["policy_table", "provenance_of", "independence_note"]


def _ci(row: dict, key: str) -> str:
    return f"{row[key + '_mean' if key == 'pmi' else key]:+.2f} [{row[key + '_lo']:+.2f}, {row[key + '_hi']:+.2f}]"


def policy_table(rows: list[dict]) -> str:
    """One line per policy: PMI with CI, gain over base with CI, win-rate and the text statistics."""
    has_reward = any("reward_pmi" in r for r in rows)
    head = ["policy", "PMI (eval scorer) [95% CI]", "gain vs base [95% CI]", "win-rate"]
    head += ["PMI (reward scorer)"] if has_reward else []
    head += ["words", "distinct-1", "distinct-2", "generic", "copy", "empty"]
    lines = []
    for r in rows:
        cells = [
            r["policy"],
            _ci(r, "pmi"),
            _ci(r, "gain") if "gain" in r else "",
            f"{r['win_rate']:.1%}" if "win_rate" in r else "",
        ]
        cells += [f"{r['reward_pmi']:+.2f}" if "reward_pmi" in r else ""] if has_reward else []
        cells += [
            f"{r['words']:.1f}",
            f"{r['distinct_1']:.3f}",
            f"{r['distinct_2']:.3f}",
            f"{r['generic']:.1%}",
            f"{r['copy']:.1%}",
            f"{r['empty']:.1%}",
        ]
        lines.append(cells)
    return markdown_table(head, lines)


def provenance_of(scorer: PMIScorer) -> dict[str, Any]:
    """What ``independence_note`` compares: the scorer's provenance and its encoder."""
    return {**scorer.metadata, "encoder": scorer.encoder.spec.model}


def _describe(meta: dict) -> str:
    data, model = meta.get("data") or {}, meta.get("encoder", "?")
    seed = (meta.get("training") or {}).get("seed", "?")
    if "dialogues" in data:
        first = data.get("skip_dialogues", 0)
        n = sum(data.get("n_dialogues") or [0])
        where = f"{data['dialogues']} dialogues {first}-{first + n}"
    else:
        where = f"pairs {data.get('train_file', '?')}"
    return f"{model} encoder, seed {seed}, {where}"


def independence_note(eval_meta: dict, reward_meta: dict | None) -> str:
    """Say how the evaluation scorer differs from the reward's (encoder, seed, training data), from
    ``provenance_of`` each."""
    if reward_meta is None:
        return f"Evaluation scorer: {_describe(eval_meta)} (reward scorer not given: independence not checked)."
    differences = []
    if eval_meta.get("encoder") != reward_meta.get("encoder"):
        differences.append("a different encoder")
    if (eval_meta.get("training") or {}).get("seed") != (reward_meta.get("training") or {}).get("seed"):
        differences.append("a different seed")
    e, r = eval_meta.get("data") or {}, reward_meta.get("data") or {}
    if e.get("dialogues") and e.get("dialogues") == r.get("dialogues"):
        e0, r0 = e.get("skip_dialogues", 0), r.get("skip_dialogues", 0)
        e1, r1 = e0 + sum(e.get("n_dialogues") or [0]), r0 + sum(r.get("n_dialogues") or [0])
        if e1 <= r0 or r1 <= e0:
            differences.append("disjoint training dialogues")
    elif e != r:
        differences.append("different training data")
    verdict = (
        "independent of the reward: " + ", ".join(differences)
        if differences
        else "NOT independent of the reward scorer (same encoder, seed and data): gains may be reward hacking"
    )
    return (
        f"Evaluation scorer: {_describe(eval_meta)}. Reward scorer: {_describe(reward_meta)}. "
        f"The evaluation scorer is {verdict}."
    )

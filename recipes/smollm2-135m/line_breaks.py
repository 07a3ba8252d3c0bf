"""How much the finals' judge (b) figures move now that scorers write texts as training wrote them.

Until 2026-11-28 (twenty-fourth session) a scorer embedded a reply with its line breaks, where its training pairs had
them as spaces; SmolLM2's tokenizer reads a line break as a token of its own (MiniLM's and MPNet's do not, so their
judges cannot move). This scores every reply of a ``samples.jsonl`` with one judge both ways (the old reading by
leaving the texts as given) and prints, per policy, the mean PMI and the gain over the base each way.

python recipes/smollm2-135m/line_breaks.py recipes/smollm2-135m/samples.jsonl outputs/scorers/judge-smollm2-en
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from unittest import mock

import numpy as np

from pmi_reward.data.records import read_records
from pmi_reward.evaluation.report import markdown_table
from pmi_reward.rewards.reward import PMIReward
from pmi_reward.scoring import scorer as scorer_module
from pmi_reward.scoring.scorer import PMIScorer

sys.path.append(str(Path(__file__).resolve().parents[1]))  # recipes/: the scripts' shared input check (run by path)
from recipe_inputs import require_samples, require_scorer  # noqa: E402

SKIP = ("context", "reference", "human reference")


def _scores(reward: PMIReward, contexts: list[str], replies: list[str]) -> np.ndarray:
    return np.array([np.nan if v is None else v for v in reward(contexts, replies)], dtype=float)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("samples", type=Path, help="an evaluation's samples.jsonl")
    parser.add_argument("scorer", help="the judge's scorer folder")
    args = parser.parse_args(argv)
    require_samples(parser.prog, [args.samples])
    require_scorer(parser.prog, args.scorer)
    records = read_records(args.samples)
    reward = PMIReward(PMIScorer.from_pretrained(args.scorer), empty_score=None)
    policies = [k for k in records[0] if k not in SKIP]
    contexts = [r["context"] for r in records for p in policies for _ in r[p]]
    replies = [s["reply"] for r in records for p in policies for s in r[p]]
    owner = [p for r in records for p in policies for _ in r[p]]
    split = sum("\n" in t.strip() for t in replies)
    new = _scores(reward, contexts, replies)
    with mock.patch.object(scorer_module, "as_trained", lambda c, r: (list(c), list(r))):
        old = _scores(reward, contexts, replies)
    owner = np.asarray(owner)
    rows = []
    for p in policies:
        o, n = np.nanmean(old[owner == p]), np.nanmean(new[owner == p])
        base_o, base_n = np.nanmean(old[owner == "base"]), np.nanmean(new[owner == "base"])
        rows.append([p, f"{o:+.3f}", f"{n:+.3f}", f"{o - base_o:+.3f}", f"{n - base_n:+.3f}"])
    print(f"{len(replies)} replies, {split} with a line break inside; max |new - old| {np.nanmax(abs(new - old)):.3f}")
    print(markdown_table(["policy", "mean PMI, old reading", "new", "gain over base, old", "new"], rows))


if __name__ == "__main__":
    main()

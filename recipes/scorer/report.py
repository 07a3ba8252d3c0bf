"""Tables (mean ± std over seeds, in the order the runs were tried) and the scaling plot from ``runs.jsonl``;
``--per_seed NAME ...`` adds one row per seed of those runs (per training size and seed, with a size column, for a
run logged at several sizes), their validation and test figures side by side;
``--digits N`` prints N decimals (default 3; a rule that reads a margin of 0.001 needs 4).

python recipes/scorer/report.py --runs outputs/scorer-recipe/runs.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from pmi_reward.evaluation.metrics import format_mean_std
from pmi_reward.evaluation.report import markdown_table

COLUMNS = {
    "val": ["auc_random", "auc_context", "auc_lexical", "auc_nearest", "auc_generic", "generic_mean", "pos_mean"],
    "test": [
        "auc_random",
        "auc_random3",
        "auc_context",
        "auc_lexical",
        "auc_nearest",
        "auc_generic",
        "generic_mean",
        "spearman_relevant",
        "spearman_relevant_subsets",
        "pearson_relevant",
        "spearman_engaging",
    ],
}


def label(run: dict) -> str:
    """A run's name in the tables: its ``name``, and how it read the human set's contexts when that was not the
    recipe's cut (``--human_context_turns``), so that rows of the two protocols never merge."""
    turns = run.get("human_context_turns")
    if turns is None:
        return run["name"]
    return f"{run['name']} (human set: {'whole contexts' if turns == 0 else f'{turns} turns'})"


def number_reruns(runs: list[dict]) -> list[dict]:
    """The runs, a name rerun into the same log (the same stage, label, training size and seed again) renamed
    ``"<name> (run 2)"`` (3, ...): its own row, in the order tried. Pooled, two runs made one row of 6 "seeds" and the
    per-seed table kept only the later; more seeds of one run (``--first_seed``) still join its row."""
    seen: dict[tuple, int] = {}
    out = []
    for r in runs:
        key = (r["stage"], label(r), r.get("train_pairs", 0), r["seed"])
        seen[key] = seen.get(key, 0) + 1
        out.append(r if seen[key] == 1 else {**r, "name": f"{r['name']} (run {seen[key]})"})
    return out


def groups(runs: list[dict]) -> dict[tuple, list[dict]]:
    """The runs by (stage, label, train pairs), in the order first tried: one row each, its seeds the members."""
    out: dict[tuple, list[dict]] = {}
    for r in number_reruns(runs):
        out.setdefault((r["stage"], label(r), r.get("train_pairs", 0)), []).append(r)
    return out


# test stage with --paired_cosine: each head's human correlation minus the cosine's on the same rows
PAIRED = ["spearman_relevant_minus_cosine", "spearman_engaging_minus_cosine"]


def table(stage: str, runs: list[dict], digits: int = 3) -> str:
    cols = COLUMNS[stage] + [c for c in PAIRED if stage == "test" and any(c in r for r in runs)]
    rows = []
    for (s, name, pairs), rs in groups(runs).items():
        if s != stage:
            continue
        cells = [format_mean_std([r[c] for r in rs], digits) if all(c in r for r in rs) else "-" for c in cols]
        rows.append([name, pairs or "-", len(rs), *cells])
    return markdown_table(["run", "train pairs", "seeds", *cols], rows)


# per seed: the validation figure the choice reads, then the test and human-set figures of the same seed
PER_SEED = [("val", "auc_random"), ("test", "auc_random"), ("test", "auc_context"), ("test", "generic_mean")]
PER_SEED += [("test", "spearman_relevant")]


def per_seed_table(runs: list[dict], names: list[str], digits: int = 3) -> str:
    """One row per (run, training size, seed) of the runs named ``names`` (and per way of reading the human set):
    validation AUC beside the test figures of the same seed and size ("-" where a stage has not run). A "train pairs"
    column comes in when one of those runs was logged at more than one training size (``--max_train_pairs 1000 3000``,
    the scaling runs): keyed by seed alone, every size but the last was dropped and the rows left said not which."""
    runs = number_reruns(runs)
    by = {(r["stage"], label(r), r.get("train_pairs", 0), r["seed"]): r for r in runs}
    sizes = {name: {r.get("train_pairs", 0) for r in runs if r["name"] == name} for name in names}
    sized = any(len(s) > 1 for s in sizes.values())  # runs of one size each keep the table they always had
    rows = []
    for name in names:
        tests = dict.fromkeys(label(r) for r in runs if r["name"] == name and r["stage"] == "test") or {name: None}
        for shown in tests:
            for pairs, seed in sorted({(r.get("train_pairs", 0), r["seed"]) for r in runs if r["name"] == name}):
                cells = [
                    by.get((stage, name if stage == "val" else shown, pairs, seed), {}).get(col)
                    for stage, col in PER_SEED
                ]
                figures = ["-" if c is None else f"{c:.{digits}f}" for c in cells]
                rows.append([shown, *([pairs or "-"] if sized else []), seed, *figures])
    header = ["run", *(["train pairs"] if sized else []), "seed", *(f"{stage} {col}" for stage, col in PER_SEED)]
    return markdown_table(header, rows)


def scaling_plot(runs: list[dict], name: str, path: Path) -> Path | None:
    points = sorted((p, rs) for (s, n, p), rs in groups(runs).items() if n == name and s == "val")
    if not points:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5))
    x = [p for p, _ in points]
    for metric in ("auc_random", "auc_context", "auc_lexical", "auc_generic"):
        y = np.array([[r[metric] for r in rs] for _, rs in points], dtype=object)
        mean = [np.mean(v) for v in y]
        std = [np.std(v, ddof=1) if len(v) > 1 else 0.0 for v in y]
        ax.errorbar(x, mean, yerr=std, marker="o", capsize=3, label=metric.removeprefix("auc_"))
    ax.set_xscale("log")
    ax.set_xlabel("training pairs (Chit-Chat)")
    ax.set_ylabel("en study validation ROC-AUC")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def read_runs(path: Path) -> list[dict]:
    """The runs of a ``runs.jsonl`` log, refused with the file (and line) named when there are none to report: no
    such file, no run in it (an empty table was written beside it), or a line that is not a run (``run.py`` appends
    one line per run, so a run cut short leaves half a line; the report read it as a raw JSONDecodeError)."""
    if not path.is_file():
        raise SystemExit(f"{path}: no such file")
    runs = []
    # JSON Lines end at \n only (str.splitlines() also splits at U+2028, U+2029 and \x85 inside a string)
    for number, line in enumerate(path.read_text(encoding="utf-8").split("\n"), 1):
        if not line.strip():
            continue
        try:
            run = json.loads(line)
        except json.JSONDecodeError as err:
            raise SystemExit(f"{path}, line {number}: not JSON ({err.msg}; a run cut short?)") from None
        if not isinstance(run, dict):
            raise SystemExit(f"{path}, line {number}: a JSON {type(run).__name__}, not a run (an object)")
        if missing := [key for key in ("name", "stage", "seed") if key not in run]:
            raise SystemExit(f"{path}, line {number}: not a run of run.py (no {', '.join(missing)})")
        runs.append(run)
    if not runs:
        raise SystemExit(f"{path}: no runs")
    return runs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", default="outputs/scorer-recipe/runs.jsonl")
    parser.add_argument("--scaling", default="scaling-chitchat", help="the run name of the scaling curve")
    parser.add_argument("--per_seed", nargs="*", default=[], help="run names to list seed by seed")
    parser.add_argument("--digits", type=int, default=3, help="decimals of every figure")
    args = parser.parse_args(argv)
    runs = read_runs(Path(args.runs))
    out = Path(args.runs).parent
    text = "\n\n".join(f"## {stage}\n\n{table(stage, runs, args.digits)}" for stage in ("val", "test"))
    if args.per_seed:
        text += f"\n\n## per seed\n\n{per_seed_table(runs, args.per_seed, args.digits)}"
    plot = scaling_plot(runs, args.scaling, out / "scaling.png")
    (out / "results.md").write_text(text + "\n", encoding="utf-8")
    print(text)
    if plot:
        print(f"\nscaling plot: {plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

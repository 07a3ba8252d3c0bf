"""``pmi-reward evaluate``: how good is a saved scorer on a pair file? AUC and correlations, with 95% CIs.

    pmi-reward evaluate --config evaluate/paper --scorer DIR --input test.csv --targets annot_relevant_mean

The negatives' mix is ``NegativeSpec``'s (``--k_random --k_in_dialogue --k_context``; all 0: no AUC); the
shipped config ``evaluate/paper`` is the paper's test protocol (3 random negatives per row; ``--k_random 5`` for
issue 9's). Prints one JSON object (``pmi_reward.evaluation.scorer_report`` says what is in it).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from ..configs import parse_args
from ..data.negatives import NegativeSpec
from ..data.pairs import PairSet, load_pairs
from ..data.records import atomic_write, check_output, json_safe
from ..evaluation.scorer_report import EvaluateArguments, evaluate_scorer, evaluation_columns
from ..scoring.models import embedding_cache_dir
from ..scoring.scorer import PMIScorer
from .device import check_device, device_help
from .processes import single_process
from .score import scorer_files


@dataclass
class EvaluateCommandArguments(EvaluateArguments):
    """``EvaluateArguments`` and where the scorer runs: a command's option, not the report's (``evaluate_scorer``
    takes a scorer already loaded)."""

    device: str | None = field(default=None, metadata={"help": device_help(onnx=None)})


def main(argv: list[str] | None = None) -> int:
    single_process("evaluate")  # before anything loads: it has no multi-process path
    args, negatives = parse_args((EvaluateCommandArguments, NegativeSpec), argv, prog="pmi-reward evaluate")
    check_device(args.device)  # a device this machine lacks: one line now, not a traceback once the scorer loaded
    if args.pmi_columns and len(args.pmi_columns) != 3:
        raise SystemExit("--pmi_columns takes three columns: p_xy p_x p_y")
    if args.output:
        check_output(args.output, args.overwrite, inputs=[args.input, *scorer_files(args.scorer)], suffixes=(".json",))

    def read(turns: int | None = None) -> PairSet:
        return load_pairs(
            args.input,
            args.context_column,
            args.response_column,
            args.key_column or None,
            [*args.targets, *args.pmi_columns],
            max_context_turns=turns,
            require_key=args.key_column not in ("", EvaluateArguments.key_column),
        )

    pairs = read()
    evaluation_columns(pairs, negatives, args)  # a bad column or a mix the pairs cannot give: before the scorer loads
    scorer = PMIScorer.from_pretrained(
        args.scorer, device=args.device, cache_dir=embedding_cache_dir(None, args.no_cache)
    )
    turns = scorer.context_turns if args.context_turns is None else args.context_turns
    if turns:  # contexts cut as the scorer's training pairs were (and PMIReward, score, rerank cut them)
        pairs = read(turns)
        evaluation_columns(pairs, negatives, args)
    report = evaluate_scorer(scorer, pairs, negatives, args)
    result = json_safe({"scorer": args.scorer, "input": args.input, **report})
    text = json.dumps(result, indent=2, allow_nan=False)
    if args.output:  # its folder made as `score` makes it (check_output checked it can be)
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        atomic_write(Path(args.output), lambda tmp: Path(tmp).write_text(text + "\n", encoding="utf-8"))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

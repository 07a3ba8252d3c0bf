"""Method comparisons on shared negatives (``methods``), the loop the recipes share (``runner``), and
their reports (``report``)."""

from .methods import EvalSet, FeatureBank, MethodScores, fit_method, run_round, score_texts
from .runner import (
    ARGUMENTS,
    StudyArguments,
    StudySetup,
    average_rounds,
    load_scores,
    merge_scores,
    run_study,
    save_scores,
)

__all__ = [
    "ARGUMENTS",
    "EvalSet",
    "FeatureBank",
    "MethodScores",
    "StudyArguments",
    "StudySetup",
    "average_rounds",
    "fit_method",
    "load_scores",
    "merge_scores",
    "run_round",
    "run_study",
    "save_scores",
    "score_texts",
]

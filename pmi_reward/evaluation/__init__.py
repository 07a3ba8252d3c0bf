"""Stage 6, evaluation: metrics, baselines (KDE, MEEP) and method comparisons (the study)."""

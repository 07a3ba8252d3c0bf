"""Stage 6, evaluation: how good is a scorer, and how does PMIScore compare with other estimators.

``metrics`` holds every metric the project reports; ``scorer_report`` evaluates a saved scorer on a pair file;
``report`` writes tables and plots; ``baselines`` are KDE and MEEP; ``study`` compares methods on shared
negatives (the synthetic and empirical recipes).
"""

"""Baselines the study compares PMIScore with on the same data and negatives: KDE and MEEP."""

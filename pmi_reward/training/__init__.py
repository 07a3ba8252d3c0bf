"""Stage 3, training: fit a head (and optionally the encoder, fully or by LoRA) so that its scores estimate PMI.

``objectives`` is the registry of variational bounds; ``loop`` is the one training loop every objective runs
(rounds of fresh negatives, model selection by validation ROC-AUC), ``checkpoint`` lets it resume; ``trainable``
fine-tunes the encoder (full or LoRA) under the same loop; ``fit`` wraps a trained head into a ``PMIScorer``;
``job`` is the whole ``pmi-reward train`` run, from a data source to a saved scorer with its provenance.
"""

"""Stage 3, training: fit a head (and optionally LoRA adapters of the encoder) so that its scores estimate PMI.

``objectives`` is the registry of variational bounds; ``loop`` is the one training loop every objective runs
(rounds of fresh negatives, model selection by validation ROC-AUC), ``checkpoint`` lets it resume; ``lora``
fine-tunes the encoder under the same loop; ``fit`` wraps a trained head into a ``PMIScorer``; ``job`` is the
whole ``pmi-reward train`` run, from a data source to a saved scorer with its provenance.
"""

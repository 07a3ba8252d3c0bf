"""Stage 3, training: fit a head so that its scores estimate PMI (objectives, the loop, checkpoints, LoRA)."""

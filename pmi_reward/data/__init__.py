"""Stage 1, data: dialogues and pair files in, positive (context, response) pairs and their negatives out."""

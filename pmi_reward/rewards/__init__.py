"""Stage 4, rewards: a trained scorer as a reward: in process, over HTTP, for verl, for reranking."""

"""Stage 5, serving: the reward behind HTTP for distributed RL engines."""

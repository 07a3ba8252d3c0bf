"""Stage 5, serving: the reward behind HTTP for distributed RL engines (OpenRLHF, verl, TRL over the network).

``endpoints`` holds what each route answers (through the one reward path), ``handler`` speaks HTTP/1.1,
``server`` owns the life cycle (start, drain, stop); concurrent requests are merged into encoder batches by
``rewards.batching`` (which verl's in-process reward shares).
"""

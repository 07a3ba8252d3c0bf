"""Adapters that plug the PMI reward into other RL engines' reward hooks (verl)."""

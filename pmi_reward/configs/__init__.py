"""The YAML configs that ship with the package, and the one way every command reads its options.

A command's options are dataclasses; ``parse_args`` fills them from an optional YAML file (``--config``)
and then from flags, with TRL's ``TrlParser``. ``--config`` takes a file path or the name of a config that
ships here, e.g. ``scorer/minilm`` for ``pmi_reward/configs/scorer/minilm.yaml``, so that an installed
wheel needs no checkout. Each config has one home: the ones the CLI and the demo read live here, the
recipes' own next to their recipe.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["CONFIG_DIR", "config_path", "shipped_configs", "parse_args"]

CONFIG_DIR = Path(__file__).resolve().parent


def shipped_configs() -> list[str]:
    """Names of the shipped configs (``scorer/minilm``, ...)."""
    return sorted(str(p.relative_to(CONFIG_DIR).with_suffix("")) for p in CONFIG_DIR.rglob("*.yaml"))


def config_path(name_or_path: str | Path) -> str:
    """The file behind ``--config``: a path as given, else the shipped config of that name."""
    path = Path(name_or_path)
    if path.is_file():
        return str(path)
    shipped = CONFIG_DIR / path.with_suffix(".yaml")
    if shipped.is_file():
        return str(shipped)
    raise FileNotFoundError(
        f"--config {name_or_path}: no such file, and no shipped config of that name "
        f"(shipped: {', '.join(shipped_configs())})"
    )


def parse_args(types: Sequence[Any], argv: Sequence[str] | None = None, prog: str | None = None) -> tuple[Any, ...]:
    """Instances of ``types`` from ``--config`` YAML (a path or a shipped name) and flags, flags winning."""
    from trl import TrlParser

    args = list(sys.argv[1:] if argv is None else argv)
    if "--config" in args and args.index("--config") + 1 < len(args):
        at = args.index("--config") + 1
        args[at] = config_path(args[at])
    epilog = (
        f"--config FILE.yaml, or the name of a shipped config ({', '.join(shipped_configs())}), sets any of "
        "these options; flags override it."
    )
    return tuple(TrlParser(tuple(types), prog=prog, epilog=epilog).parse_args_and_config(args))

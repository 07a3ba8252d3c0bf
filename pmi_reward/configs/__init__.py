"""The YAML configs that ship with the package, and the one way every command reads its options.

A command's options are dataclasses; ``parse_args`` fills them from an optional YAML file (``--config``)
and then from flags, with TRL's ``TrlParser``. ``--config`` takes a file path or the name of a config that
ships here, e.g. ``scorer/minilm`` for ``pmi_reward/configs/scorer/minilm.yaml``, so that an installed
wheel needs no checkout. ``--config`` may be given more than once (``--config scorer/minilm --config
data.yaml``): later files override earlier ones key by key, so a data range can sit in its own small file while
the scorer's settings stay in theirs. Each config has one home: the ones the CLI and the demo read live here,
the recipes' own next to their recipe.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
import typing
from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from pathlib import Path
from types import UnionType
from typing import Any

__all__ = ["CONFIG_DIR", "config_path", "shipped_configs", "load_config", "merged_config", "parse_args"]

CONFIG_DIR = Path(__file__).resolve().parent
# Libraries whose dataclasses give a YAML value no flag gives a meaning of their own (TRL's GRPOConfig maps
# ``scale_rewards: false`` to "none", transformers' TrainingArguments reads ``fsdp: false``): their options take it
# as TRL's own parser hands it over; the options of every other dataclass (pmi_reward's, the recipes', a caller's)
# refuse it.
_LIBRARIES = ("trl", "transformers")


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


def load_config(name: str) -> dict:
    """One ``--config`` file (a path or a shipped name) as its mapping of option names to values; an empty file, or
    one that holds a list or a single value, is refused by name (one alone and one of several alike)."""
    import yaml

    with open(config_path(name)) as file:  # (a YAML error then names the file, not "<unicode string>")
        values = yaml.safe_load(file)
    if not isinstance(values, dict):
        what = "is empty" if values is None else f"holds a {type(values).__name__}"
        raise ValueError(f"--config {name}: the file {what}; expected a mapping of option names to values (key: value)")
    return values


def merged_config(names: Sequence[str]) -> dict:
    """The YAML files (paths or shipped names) merged in order, later keys winning."""
    merged: dict = {}
    for name in names:
        merged.update(load_config(name))
    return merged


def _check_keys(types: Sequence[Any], names: Sequence[str]) -> None:
    """Every key of each ``--config`` file names an option of the command (TRL's own message named neither the
    file nor the option meant); ``env`` is TRL's: environment variables to set."""
    import difflib

    known = {f.name for cls in types for f in dataclasses.fields(cls) if f.init} | {"env"}
    for name in names:
        unknown = [key for key in load_config(name) if key not in known]
        if unknown:
            hints = []
            for key in unknown:
                close = difflib.get_close_matches(str(key).replace("-", "_"), known, n=1)
                hints.append(f"{key!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
            raise ValueError(
                f"--config {name}: no option of this command is named {', '.join(hints)}; `--help` lists the options"
            )


def _resolve_configs(args: list[str], stack: ExitStack, types: Sequence[Any] = ()) -> list[str]:
    """``args`` with one ``--config FILE``: a path for a shipped name, a merged temporary file for several; each
    file checked first (a mapping whose keys are options of ``types``, with values they can take)."""
    names, rest, i = [], [], 0
    while i < len(args):
        if args[i].startswith("--config="):  # argparse's other spelling, which TRL's parser did not read
            names.append(args[i].removeprefix("--config="))
            i += 1
        elif args[i] == "--config" and i + 1 == len(args):  # TRL's parser failed on it with an IndexError
            raise SystemExit("--config needs a file or a shipped config name")
        elif args[i] == "--config" and i + 1 < len(args):
            names.append(args[i + 1])
            i += 2
        else:
            rest.append(args[i])
            i += 1
    if not names:
        return rest
    _check_keys(types, names)
    configs = [load_config(name) for name in names]
    for i, (name, values) in enumerate(zip(names, configs, strict=True)):
        # each file's values checked alone, so that an error names the file that holds the value; a key a later
        # file sets is not checked here (its value is not the one used: layered configs override a value)
        later = set().union(*configs[i + 1 :])
        _yaml_values(types, {k: v for k, v in values.items() if k not in later}, f"--config {name}")
    if len(names) == 1:
        return ["--config", config_path(names[0]), *rest]
    import yaml

    merged = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="pmi-reward-config-"))) / "merged.yaml"
    merged.write_text(yaml.safe_dump(merged_config(names)))
    return ["--config", str(merged), *rest]


def _field_types(types: Sequence[Any]) -> dict[str, tuple[Any, bool, bool]]:
    """Each option's type hint, whether None is a value it may take (its hint allows it, or None is its default),
    and whether a value no flag gives is refused (the dataclass that declares it is not one of ``_LIBRARIES``); a
    dataclass whose hints cannot be resolved is left out (its YAML values go unchecked)."""
    out: dict[str, tuple[Any, bool, bool]] = {}
    for cls in types:
        try:
            hints = typing.get_type_hints(cls)
        except Exception:  # noqa: BLE001 - a third-party dataclass's unresolvable annotation
            continue
        for f in dataclasses.fields(cls):
            hint = hints.get(f.name)
            owner = next((c for c in cls.__mro__ if f.name in vars(c).get("__annotations__", {})), cls)
            nullable = hint is Any or type(None) in typing.get_args(hint) or f.default is None
            out[f.name] = (hint, nullable, owner.__module__.split(".")[0] not in _LIBRARIES)
    return out


def _list_only(hint: Any) -> bool:
    """Whether an option takes a list and no single value (``list[str] | None``; not ``str | list[str]``, whose
    string means something of its own, such as transformers' ``optim_target_modules: all-linear``)."""
    if typing.get_origin(hint) is list:
        return True
    members = [a for a in typing.get_args(hint) if a is not type(None)]
    return bool(members) and all(typing.get_origin(a) is list for a in members)


def _scalar_kind(hint: Any) -> Any:
    """The one scalar type (int, float, bool, str) an option takes besides None, else None (a union of several
    types, an enum, a Literal, a list, a mapping: left as they are)."""
    members = [a for a in typing.get_args(hint) if a is not type(None)] if typing.get_args(hint) else [hint]
    if typing.get_origin(hint) not in (None, typing.Union, UnionType) or len(members) != 1:
        return None
    return members[0] if members[0] in (int, float, bool, str) else None


def _shown(value: Any) -> str:
    """A YAML value as an error names it: ``true``/``false``, ``a list``, ``a mapping``."""
    if isinstance(value, bool):
        return str(value).lower()
    return "a mapping" if isinstance(value, dict) else "a list"


def _text(source: str, key: str, value: Any, strict: bool) -> Any:
    """A YAML value for a text option, or for an item of a list of text: a number as its flag's text. A bool, list
    or mapping, which no flag gives, is refused by name where ``strict`` (it reached the code: a bool as the text
    "True", a list or mapping as a traceback), and handed over as it is to a dataclass of ``_LIBRARIES``, whose
    ``__post_init__`` says what it means, as it does given the same YAML by TRL's own parser: TRL's
    ``scale_rewards: false`` is "none", transformers' ``fsdp: false`` no FSDP (the text "False" failed at GRPO's first
    step, and at parse)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    if strict and isinstance(value, (bool, list, dict)):
        hint = " (quote it if the text is meant)" if isinstance(value, bool) else ""
        raise ValueError(f"{source}: {key}: {_shown(value)}, but this option takes text{hint}")
    return value


def _as_flag(source: str, key: str, value: Any, kind: Any, strict: bool) -> Any:
    """A YAML scalar as its flag would be written, for argparse to convert and check as it does a flag's (it converts
    a string default only: ``k_random: 1.5`` reached the code as a float). Ints stay good floats (``lr: 1`` -> 1.0)."""
    if kind is None or value is None or isinstance(value, str) or (kind is bool and isinstance(value, bool)):
        return value
    if kind is str:
        return _text(source, key, value, strict)
    return str(value)  # int, float, bool: argparse's type check names the option (`invalid int value: '1.5'`)


def _list_item(source: str, key: str, item: Any, kind: Any, strict: bool) -> Any:
    """An item of a YAML list as the same flag's item would be (argparse leaves a list default unconverted); a list
    or mapping as an item is refused by name where ``strict``."""
    if strict and isinstance(item, (list, dict)):
        raise ValueError(f"{source}: {key}: {_shown(item)} as an item, but this option takes a list of single values")
    if kind is None or item is None or kind is bool:
        return item
    if kind is str:
        return _text(source, key, item, strict)
    try:
        if isinstance(item, bool):
            raise ValueError
        return kind(str(item))
    except ValueError:
        raise ValueError(f"{source}: {key}: invalid {kind.__name__} value: {item!r}") from None


def _yaml_values(types: Sequence[Any], values: dict, source: str = "--config") -> dict:
    """YAML values made what the same flags would give: a scalar for a list option becomes a one-item list (argparse
    applies ``nargs`` to flags only: ``tuned: outputs/run`` was read letter by letter; not where the option takes a
    single value too), a null for an option that takes no None is refused by name (it reached the code as None), and
    a number, bool or list item is converted and checked by the option's type as its flag is (``k_random: 1.5`` was
    accepted and failed deep in the run); a value no flag gives (a bool, list or mapping for text, a mapping for a
    list) is refused by name, except where a dataclass of ``_LIBRARIES`` declares the option (see ``_text``).
    ``source`` begins an error's message (``--config FILE``)."""
    fields = _field_types(types)
    out = {}
    for key, value in values.items():
        hint, nullable, strict = fields.get(key, (None, True, False))
        if value is None and not nullable:
            kind = getattr(hint, "__name__", str(hint))
            raise ValueError(f"{source}: {key}: null, but this option takes a {kind}; leave the key out (its default)")
        if _list_only(hint):
            if strict and isinstance(value, dict):
                raise ValueError(f"{source}: {key}: a mapping, but this option takes a list")
            items = [value] if value is not None and not isinstance(value, list) else value
            lists = (hint,) if typing.get_origin(hint) is list else typing.get_args(hint)
            item_kind = _scalar_kind(next((typing.get_args(a)[0] for a in lists if typing.get_args(a)), None))
            out[key] = None if items is None else [_list_item(source, key, item, item_kind, strict) for item in items]
        else:
            out[key] = _as_flag(source, key, value, _scalar_kind(hint), strict)
    return out


def _describe_negations(parser: argparse.ArgumentParser) -> None:
    """Give each ``--no_X`` flag that transformers' parser generates for a boolean option ``X`` whose default is true
    a help line of its own: the parser copies ``X``'s help, so ``--no_normalize`` read "L2-normalize embeddings", the
    opposite of what it does. The flag is marked with the option it turns off (``negates``), for ``_HelpFormatter``
    to say whether that option is on. An option whose own name begins with ``no_`` (``--no_cache``) is left alone."""
    options = {option: action for action in parser._actions for option in action.option_strings}
    for action in parser._actions:
        name = action.dest
        positive = options.get(f"--{name}")
        if isinstance(action, argparse._StoreFalseAction) and f"--no_{name}" in action.option_strings and positive:
            action.help = f"turn off --{name} (the same as --{name} false)"
            action.negates = positive  # type: ignore[attr-defined]


def _is_on(value: Any) -> bool:
    """Whether a boolean option's default is true; a ``--config`` value may be the text a flag takes (``"yes"``)."""
    if isinstance(value, str):
        return value.strip().lower() in ("yes", "true", "t", "y", "1")
    return bool(value)


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """argparse's help with each option's default appended, except where that default misleads:

    - after a help that already says what the option does when unset ("mean | last (default: by model type)"), a
      "(default: None)" read as a second, contradicting default;
    - after a generated ``--no_X``, "(default: False)" is the flag's own default, not X's: it says instead whether X
      is on, by default or as a ``--config`` set it (argparse shows a config's values as the defaults);
    - after a required option, "(default: None)" read as "optional, unset": it says "(required)" instead."""

    def _get_help_string(self, action: argparse.Action) -> str:
        positive = getattr(action, "negates", None)
        if positive is not None:
            state = "on by default" if _is_on(positive.default) else "off here (a --config turned it off)"
            return f"{action.help}; {state}"
        if action.required:
            return f"{action.help} (required)" if action.help else "(required)"
        if action.default is None and "default" in (action.help or "").lower():
            return action.help or ""
        return super()._get_help_string(action) or ""


def _override_help(parser: argparse.ArgumentParser, help_texts: Mapping[str, str]) -> None:
    """Replace the help of the options named in ``help_texts`` (by field name) with this command's own: a field
    shared between commands (``RewardOptions.batch_size``, ``EncoderSpec.quantize``) describes what most of them do
    with it, and ``--help`` must not offer a value that this command refuses. An unknown name is an error (a
    renamed field would otherwise leave the old help in place without a word)."""
    options = {option: action for action in parser._actions for option in action.option_strings}
    unknown = [name for name in help_texts if f"--{name}" not in options]
    if unknown:
        raise ValueError(f"help_texts: {', '.join(unknown)} is not an option of {parser.prog}")
    for name, text in help_texts.items():
        options[f"--{name}"].help = text


def parse_args(
    types: Sequence[Any],
    argv: Sequence[str] | None = None,
    prog: str | None = None,
    help_texts: Mapping[str, str] | None = None,
) -> tuple[Any, ...]:
    """Instances of ``types`` from ``--config`` YAML (paths or shipped names; several merge in order) and flags,
    flags winning. Options are read from these alone: not from a ``<program>.args`` file (transformers' parser reads
    one by default), nor from an abbreviated flag (``--tune`` for ``--tuned``). ``help_texts`` (field name -> text,
    ``%`` written ``%%`` as argparse requires) gives an option this command's own ``--help`` line, where the
    dataclass's shared one would describe what another command does with it; parsing is unchanged."""
    from trl import TrlParser

    class Parser(TrlParser):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            _describe_negations(self)

        def set_defaults_with_config(self, **kwargs: Any) -> list[str]:
            return super().set_defaults_with_config(**_yaml_values(types, kwargs))

        def parse_args_into_dataclasses(self, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
            return super().parse_args_into_dataclasses(*args, **{**kwargs, "look_for_args_file": False})

    epilog = (
        f"--config FILE.yaml, or the name of a shipped config ({', '.join(shipped_configs())}), sets any of "
        "these options; flags override it."
    )
    with ExitStack() as stack:
        args = _resolve_configs(list(sys.argv[1:] if argv is None else argv), stack, types)
        parser = Parser(tuple(types), prog=prog, epilog=epilog, allow_abbrev=False, formatter_class=_HelpFormatter)
        _override_help(parser, help_texts or {})
        return tuple(parser.parse_args_and_config(args))

"""`pmi-reward <command> --help` for every command: each option has a help line, a generated ``--no_X`` says that it
turns X off (transformers' parser copied X's own help onto it: ``--no_normalize: L2-normalize embeddings (default:
False)``, the opposite of what the flag does), and a help that already says what an unset option does is not
followed by a second, contradicting "(default: None)" (train's ``--cache_dir`` printed two defaults)."""

from __future__ import annotations

import argparse
import contextlib
import functools
import io

import pytest

from pmi_reward.cli.main import COMMANDS, main
from pmi_reward.configs import parse_args

# prepare-models takes model names and prints one usage line (no argparse parser, no options)
PARSED = [command for command in COMMANDS if command != "prepare-models"]

# Options allowed without a help line, by command (none now). The test fails when one of them gains a help line: drop
# it from here then.
MISSING_HELP: dict[str, set[str]] = {}


def _flat(text: str) -> str:
    """Help text with argparse's line wrapping undone (one space between words)."""
    return " ".join(text.split())


def _help(argv: list[str]) -> tuple[argparse.ArgumentParser, str]:
    """The parser that ``pmi-reward ARGV`` (ending in ``--help``) built, and the help it printed."""
    seen: list[argparse.ArgumentParser] = []
    print_help = argparse.ArgumentParser.print_help

    def record(parser: argparse.ArgumentParser, file=None) -> None:
        seen.append(parser)
        print_help(parser, file)

    out = io.StringIO()
    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(out):
        patch.setattr(argparse.ArgumentParser, "print_help", record)
        with pytest.raises(SystemExit) as stop:
            main(argv)
    assert stop.value.code == 0 and len(seen) == 1, (argv, stop.value.code, seen)
    return seen[0], out.getvalue()


@functools.cache
def _command_help(command: str) -> tuple[argparse.ArgumentParser, str]:
    return _help([command, "--help"])


def _negations(parser: argparse.ArgumentParser) -> list[tuple[argparse.Action, argparse.Action]]:
    """(``--X``, ``--no_X``) pairs: the ``--no_X`` flags that transformers' parser generates for a boolean ``X``
    whose default is true (not an option named ``no_...`` of its own, such as ``--no_cache``)."""
    options = {option: action for action in parser._actions for option in action.option_strings}
    return [
        (options[f"--{action.dest}"], action)
        for action in parser._actions
        if isinstance(action, argparse._StoreFalseAction)
        and f"--no_{action.dest}" in action.option_strings
        and f"--{action.dest}" in options
    ]


@pytest.mark.parametrize("command", PARSED)
def test_every_option_has_a_help_line(command):
    parser, _ = _command_help(command)
    missing = {
        action.option_strings[0]
        for action in parser._actions
        if action.option_strings and action.help is not argparse.SUPPRESS and not (action.help or "").strip()
    }
    expected = MISSING_HELP.get(command, set())
    assert not missing - expected, f"pmi-reward {command} --help: no help line for {sorted(missing - expected)}"
    assert not expected - missing, f"{sorted(expected - missing)} have a help line now: drop them from MISSING_HELP"


@pytest.mark.parametrize("command", PARSED)
def test_no_flags_say_they_turn_their_option_off(command):
    parser, text = _command_help(command)
    flat = _flat(text)
    for positive, negation in _negations(parser):
        name = positive.dest
        assert (positive.help or "").strip() not in negation.help, f"{command} --no_{name} repeats --{name}'s help"
        shown = (
            f"--no_{name}, --no-{name.replace('_', '-')} turn off --{name} (the same as --{name} false); on by default"
        )
        assert shown in flat, (
            f"pmi-reward {command} --help: --no_{name} reads: {flat[flat.find(f'--no_{name},') :][:200]}"
        )
        assert f"{shown} (default: False)" not in flat


def test_the_reported_no_flags_are_described():
    """The flags the review quoted (train's and serve's) read as what they do."""
    train = _flat(_command_help("train")[1])
    for name in ("normalize", "pair_product", "progress"):
        assert f"turn off --{name} (the same as --{name} false); on by default" in train
    assert "L2-normalize embeddings (default: False)" not in train
    assert "--no-normalize L2-normalize" not in train
    serve = _flat(_command_help("serve")[1])
    assert "--no-strip-think turn off --strip_think (the same as --strip_think false); on by default" in serve


def test_no_flags_still_turn_their_option_off():
    from pmi_reward.training.job import ARGUMENTS

    def normalize(argv: list[str]) -> bool:
        return next(a.normalize for a in parse_args(ARGUMENTS, argv) if hasattr(a, "normalize"))

    assert normalize([]) is True
    assert normalize(["--no_normalize"]) is False
    assert normalize(["--no-normalize"]) is False
    assert normalize(["--normalize", "false"]) is False


def test_a_no_flag_says_when_a_config_turned_its_option_off(tmp_path):
    """``--config X --help`` shows the config's values as the defaults: ``--no_normalize`` must not then say that
    --normalize is on."""
    config = tmp_path / "off.yaml"
    config.write_text("normalize: false\n")
    _, text = _help(["train", "--config", "scorer/minilm", "--config", str(config), "--help"])
    flat = _flat(text)
    assert "turn off --normalize (the same as --normalize false); off here (a --config turned it off)" in flat
    assert "turn off --pair_product (the same as --pair_product false); on by default" in flat


def test_train_cache_dir_names_the_variable_and_one_default():
    flat = _flat(_command_help("train")[1])
    start = flat.index("--cache_dir CACHE_DIR, --cache-dir CACHE_DIR")
    entry = flat[start : flat.index("--no_cache", start)]
    assert "$PMI_REWARD_CACHE/embeddings" in entry and "~/.cache/pmi_reward/embeddings" in entry
    assert entry.count("(default") == 1, entry
    assert "(default: None)" not in entry


@pytest.mark.parametrize("command", PARSED)
def test_a_help_that_states_its_default_gets_no_second_one(command):
    """ "(default: by model type) (default: None)" read as two defaults; a default that says more than the help
    (the recommended scorer's, then "(default: outputs/scorer)") is still shown."""
    parser, _ = _command_help(command)
    formatter = parser._get_formatter()
    for action in parser._actions:
        if action.option_strings and action.default is None and "default" in (action.help or "").lower():
            rendered = formatter._expand_help(action)
            assert not rendered.endswith("(default: None)"), f"pmi-reward {command} {action.option_strings[0]}"
    if command == "score":
        scorer = _option_help("score", "--scorer")
        assert "`pmi-reward train --config scorer/recommended`" in scorer
        assert scorer.endswith("(default: outputs/scorer)") and scorer.count("(default:") == 1, scorer


def _option_help(command: str, flag: str) -> str:
    """``pmi-reward COMMAND --help``'s line for FLAG, as printed (default appended), one space between words."""
    parser, _ = _command_help(command)
    action = next(a for a in parser._actions if flag in a.option_strings)
    return _flat(parser._get_formatter()._expand_help(action))


def _exit_code(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as stop:  # argparse's own exit
        return stop.code if isinstance(stop.code, int) else 2


def test_serve_help_offers_only_what_serve_accepts(capsys):
    """``serve --help`` offered ``--empty_score`` None ("unscorable, zero advantage") and ``--batch_size`` as "pairs
    per scorer call" (the trainers' help, shared through RewardOptions), both refused by serve with exit 2: its help
    says what serve takes, while the trainers keep theirs."""
    empty, batch = _option_help("serve", "--empty_score"), _option_help("serve", "--batch_size")
    assert "None: unscorable" not in empty and "a number (None is refused" in empty, empty
    assert empty.endswith("(default: -5.0)"), empty
    assert "pairs per scorer call" not in batch and "not used by the server" in batch and "is refused" in batch, batch
    assert "(None: unscorable, zero advantage)" in _option_help("grpo", "--empty_score")
    assert _option_help("grpo", "--batch_size") == "pairs per scorer call (default: 256)"
    # what the help says is refused is refused, before any scorer loads
    assert _exit_code(["serve", "--scorer", "/nonexistent", "--empty_score", "none"]) == 2
    assert _exit_code(["serve", "--scorer", "/nonexistent", "--batch_size", "64"]) == 2
    err = capsys.readouterr().err
    assert "empty_score None" in err and "--batch_size 64 has no effect on the server" in err


def test_train_help_says_it_refuses_quantize():
    """``train --help`` offered ``--quantize int8 | int8-block`` (EncoderSpec's help, shared with the scoring
    commands), which training always refuses: a saved scorer never records it."""
    train = _option_help("train", "--quantize")
    assert "train refuses any value but none" in train and "int8 (dynamic int8" not in train, train
    assert train.endswith("(default: none)"), train
    assert "int8 | int8-block" in _option_help("score", "--quantize")  # a scoring command's help offers them


def test_help_texts_change_help_not_parsing():
    from pmi_reward.rewards.options import RewardOptions

    (options,) = parse_args((RewardOptions,), ["--batch_size", "64"], help_texts={"batch_size": "own words"})
    assert options.batch_size == 64
    with pytest.raises(ValueError, match="help_texts: batch is not an option of x"):
        parse_args((RewardOptions,), [], prog="x", help_texts={"batch": "a renamed field's override"})

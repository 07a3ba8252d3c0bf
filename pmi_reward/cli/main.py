"""``pmi-reward <command> [--config FILE.yaml] [--flag value ...] [--debug]``.

A user's mistake (a missing file, a bad column, an output that exists, a scorer that does not load) ends the
command with one line on stderr and exit code 2; ``--debug`` (anywhere on the line, or ``PMI_REWARD_DEBUG=1``)
shows the traceback instead. An unknown command, or none, is named on stderr below the usage (exit code 2);
``--help`` prints the usage on stdout (exit code 0). Ctrl-C ends a command with exit code 130 and SIGTERM (a
scheduler's stop, ``kill PID``) with 143, each after the command's ``finally`` blocks ran (its temporary files
removed) and with one line on stderr. A reader that closes stdout early (``| head``) ends the command quietly,
with exit code 141, as it ends a shell tool.
"""

from __future__ import annotations

import difflib
import importlib
import os
import select
import signal
import sys
import threading
import traceback
from collections.abc import Sequence
from types import FrameType

import yaml

COMMANDS = {
    "train": ("pmi_reward.cli.train", "train a PMIScore scorer on pairs or dialogues"),
    "score": ("pmi_reward.cli.score", "add a pmi column to a CSV/JSONL of (context, response) rows"),
    "serve": ("pmi_reward.cli.serve", "serve a scorer over HTTP (OpenRLHF /get_reward, /score, /rerank, /health)"),
    "evaluate": ("pmi_reward.cli.evaluate", "AUC against negatives and correlations with target columns, with CIs"),
    "rerank": ("pmi_reward.cli.rerank", "sort candidate replies by PMI (or sample n with a chat model: best-of-n)"),
    "prepare-models": ("pmi_reward.cli.prepare", "convert/locate the offline PyPI-shipped models once"),
    "grpo": ("pmi_reward.cli.grpo", "GRPO of a chat policy with PMIReward (TRL's GRPOTrainer)"),
    "rloo": ("pmi_reward.cli.rloo", "RLOO of a chat policy with PMIReward (TRL's RLOOTrainer)"),
    "ppo": ("pmi_reward.cli.ppo", "PPO of a chat policy with PMIReward (ours: value head, GAE, KL to the reference)"),
    "rft": ("pmi_reward.cli.rft", "rejection-sampling fine-tuning: sample n, keep the best by PMI, SFT, repeat"),
    "dpo": ("pmi_reward.cli.dpo", "iterative DPO: sample n, pair the best and worst by PMI, DPO (TRL), repeat"),
    "evaluate-policy": ("pmi_reward.cli.evaluate_policy", "engagement gain of tuned policies over their base"),
    "demo": ("pmi_reward.cli.demo", "the main job: scorers, a short GRPO run and its held-out engagement gain"),
}

# What a user's mistake raises: bad data, files and folders (DataError and ScorerLoadError are ValueErrors; a
# damaged weights file, embedding cache or ONNX export an OSError: DamagedWeightsError, CacheFileError), bad option
# values, a --config that is not YAML; anything else is a bug and keeps its traceback.
USER_ERRORS = (ValueError, OSError, ModuleNotFoundError, yaml.YAMLError)
USAGE = 2
INTERRUPTED, TERMINATED, BROKEN_PIPE = 130, 143, 141  # 128 + SIGINT, SIGTERM, SIGPIPE: what a shell reports


def _usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [f"  {name:<{width}}  {help_}" for name, (_, help_) in COMMANDS.items()]
    return (
        "usage: pmi-reward <command> [--config FILE.yaml] [options] [--debug]\n\ncommands:\n"
        + "\n".join(lines)
        + "\n\n`pmi-reward <command> --help` lists a command's options; --debug shows tracebacks."
    )


def _one_line(error: object) -> str:
    return " ".join(str(error).split()) or type(error).__name__


def _debug_from_env() -> bool:
    """``PMI_REWARD_DEBUG``: on unless unset, empty or one of 0, false, no, off (``=false`` turned it on)."""
    return os.environ.get("PMI_REWARD_DEBUG", "").strip().lower() not in ("", "0", "false", "no", "off")


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread as Ctrl-C raises KeyboardInterrupt. A subclass of it, so that what a
    Ctrl-C runs runs alike: ``finally`` blocks (temporary files removed), and the code that ends quietly on a
    KeyboardInterrupt (PyTorch's DataLoader workers). SIGTERM's default action ended the process at once, leaving
    hidden temporary files and folders of checkpoints and scorers behind."""


_HANDLER_PID: list[int] = []  # the process that set ``_raise_terminated`` (a forked child inherits the handler)


def _raise_terminated(signum: int, frame: FrameType | None) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM ends the process at once, as it did
    if _HANDLER_PID and _HANDLER_PID[-1] != os.getpid():
        # a forked worker (a multiprocessing Pool's, datasets.map(num_proc=...)'s) ended by its pool: SIGTERM's
        # default action, as before, not a "Terminated" traceback from each worker
        os.kill(os.getpid(), signal.SIGTERM)
        return
    raise Terminated()


def _terminate_on_sigterm() -> bool:
    """Make SIGTERM raise ``Terminated``, where it has its default action; False where it is left as it is: outside
    the main thread (no handler can be set there) or where the caller chose a handler of its own (or to ignore
    it). ``serve`` sets its own (drain, then exit 0) while it serves."""
    if threading.current_thread() is not threading.main_thread():
        return False
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return False
    signal.signal(signal.SIGTERM, _raise_terminated)
    _HANDLER_PID[:] = [os.getpid()]
    return True


def _stdout_closed() -> bool:
    """Whether stdout's reader has gone (``| head`` read its lines and exited): a BrokenPipeError from elsewhere (a
    socket, a subprocess's pipe) is an error like any other."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))
    except (AttributeError, OSError, ValueError):  # no poll() here, or stdout is no file (closed, replaced)
        return False


def _end_quietly() -> int:
    """Stdout's reader closed it: nothing of the user's went wrong, so no message, with or without ``--debug``.
    Stdout is pointed at /dev/null so that the flush at exit does not raise a second BrokenPipeError ("Exception
    ignored ..."). Exit code 141 (128 + SIGPIPE): what a shell tool (``cat``, ``grep``) that SIGPIPE ended reports,
    so that a caller under ``set -o pipefail`` treats ``pmi-reward ... | head`` as it treats theirs; not 0, as the
    output was not all delivered."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    finally:
        os.close(devnull)
    return BROKEN_PIPE


def _unknown(argv: Sequence[str]) -> str:
    """What is wrong with a command line that names no command, for the line below the usage."""
    if not argv:
        return "no command given"
    if argv[0].startswith("-"):
        return f"the command comes first, before the options (got {argv[0]!r})"
    close = difflib.get_close_matches(argv[0].lower(), COMMANDS, n=1)
    return f"unknown command {argv[0]!r}" + (f" (did you mean {close[0]!r}?)" if close else "")


def _run(command: str, argv: list[str], debug: bool) -> int:
    """``command`` on ``argv``, a user's mistake made one line on stderr (exit code 2)."""
    try:
        module = importlib.import_module(COMMANDS[command][0])
        code = module.main(argv) or 0
        sys.stdout.flush()  # here, not at exit: a reader gone by now is caught below, not "Exception ignored"
        return code
    except SystemExit as stop:
        if isinstance(stop.code, str):  # our own `raise SystemExit("message")`: exit code 2, --debug or not
            if debug:  # (uncaught, Python printed the message alone, no traceback, and exited 1)
                traceback.print_exc()
            print(f"pmi-reward {command}: {_one_line(stop.code)}", file=sys.stderr)
            return USAGE
        raise
    except USER_ERRORS as err:
        if isinstance(err, BrokenPipeError) and _stdout_closed():  # `| head`: main ends quietly
            raise
        if debug:
            raise
        print(f"pmi-reward {command}: {_one_line(err)} (--debug shows the traceback)", file=sys.stderr)
        return USAGE


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``pmi-reward`` on ``argv`` (by default the command line's) and return its exit code."""
    try:
        return _main(argv)
    except BrokenPipeError:
        if _stdout_closed():  # `| head`: the reader had what it wanted
            return _end_quietly()
        raise


def _main(argv: Sequence[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv or _debug_from_env()
    argv = [a for a in argv if a != "--debug"]
    if argv and argv[0] in ("-h", "--help"):
        print(_usage())
        return 0
    if not argv or argv[0] not in COMMANDS:  # on stderr: a script's redirected stdout would hide it
        print(_usage(), file=sys.stderr)
        print(f"\npmi-reward: {_unknown(argv)}", file=sys.stderr)
        return USAGE
    command = argv[0]
    handled = _terminate_on_sigterm()
    try:
        return _run(command, argv[1:], debug)
    except Terminated:
        print(f"pmi-reward {command}: terminated", file=sys.stderr)
        return TERMINATED
    except KeyboardInterrupt:
        print(f"pmi-reward {command}: interrupted", file=sys.stderr)
        return INTERRUPTED
    finally:
        if handled:  # an in-process caller (a test, a script) gets SIGTERM's default action back
            signal.signal(signal.SIGTERM, signal.SIG_DFL)


if __name__ == "__main__":
    sys.exit(main())

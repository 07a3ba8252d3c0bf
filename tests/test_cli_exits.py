"""How ``pmi-reward`` ends: exit codes and what goes to stdout and stderr when a scorer fails in ``rerank``, when the
reader of stdout closes it (``| head``), for an unknown command, for a typo in ``--backend/--dtype/--quantize``, in a
required option's help, on SIGTERM (and the checkpoint temporaries a killed save leaves), and on a Ctrl-C while the
package is imported (reviews 29 "cliux" 1, 3, 6, 7, 8 and "interrupts" 4, 5)."""

from __future__ import annotations

import importlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import types
from pathlib import Path

import pytest

from pmi_reward.cli import main as cli_main
from pmi_reward.cli import rerank as rerank_cli
from pmi_reward.cli.main import main
from pmi_reward.rewards.rerank import rerank
from pmi_reward.scoring.encoder import EncoderRuntime

ROOT = Path(__file__).resolve().parents[1]
CONTEXT = "I love jazz.\nMe too!\nWho is your favourite?"
CANDIDATES = ["Coltrane, no doubt.", "ok", "", "Miles Davis and Bill Evans."]


def _fake_command(monkeypatch: pytest.MonkeyPatch, run) -> None:
    """``pmi-reward fake`` runs ``run(argv)``: the CLI's ending of a command, whatever the command does."""
    module = types.ModuleType("_fake_pmi_command")
    module.main = run  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setitem(cli_main.COMMANDS, "fake", (module.__name__, "a test's command"))


def _child(body: str, *argv: str, **popen) -> subprocess.Popen:
    """A Python process whose ``pmi-reward fake`` runs ``body`` (the body of ``def run(argv)``), under
    ``pmi_reward.cli.main.main`` as the console script runs it; stdout and stderr piped, stdout block-buffered as
    a pipe's is (not PYTHONUNBUFFERED)."""
    code = textwrap.dedent(
        """
        import os, select, sys, time, types
        from pmi_reward.cli import main as cli
        def run(argv):
        {body}
        module = types.ModuleType("_fake_pmi_command"); module.main = run
        sys.modules[module.__name__] = module
        cli.COMMANDS["fake"] = (module.__name__, "a test's command")
        sys.exit(cli.main(["fake", *sys.argv[1:]]))
        """
    ).format(body=textwrap.indent(textwrap.dedent(body), "    "))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONUNBUFFERED", "PMI_REWARD_DEBUG")}
    return subprocess.Popen(
        [sys.executable, "-c", code, *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**env, "PYTHONPATH": str(ROOT)},
        **popen,
    )


# -- cliux 1: rerank's scorer errors propagate -----------------------------------------------------------------------


def test_rerank_cli_raises_when_the_scorer_fails(spread_scorer, tmp_path, monkeypatch):
    """A scorer that raised on every call gave every candidate ``"pmi": null``, ``"best": null`` and exit code 0:
    now the error propagates as in ``pmi-reward score`` (a traceback, exit code 1) and no output is written."""
    monkeypatch.setattr(rerank_cli.PMIScorer, "from_pretrained", staticmethod(lambda path, **k: spread_scorer))

    def broken(*args, **kwargs):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(spread_scorer, "score", broken)
    src, out = tmp_path / "rows.jsonl", tmp_path / "ranked.jsonl"
    src.write_text(json.dumps({"context": CONTEXT, "candidates": CANDIDATES}) + "\n")
    with pytest.raises(RuntimeError, match="illegal memory access"):
        main(["rerank", "--scorer", "x", "--input", str(src), "--output", str(out)])
    assert not out.exists()
    # the reward contract stays for library callers (trainers): a failed candidate is None, the call goes on
    assert [s for _, s in rerank(spread_scorer, CONTEXT, CANDIDATES)] == [None] * len(CANDIDATES)
    with pytest.raises(RuntimeError, match="illegal memory access"):
        rerank(spread_scorer, CONTEXT, CANDIDATES, strict=True)


def test_strict_rerank_gives_the_same_values(spread_scorer):
    """``strict`` changes what a failure does, nothing else: the same order and scores, unscorable ones None."""
    loose, strict = rerank(spread_scorer, CONTEXT, CANDIDATES), rerank(spread_scorer, CONTEXT, CANDIDATES, strict=True)
    assert [t for t, _ in strict] == [t for t, _ in loose] and strict[-1] == ("", None)
    assert [s for _, s in strict] == pytest.approx([s for _, s in loose], abs=1e-6)


# -- cliux 3: a reader that closes stdout ----------------------------------------------------------------------------

_PRINT_LINES = """
for n in range(20000):
    print(f"line {n} " + "x" * 60)
return 0
"""

# a line written, the rest left in the buffer until the reader has gone: the flush at exit met the closed pipe
_BUFFERED_UNTIL_CLOSED = """
sys.stdout.write("first\\n"); sys.stdout.flush()
sys.stdout.write("rest\\n")
poller = select.poll(); poller.register(sys.stdout.fileno(), select.POLLOUT)
deadline = time.monotonic() + 30
while not any(e & (select.POLLERR | select.POLLHUP) for _, e in poller.poll(50)) and time.monotonic() < deadline:
    pass
return 0
"""


@pytest.mark.parametrize(
    ("body", "debug"),
    [(_PRINT_LINES, []), (_PRINT_LINES, ["--debug"]), (_BUFFERED_UNTIL_CLOSED, [])],
    ids=["while printing", "while printing, --debug", "at exit"],
)
def test_a_closed_stdout_ends_quietly_with_141(body, debug):
    """``pmi-reward rerank | head -1`` printed "[Errno 32] Broken pipe (--debug shows the traceback)" with exit code 2
    (with ``--debug`` a BrokenPipeError traceback), and output held in the buffer until exit gave "Exception ignored
    ... BrokenPipeError" with exit code 120. Now: nothing on stderr, exit code 141 (128 + SIGPIPE), as a shell tool."""
    child = _child(body, *debug)
    assert child.stdout is not None and child.stderr is not None
    assert child.stdout.readline().startswith(b"line 0" if body is _PRINT_LINES else b"first")
    child.stdout.close()  # what `head -1` does once it has its line
    err = child.stderr.read().decode()
    assert child.wait(timeout=120) == 141, err
    assert err == ""


def test_a_broken_pipe_that_is_not_stdout_stays_an_error(monkeypatch, capsys):
    """Only stdout's reader going away is quiet: a BrokenPipeError from a socket or a subprocess is still reported."""

    def run(argv):
        raise BrokenPipeError(32, "Broken pipe")

    _fake_command(monkeypatch, run)
    assert main(["fake"]) == 2
    assert "pmi-reward fake: [Errno 32] Broken pipe" in capsys.readouterr().err


# -- cliux 6: an unknown command, or none ----------------------------------------------------------------------------


def test_an_unknown_command_is_named_on_stderr(capsys):
    """The usage went to stdout alone, exit code 2, without saying what was wrong (a script's redirected stdout hid
    it all)."""
    assert main(["scor", "--input", "x.csv", "--output", "y.csv"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("usage: pmi-reward <command>")
    assert err.rstrip().endswith("pmi-reward: unknown command 'scor' (did you mean 'score'?)"), err
    assert main(["frobnicate"]) == 2
    assert capsys.readouterr().err.rstrip().endswith("pmi-reward: unknown command 'frobnicate'")
    assert main([]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "usage: pmi-reward" in err and err.rstrip().endswith("pmi-reward: no command given")
    assert main(["--config", "x.yaml", "score"]) == 2
    assert "the command comes first" in capsys.readouterr().err
    for flag in ("--help", "-h"):  # asked for: stdout, exit code 0
        assert main([flag]) == 0
        out, err = capsys.readouterr()
        assert out.startswith("usage: pmi-reward <command>") and "  score " in out and err == ""


# -- cliux 7: --backend/--dtype/--quantize typos name the flag -------------------------------------------------------


def test_runtime_typos_name_the_flag_not_the_scorer(tiny_scorer_dir, tmp_path, capsys):
    """``--backend onxx`` read as "<scorer dir>: invalid scorer config (...)", blaming the saved scorer."""
    src = tmp_path / "pairs.jsonl"
    src.write_text(json.dumps({"context": "I went hiking.", "response": "Where?"}) + "\n")
    base = ["score", "--scorer", str(tiny_scorer_dir), "--input", str(src), "--output", str(tmp_path / "o.jsonl")]
    for flag, value, allowed in (
        ("backend", "onxx", "torch, onnx"),
        ("dtype", "bf16", "float32, bfloat16, float16, auto"),
        ("quantize", "int4", "none, int8, int8-block"),
    ):
        assert main([*base, f"--{flag}", value]) == 2
        err = capsys.readouterr().err
        assert f"pmi-reward score: --{flag} '{value}': expected one of {allowed}" in err, err
        assert "invalid scorer config" not in err and str(tiny_scorer_dir) not in err
        with pytest.raises(ValueError, match=f"--{flag} '{value}'"):
            EncoderRuntime(**{flag: value})
    assert EncoderRuntime().as_kwargs() == {}  # unset: the scorer's saved choices
    assert EncoderRuntime(backend="onnx", quantize="int8", dtype="auto").as_kwargs() == {
        "backend": "onnx",
        "quantize": "int8",
        "dtype": "auto",
    }


# -- cliux 8: required options' help ---------------------------------------------------------------------------------


def _entry(help_text: str, flag: str) -> str:
    """``flag``'s entry in argparse's option list, its wrapped lines joined (one space between words)."""
    lines = help_text[help_text.index("\noptions:\n") :].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"  {flag} "))
    end = next((i for i in range(start + 1, len(lines)) if not lines[i].startswith(" " * 4)), len(lines))
    return " ".join(" ".join(lines[start:end]).split())


@pytest.mark.parametrize(("command", "required"), [("score", ["--input", "--output"]), ("evaluate", ["--input"])])
def test_required_options_say_required_not_default_none(command, required, capsys):
    """``score --help`` gave ``--input`` and ``--output`` "(default: None)", which reads "optional, unset"."""
    with pytest.raises(SystemExit) as stop:
        main([command, "--help"])
    assert stop.value.code == 0
    text = capsys.readouterr().out
    for flag in required:
        entry = _entry(text, flag)
        assert entry.endswith("(required)") and "(default" not in entry, entry
    assert _entry(text, "--scorer").endswith("(default: outputs/scorer)")  # an optional one keeps its default


# -- interrupts 4: SIGTERM ends a command as Ctrl-C does -------------------------------------------------------------

# the real atomic_write, its write waiting for the signal: its `finally` must remove the hidden temporary file
_WRITE_UNTIL_SIGNALLED = """
from pathlib import Path
from pmi_reward.data.records import atomic_write
def write(tmp):
    Path(tmp).write_text("half")
    print("writing", flush=True)
    time.sleep(60)
atomic_write(Path(argv[0]) / "state.bin", write)
return 0
"""


def test_sigterm_runs_the_cleanup_and_exits_143(tmp_path):
    """SIGTERM (a scheduler's stop, ``kill PID``) ended the process at once (rc -15): the hidden temporary file of a
    checkpoint or scorer being saved stayed for good. Now it ends as Ctrl-C does: ``finally`` blocks run, one line
    on stderr, exit code 143 (Ctrl-C: 130)."""
    child = _child(_WRITE_UNTIL_SIGNALLED, str(tmp_path))
    assert child.stdout is not None and child.stderr is not None
    assert child.stdout.readline() == b"writing\n"
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]  # the write is under way
    child.send_signal(signal.SIGTERM)
    err = child.stderr.read().decode()
    assert child.wait(timeout=60) == 143, err
    assert err == "pmi-reward fake: terminated\n"
    assert list(tmp_path.iterdir()) == []  # no hidden leftover, and no half file in place


def test_ctrl_c_still_ends_with_130(monkeypatch, capsys):
    """Ctrl-C (KeyboardInterrupt) keeps its own line and exit code; it runs the same ``finally`` blocks."""
    cleaned = []

    def run(argv):
        try:
            raise KeyboardInterrupt
        finally:
            cleaned.append(True)

    _fake_command(monkeypatch, run)
    assert main(["fake"]) == 130 and cleaned == [True]
    assert capsys.readouterr().err == "pmi-reward fake: interrupted\n"


def test_main_gives_sigterm_back_and_leaves_a_callers_handler(monkeypatch):
    """In process (a test, a script calling ``main``), SIGTERM's default action is back after the command, and a
    handler the caller set stays in charge during it."""
    seen = []
    _fake_command(monkeypatch, lambda argv: seen.append(signal.getsignal(signal.SIGTERM)) or 0)
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    assert main(["fake"]) == 0
    assert seen[-1] not in (signal.SIG_DFL, signal.SIG_IGN) and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL

    def own(signum, frame):
        pass

    previous = signal.signal(signal.SIGTERM, own)
    try:
        assert main(["fake"]) == 0 and seen[-1] is own and signal.getsignal(signal.SIGTERM) is own
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_save_round_sweeps_the_temporaries_of_a_killed_save(tmp_path):
    """A SIGKILL during a checkpoint save left ``.train_state.safetensors.<hex>.tmp`` (the size of the checkpoint)
    beside it for good; the next save removes it, and nothing else of the folder."""
    import numpy as np
    import torch

    from pmi_reward.training.checkpoint import CHECKPOINT_NAME, save_round

    stale = tmp_path / f".{CHECKPOINT_NAME}.0a1b2c3d.tmp"
    stale.write_bytes(b"\0" * 1024)
    kept = [tmp_path / "notes.txt", tmp_path / ".other.safetensors.0a1b2c3d.tmp", tmp_path / f"{CHECKPOINT_NAME}.tmp"]
    for path in kept:
        path.write_text("mine")
    saved = torch.nn.ModuleDict({"head": torch.nn.Linear(2, 1)})
    optim = torch.optim.AdamW(saved.parameters())
    save_round(tmp_path, {"a": 1}, 1, saved, optim, (0.5, 1, saved.state_dict()), [], np.random.default_rng(0))
    assert not stale.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([CHECKPOINT_NAME, *(p.name for p in kept)])


# -- interrupts 5: Ctrl-C while the package is imported --------------------------------------------------------------


def _pyproject() -> dict:
    tomllib = pytest.importorskip("tomllib")
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def _console_entry() -> tuple[str, str]:
    """The module and function that pyproject.toml's ``pmi-reward`` console script runs."""
    target = _pyproject()["project"]["scripts"]["pmi-reward"]
    module, _, function = target.partition(":")
    return module, function


@pytest.mark.parametrize(("sig", "code", "word"), [("SIGINT", 130, "interrupted"), ("SIGTERM", 143, "terminated")])
def test_a_signal_while_the_package_imports_is_one_line(sig, code, word):
    """A Ctrl-C in the seconds ``import pmi_reward`` takes (torch) came before ``main``'s own handling: a traceback
    of 15-40 lines and the process ended by SIGINT (or, inside torch's C++ start-up, an abort); SIGTERM ended it
    without a word. The console script's entry now takes both signals for the import. The signal is sent as the
    commands' import starts (torch's, where the package's ``__init__`` imports it), in the console script that
    pyproject.toml declares."""
    module, function = _console_entry()
    code_text = textwrap.dedent(
        f"""
        import os, signal, sys

        # as in a terminal: a job started in the background (nohup, CI runners) inherits SIGINT ignored
        signal.signal(signal.SIGINT, signal.default_int_handler)

        class SignalOnTorch:  # the signal to this process as the commands' (or torch's) import begins
            @staticmethod
            def find_spec(name, path=None, target=None):
                if name in ("torch", "pmi_reward.cli.main"):
                    sys.meta_path.remove(SignalOnTorch)
                    os.kill(os.getpid(), signal.{sig})
                return None

        sys.meta_path.insert(0, SignalOnTorch)
        from {module} import {function}
        sys.exit({function}())
        """
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, "-c", code_text, "score", "--help"], capture_output=True, text=True, env=env)
    assert run.returncode == code, (run.returncode, run.stderr[-2000:])
    assert run.stderr == f"pmi-reward score: {word}\n" and run.stdout == ""


def test_the_console_entry_is_packaged_and_runs_the_cli(monkeypatch, capsys):
    """The entry is found by pyproject's package search (so the wheel ships it) and runs ``pmi_reward.cli.main``."""
    from setuptools import find_packages

    module, function = _console_entry()
    include = _pyproject()["tool"]["setuptools"]["packages"]["find"]["include"]
    assert module.split(".")[0] in find_packages(str(ROOT), include=include)
    entry = getattr(importlib.import_module(module), function)
    monkeypatch.setattr(sys, "argv", ["pmi-reward", "--help"])
    assert entry() == 0
    out, err = capsys.readouterr()
    assert out.startswith("usage: pmi-reward <command>") and err == ""


def test_the_package_names_its_public_api_lazily():
    """``import pmi_reward`` (and so the console entry's import) no longer imports torch; every public name still
    resolves, to the object of its module."""
    code_text = "import sys, pmi_reward.cli.entry; print('torch' in sys.modules)"
    run = subprocess.run([sys.executable, "-c", code_text], capture_output=True, text=True, check=True)
    assert run.stdout.strip() == "False"
    import pmi_reward

    assert pmi_reward.__all__ == sorted(pmi_reward._WHERE)
    for name in pmi_reward.__all__:
        module = importlib.import_module(pmi_reward._WHERE[name], "pmi_reward")
        assert getattr(pmi_reward, name) is getattr(module, name)
    with pytest.raises(AttributeError, match="no attribute 'PMIRewards'"):
        pmi_reward.PMIRewards  # noqa: B018


def test_subpackages_are_reached_from_the_package_as_before():
    """With the lazy ``__init__``, ``import pmi_reward; pmi_reward.data.pairs.join_turns`` (the README's form)
    raised AttributeError until a public name had been used."""
    code_text = "import pmi_reward; print(pmi_reward.data.pairs.join_turns(['a', 'b']) == 'a\\nb')"
    run = subprocess.run([sys.executable, "-c", code_text], capture_output=True, text=True, check=True)
    assert run.stdout.strip() == "True"


def test_a_forked_worker_ends_by_sigterm_as_before(capfd):
    """A Pool's workers inherit the command's SIGTERM handler; the pool ends them with SIGTERM, and each printed a
    ``Terminated`` traceback and exited 1. A forked child now takes SIGTERM's default action."""
    import multiprocessing
    import signal as signals

    assert cli_main._terminate_on_sigterm()
    try:
        fork = multiprocessing.get_context("fork")
        worker = fork.Process(target=time.sleep, args=(30,))
        worker.start()
        time.sleep(0.5)
        worker.terminate()  # SIGTERM
        worker.join(10)
    finally:
        signals.signal(signals.SIGTERM, signals.SIG_DFL)
    assert worker.exitcode == -signals.SIGTERM
    assert "Terminated" not in capfd.readouterr().err

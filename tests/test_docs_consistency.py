"""README.md and DEVELOPERS.md against the code and the records they summarise.

What the round-28 docs review found stated wrongly: the policy commands' default output folders (``evaluate-policy``
and ``demo`` were said to write to ``outputs/policies/<command>``) and the demo's scorer folders, replaced whole;
``outputs/scorer`` as the default of "the commands" while ``evaluate`` required ``--scorer``; the count of tuning
rounds in ``recipes/README.md``; the Intel demo times of ``docs/demo_runs.md``; and DEVELOPERS.md's folders
``train_policy/`` and ``configs/``, which are ``pmi_reward/policy/`` and ``pmi_reward/configs/``.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from pmi_reward.cli.main import main

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
FLAT_README = " ".join(README.split())
POLICY_COMMANDS = ("evaluate-policy", "grpo", "rloo", "ppo", "rft", "dpo", "demo")
NUMBERS = "one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen seventeen "
NUMBERS += "eighteen nineteen twenty twenty-one twenty-two twenty-three twenty-four twenty-five"
WORDS = {word: n for n, word in enumerate(NUMBERS.split(), 1)}


def _output_paragraph() -> str:
    """README's sentence on where the commands without ``--overwrite`` write, one space between words."""
    start = FLAT_README.index("`demo` have no `--overwrite`")
    return FLAT_README[start : FLAT_README.index("(give each run its own folder", start)]


def _parser(command: str) -> argparse.ArgumentParser:
    """The parser ``pmi-reward COMMAND --help`` builds."""
    seen: list[argparse.ArgumentParser] = []
    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(io.StringIO()):
        patch.setattr(argparse.ArgumentParser, "print_help", lambda parser, file=None: seen.append(parser))
        with pytest.raises(SystemExit):
            main([command, "--help"])
    return seen[0]


@pytest.mark.parametrize("command", POLICY_COMMANDS)
def test_readme_gives_each_policy_commands_default_output_dir(command):
    """An unset ``--output_dir`` is ``outputs/policies/<command>`` (``settle_output_dir``) unless the command has a
    default of its own, which the README must then name: ``evaluate-policy``'s was ``outputs/eval`` and ``demo``'s
    ``outputs/demo``, while the README said ``outputs/policies/<command>`` for both."""
    from pmi_reward.policy.trainers import POLICY_OUTPUTS

    default = next(a.default for a in _parser(command)._actions if a.dest == "output_dir") or (
        f"{POLICY_OUTPUTS}/{command}"
    )
    paragraph = _output_paragraph()
    assert "(default `outputs/policies/<command>`" in paragraph and POLICY_OUTPUTS == "outputs/policies"
    if default != f"outputs/policies/{command}":
        assert f"`{command}`'s `{default}`" in paragraph, f"README: {command}'s --output_dir is {default}: {paragraph}"


def test_readme_names_the_folders_the_demo_replaces_whole(monkeypatch, tmp_path):
    """The demo trains its scorers with ``train --overwrite``, which replaces each folder whole (a user's file in it
    is deleted), not "the files of the same names": the README names those folders."""
    from pmi_reward.policy import demo

    class Stop(Exception):
        """Raised where the GRPO stage would start: the scorer stages are what is checked."""

    trained: list[list[str]] = []

    def stop(*args, **kwargs):
        raise Stop

    monkeypatch.setattr(demo, "_train_scorer", trained.append)
    monkeypatch.setattr(demo, "PMIScorer", SimpleNamespace(from_pretrained=lambda *args, **kwargs: None))
    monkeypatch.setattr(demo, "rerank", lambda *args, **kwargs: [])
    monkeypatch.setattr(demo, "trl_main", stop)
    with pytest.raises(Stop), contextlib.redirect_stdout(io.StringIO()):
        demo.run_demo(demo.DemoArguments(output_dir=str(tmp_path)))
    replaced = [Path(argv[argv.index("--output_dir") + 1]).name for argv in trained if "--overwrite" in argv]
    assert len(replaced) == 3, trained
    paragraph = _output_paragraph()
    assert "`demo` its scorer folders" in paragraph and "whole, other files in them too" in paragraph, paragraph
    for name in replaced:
        assert f"`{name}`" in paragraph, f"README does not say that demo replaces {name}/ whole"


def _run(argv: list[str], capsys) -> tuple[int, str]:
    """Exit code and stderr of ``pmi-reward ARGV`` (argparse's own exit caught)."""
    try:
        code = main(argv)
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else 2
    return code, capsys.readouterr().err


def test_evaluate_looks_for_the_default_scorer_as_the_other_commands(tmp_path, monkeypatch, capsys):
    """README: ``outputs/scorer`` is "the default scorer ... of the commands" and "where the commands look by
    default"; ``evaluate`` required ``--scorer`` (exit 2, "the following arguments are required"). Without the
    folder it now ends as ``score`` does, with the same not-found line."""
    from pmi_reward.evaluation.scorer_report import EvaluateArguments
    from pmi_reward.scoring.scorer import DEFAULT_SCORER

    assert "the default scorer of PMIReward.from_pretrained() and of the commands" in README
    monkeypatch.chdir(tmp_path)  # no outputs/scorer here
    with open("pairs.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["context", "response", "dialog_key"])
        writer.writerows([f"line {i}\nturn {i}", f"reply {i}", f"d{i}"] for i in range(8))
    code, err = _run(["evaluate", "--input", "pairs.csv", "--no_progress"], capsys)
    score_code, score_err = _run(["score", "--input", "pairs.csv", "--output", "scored.csv"], capsys)
    assert (code, score_code) == (2, 2), err
    assert f"{DEFAULT_SCORER}: not a directory" in err, err
    assert err.replace("pmi-reward evaluate:", "pmi-reward score:") == score_err
    assert EvaluateArguments(input="pairs.csv").scorer == DEFAULT_SCORER  # Python's default is the command's


def test_readme_counts_the_tuning_rounds_that_recipes_readme_tables():
    """README said "Eighteen tuning rounds" while recipes/README.md's section 4 tables nineteen."""
    said = re.search(r"(\w+) tuning rounds of GRPO, RLOO, RFT, PPO and DPO trials", README)
    rows = re.findall(r"^\| (\d+) \| `sweep\d*\.sh`", (ROOT / "recipes" / "README.md").read_text(), re.M)
    assert said and rows
    assert [int(n) for n in rows] == list(range(1, len(rows) + 1)), rows
    assert WORDS[said.group(1).lower()] == len(rows), f"README: {said.group(0)!r}, recipes/README.md: {len(rows)}"


def test_readme_intel_demo_times_cover_every_recorded_run():
    """README's range of the Intel Xeon's demo runs (16.5-18.7 min) left out four of docs/demo_runs.md's records
    (19.2, 18.9, 19.1, and 21.1 beside other work): each recorded time is inside the range or named beside it."""
    said = re.search(r"On the Intel Xeon with AVX512-BF16: ([\d.]+)-([\d.]+) min([^)]*)\)", FLAT_README)
    assert said, "README gives no range for the Intel Xeon's demo runs"
    low, high, rest = float(said.group(1)), float(said.group(2)), said.group(3)
    record = (ROOT / "docs" / "demo_runs.md").read_text(encoding="utf-8")
    intel = record.split("## On an Intel Xeon with AVX512-BF16")[1].split("\n## ")[0]
    walls = [float(w) for w in re.findall(r"([\d.]+) min\s+wall\s+including\s+set-up", intel)]
    assert len(walls) >= 20, walls
    outside = [w for w in walls if not low <= w <= high and f"{w} " not in rest]
    assert not outside, f"README's {said.group(0)!r} leaves out {outside}"
    assert min(walls) == low


def test_developers_guides_folders_exist_or_say_where_they_are():
    """DEVELOPERS.md (the brief) names ``train_policy/`` and ``configs/``, which do not exist: a note says where
    they are, and those folders exist."""
    guide = (ROOT / "DEVELOPERS.md").read_text(encoding="utf-8")
    layout = guide[guide.index("- Layout shows the pipeline") :].split("\n- ")[0]
    named = set(re.findall(r"`([\w.]+/)`", layout)) | set(re.findall(r"\b(train_policy/)", guide))
    assert {"train_policy/", "configs/", "pmi_reward/"} <= named, named
    note = re.sub(r"\n>\s*", " ", guide)  # a block quote's lines joined
    moved = dict(re.findall(r"`([\w.]+/)`(?: \(below\))? is\s+`([\w./]+/)`", note))
    for folder in sorted(named):
        if not (ROOT / folder).is_dir():
            assert folder in moved, f"DEVELOPERS.md names {folder}, which does not exist, and not where it went"
            assert (ROOT / moved[folder]).is_dir(), f"DEVELOPERS.md: {folder} is {moved[folder]}, which does not exist"

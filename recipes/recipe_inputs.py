"""The recipe scripts' check of their input paths, made before any work: a missing path ends the script with status 2
and one line on stderr naming that path and what it should hold, where it ended in a traceback from deep inside a
loader (after the output folder was made, or a whole dataset's study had run).

A script imports it with the ``recipes/`` folder on ``sys.path`` (the scripts are run by path, not as modules)."""

from __future__ import annotations

import sys
from collections.abc import Iterable
from pathlib import Path
from typing import NoReturn

USAGE = 2  # the status of a user's mistake, as ``pmi-reward`` and argparse exit with

STUDY_DATA = (
    "the PMIScore paper authors' study data (../shared/data/pmiscore beside the checkout: see ../shared/README.md)"
)
SAMPLES_FILE = "an evaluation's samples.jsonl (pmi-reward evaluate-policy writes it in --output_dir)"
SCORER_FOLDER = "a saved scorer's folder (pmi-reward train writes it in --output_dir) or a Hub repo id org/name"


def _shown(path: Path) -> str:
    """``path`` as given, and where a relative one points from (the defaults are relative to the working folder)."""
    return str(path) if path.is_absolute() else f"{path} (from {Path.cwd()})"


def require_inputs(prog: str, expected: str, files: Iterable[str | Path], folder: str | Path | None = None) -> None:
    """Exit with status 2 and one stderr line ``PROG: PATH: no such file; EXPECTED`` for the first of ``files`` (under
    ``folder`` when given: a missing ``folder`` is named itself, not each file in it) that is not a file; return when
    all are. ``expected`` says what the option should hold, e.g. ``f"--data_dir should be {STUDY_DATA}"``."""
    problem = None
    if folder is not None and not Path(folder).is_dir():
        kind = "not a folder" if Path(folder).exists() else "no such folder"
        problem = f"{_shown(Path(folder))}: {kind}"
    else:
        for name in files:
            path = Path(folder) / name if folder is not None else Path(name)
            if not path.is_file():
                problem = f"{_shown(path)}: {'not a file' if path.exists() else 'no such file'}"
                break
    if problem is not None:
        _refuse(prog, problem, expected)


def _refuse(prog: str, problem: str, expected: str) -> NoReturn:
    """Exit with status 2 and the one stderr line ``PROG: PROBLEM; EXPECTED`` (its whitespace runs made one space)."""
    print(" ".join(f"{prog}: {problem}; {expected}".split()), file=sys.stderr)
    raise SystemExit(USAGE)


def require_samples(prog: str, paths: Iterable[str | Path], option: str = "SAMPLES") -> None:
    """``require_inputs`` for arguments that name an evaluation's samples files: exit 2 naming the first of ``paths``
    that is not a file. ``option`` names the argument(s) as the usage line shows them: ``SAMPLES``, ``each SAMPLES``
    (one argument taking several files) or two names joined by ``and`` (``FIXED and FRESH``: the line says "should
    each be")."""
    verb = "should each be" if " and " in option else "should be"
    expected = f"{option} {verb} {SAMPLES_FILE}"
    require_inputs(prog, expected, paths)


def require_scorer(prog: str, name: str, option: str = "SCORER") -> None:
    """Exit 2 with one line when ``name`` (a scorer argument, as ``PMIScorer.from_pretrained`` takes it) surely does
    not load, before any work; return when it is a scorer folder here or may be a Hub id.

    ``option`` is the positional ``SCORER``, or the option (``--judges``) whose ``NAME=DIR`` values ``name`` is one of.
    A name the loader reads as a folder (it exists, cannot be a Hub id, or is ``DEFAULT_SCORER``, ``outputs/scorer``,
    read as a folder even when missing) must hold ``config.json`` and ``head.safetensors``. Any other name is a Hub
    repo id to the loader, which offline (``HF_HUB_OFFLINE=1``) finds in the Hugging Face cache or fails on: a missing
    ``org/name`` or bare name (``judge``) the cache lacks is refused offline (a mistyped ``runs/scorer`` ended in
    ScorerLoadError's traceback). Online it is let through, the Hub answering as it loads."""
    from huggingface_hub import constants

    from pmi_reward.scoring.hub import looks_like_repo_id
    from pmi_reward.scoring.models import in_hub_cache
    from pmi_reward.scoring.scorer import CONFIG_NAME, DEFAULT_SCORER, WEIGHTS_NAME

    what = f"each {option} NAME=DIR should name" if option.startswith("-") else f"{option} should be"
    expected = f"{what} {SCORER_FOLDER}"
    if Path(name).exists() or not looks_like_repo_id(name) or name == DEFAULT_SCORER:
        require_inputs(prog, expected, [CONFIG_NAME, WEIGHTS_NAME], name)
    elif constants.HF_HUB_OFFLINE and not in_hub_cache(name):
        problem = (
            f"{_shown(Path(name))}: neither a folder here nor a Hub repo id in the Hugging Face cache "
            f"({constants.HF_HUB_CACHE}; HF_HUB_OFFLINE=1 downloads nothing)"
        )
        _refuse(prog, problem, expected)

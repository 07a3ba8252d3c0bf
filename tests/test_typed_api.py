"""The typed public API (``py.typed``) as a user's type checker reads it.

Review round 28 found parameter types narrower than what works at run time: ``device: str | None`` where a TRL or
accelerate script holds a ``torch.device`` (``trainer.accelerator.device``, ``policy.device``), ``main(argv:
list[str] | None)`` where ``main`` takes any sequence, and ``PMIScorer.embed`` with no return type (``Any`` to the
user). Here mypy, with the project's own config, checks a small user script that makes exactly those calls.

It also found every keyword option of the reward and scorer constructors typed ``**kwargs: Any``, so a misspelt or
mistyped option (``empty_scor=-5.0``, ``empty_score="-5"``) passed every checker and failed only at run time, on a
cluster. They are typed with PEP 692's ``Unpack`` of TypedDicts that mirror the fields and keyword tuples the code
checks at run time; the tests below hold the two equal and show mypy now reports such calls.
"""

from __future__ import annotations

import inspect
import subprocess
import sys
import textwrap
from dataclasses import fields
from pathlib import Path

import pytest
from typing_extensions import is_typeddict

from pmi_reward.rewards.options import RewardOptions, RewardOptionsKwargs
from pmi_reward.rewards.remote import RemoteKwargs, RemotePMIReward
from pmi_reward.rewards.reward import _LOADING, PretrainedRewardKwargs
from pmi_reward.scoring.encoder import RUNTIME_FIELDS, RuntimeKwargs
from pmi_reward.scoring.scorer import HUB_OPTIONS, HubKwargs, PMIScorer

ROOT = Path(__file__).resolve().parents[1]

USER_SCRIPT = """
    import torch

    from pmi_reward import PMIReward, PMIScorer
    from pmi_reward.cli.main import main
    from pmi_reward.rewards.remote import RemotePMIReward
    from pmi_reward.scoring.encoder import TextEncoder, default_device

    device = torch.device("cpu")  # as a trainer hands it over: trainer.accelerator.device
    scorer = PMIScorer.from_pretrained("outputs/scorer", device=device)
    PMIScorer.from_config(scorer.config(), {}, device=device)
    PMIReward.from_pretrained("outputs/scorer", device=device, empty_score=-5.0)
    PMIReward.from_pretrained(empty_score=None, center="group", revision="main", cache_dir=None, dtype="auto")
    PMIReward(scorer, scale=2.0, clip=None, max_context_turns=2)
    PMIReward.remote("http://rm-host:8000", timeout=5.0, api_key=None, center="group")
    RemotePMIReward("http://rm-host:8000", timeout=5.0, empty_score=None)
    PMIScorer.from_pretrained("outputs/scorer", dtype="auto", encode_batch_size=None, local_files_only=True)
    TextEncoder(scorer.encoder.spec, device=device)
    default_device(device)
    code: int = main(("score", "--input", "pairs.jsonl", "--output", "scored.jsonl"))


    def context_embeddings(scorer: PMIScorer) -> torch.Tensor:
        u, _ = scorer.embed(["hi"], ["hello"])
        return u  # --warn-return-any: an unannotated embed makes this Any
"""


def _mypy(tmp_path: Path, source: str) -> subprocess.CompletedProcess[str]:
    """mypy, with the project's config, on ``source`` as a user's script (the package read as installed)."""
    script = tmp_path / "user_script.py"
    script.write_text(textwrap.dedent(source), encoding="utf-8")
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--config-file",
            str(ROOT / "pyproject.toml"),
            "--cache-dir",
            str(tmp_path / "mypy_cache"),
            "--follow-imports=silent",  # the user's script only: the package's own check is `make lint`'s
            "--warn-return-any",
            str(script),
        ],
        cwd=ROOT,  # where `pmi_reward` is found (mypy does not follow an editable install's import hook)
        capture_output=True,
        text=True,
        timeout=300,
    )


# about 15 s (mypy reads torch's annotations from a cold cache): under the 30 s that would make it `integration`
def test_user_script_with_torch_device_and_tuple_argv_type_checks(tmp_path: Path) -> None:
    result = _mypy(tmp_path, USER_SCRIPT)
    assert result.returncode == 0, f"mypy rejects documented usage:\n{result.stdout}{result.stderr}"
    assert "Success: no issues found in 1 source file" in result.stdout


# each line a mistake that used to pass every checker and fail only at run time; the line's expected mypy message
MISTAKES = {
    "PMIReward.from_pretrained(empty_scor=-5.0)": 'Unexpected keyword argument "empty_scor"',
    'PMIReward.from_pretrained(empty_score="-5")': 'Argument "empty_score" to "from_pretrained" of "PMIReward" has '
    'incompatible type "str"',
    'PMIReward(scorer, centre="group")': 'Unexpected keyword argument "centre"',
    'PMIReward.remote("http://rm-host:8000", timout=5.0)': 'Unexpected keyword argument "timout"',
    'RemotePMIReward("http://rm-host:8000", scale="2")': 'Argument "scale" to "RemotePMIReward" has incompatible '
    'type "str"',
    'PMIScorer.from_pretrained("outputs/scorer", dtyp="auto")': 'Unexpected keyword argument "dtyp"',
}


# about 15 s, as the test above
def test_misspelt_or_mistyped_keyword_options_are_type_errors(tmp_path: Path) -> None:
    lines = list(MISTAKES)
    source = "\n".join(
        [
            "from pmi_reward import PMIReward, PMIScorer",
            "from pmi_reward.rewards.remote import RemotePMIReward",
            'scorer = PMIScorer.from_pretrained("outputs/scorer")',
            *lines,
        ]
    )
    result = _mypy(tmp_path, source)
    assert result.returncode == 1, f"mypy reported nothing:\n{result.stdout}{result.stderr}"
    for number, line in enumerate(lines, start=4):
        errors = [e for e in result.stdout.splitlines() if f"user_script.py:{number}: error:" in e]
        assert any(MISTAKES[line] in e for e in errors), f"line {number} ({line}) not reported:\n{result.stdout}"


def _keys(typed: type) -> set[str]:
    assert is_typeddict(typed)
    return set(typed.__required_keys__) | set(typed.__optional_keys__)


def _keyword_parameters(function: object, *, after: str) -> set[str]:
    """The named parameters of ``function`` that follow ``after`` (``**kwargs`` aside)."""
    names = [p.name for p in inspect.signature(function).parameters.values() if p.kind != p.VAR_KEYWORD]
    return set(names[names.index(after) + 1 :])


@pytest.mark.parametrize(
    ("typed", "mirrored"),
    [
        (RewardOptionsKwargs, {f.name for f in fields(RewardOptions)}),
        (RuntimeKwargs, set(RUNTIME_FIELDS)),
        (HubKwargs, set(HUB_OPTIONS)),
        # the keyword-only hub options of PMIScorer.from_pretrained itself
        (HubKwargs, _keyword_parameters(PMIScorer.from_pretrained, after="encoder")),
        (RemoteKwargs, {f.name for f in fields(RewardOptions)} | _keyword_parameters(RemotePMIReward, after="options")),
        (PretrainedRewardKwargs, {f.name for f in fields(RewardOptions)} | set(_LOADING) | set(RUNTIME_FIELDS)),
    ],
    ids=["RewardOptionsKwargs", "RuntimeKwargs", "HubKwargs", "HubKwargs-signature", "RemoteKwargs", "Pretrained"],
)
def test_keyword_typeddicts_mirror_what_the_code_checks_at_run_time(typed: type, mirrored: set[str]) -> None:
    """Each TypedDict's keys are the fields or keyword tuple it mirrors: an option added to one and not the other
    would be refused by a checker while it works, or pass a checker while it is refused."""
    assert _keys(typed) == mirrored

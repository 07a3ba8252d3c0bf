"""The typed public API (``py.typed``) as a user's type checker reads it.

Review round 28 found parameter types narrower than what works at run time: ``device: str | None`` where a TRL or
accelerate script holds a ``torch.device`` (``trainer.accelerator.device``, ``policy.device``), ``main(argv:
list[str] | None)`` where ``main`` takes any sequence, and ``PMIScorer.embed`` with no return type (``Any`` to the
user). Here mypy, with the project's own config, checks a small user script that makes exactly those calls.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

USER_SCRIPT = """
    import torch

    from pmi_reward import PMIReward, PMIScorer
    from pmi_reward.cli.main import main
    from pmi_reward.scoring.encoder import TextEncoder, default_device

    device = torch.device("cpu")  # as a trainer hands it over: trainer.accelerator.device
    scorer = PMIScorer.from_pretrained("outputs/scorer", device=device)
    PMIScorer.from_config(scorer.config(), {}, device=device)
    PMIReward.from_pretrained("outputs/scorer", device=device, empty_score=-5.0)
    TextEncoder(scorer.encoder.spec, device=device)
    default_device(device)
    code: int = main(("score", "--input", "pairs.jsonl", "--output", "scored.jsonl"))


    def context_embeddings(scorer: PMIScorer) -> torch.Tensor:
        u, _ = scorer.embed(["hi"], ["hello"])
        return u  # --warn-return-any: an unannotated embed makes this Any
"""


# about 15 s (mypy reads torch's annotations from a cold cache): under the 30 s that would make it `integration`
def test_user_script_with_torch_device_and_tuple_argv_type_checks(tmp_path: Path) -> None:
    script = tmp_path / "user_script.py"
    script.write_text(textwrap.dedent(USER_SCRIPT), encoding="utf-8")
    result = subprocess.run(
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
    assert result.returncode == 0, f"mypy rejects documented usage:\n{result.stdout}{result.stderr}"
    assert "Success: no issues found in 1 source file" in result.stdout

"""``pmi-reward serve`` as users run it: a clear refusal of a bad scorer directory; a real server that drains on
SIGTERM; a GRPO run whose reward comes from the server over loopback."""

import importlib.util
import math
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import http

from pmi_reward.cli.main import main

ROOT = Path(__file__).resolve().parents[1]


def test_serve_refuses_a_bad_scorer_dir(tmp_path, capsys):
    assert main(["serve", "--scorer", str(tmp_path / "missing")]) == 2
    assert "not a directory" in capsys.readouterr().err
    (tmp_path / "config.json").write_text("{broken")
    assert main(["serve", "--scorer", str(tmp_path)]) == 2
    assert "corrupted" in capsys.readouterr().err


def test_serve_refuses_empty_score_none_before_loading_the_scorer(tmp_path, capsys):
    """``--empty_score none`` was accepted, and /get_reward then answered null rewards, which end an OpenRLHF run
    (``torch.tensor([None])``). Refused with a message saying why, before the scorer (here a missing one) loads."""
    assert main(["serve", "--scorer", str(tmp_path / "missing"), "--empty_score", "none"]) == 2
    err = capsys.readouterr().err
    assert "empty_score None" in err and "OpenRLHF" in err and "not a directory" not in err


def test_serve_refuses_batch_size_which_it_would_ignore(tmp_path, capsys):
    """``--batch_size`` was accepted and did nothing (the server batches by ``--max_batch_pairs``): refused, naming
    the options that do batch, before the scorer (here a missing one) loads."""
    assert main(["serve", "--scorer", str(tmp_path / "missing"), "--batch_size", "16"]) == 2
    err = capsys.readouterr().err
    assert "--batch_size 16 has no effect" in err and "--max_batch_pairs" in err and "not a directory" not in err


def test_serve_help_says_include_system_reads_a_templates_default_system_prompt(capsys):
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    assert "holds the template's own default system prompt" in " ".join(capsys.readouterr().out.split())


def test_serve_strips_a_key_files_newline_and_refuses_a_bad_key_unshown(tmp_path, capsys, monkeypatch):
    """``$PMI_REWARD_API_KEY`` read from a secret file ends with a newline, which was refused; it is stripped now
    (here serve goes on to load the scorer, a missing one). A key no header can carry is refused naming the
    variable, never the key."""
    monkeypatch.setenv("PMI_REWARD_API_KEY", "s3cret-key\n")
    assert main(["serve", "--scorer", str(tmp_path / "missing")]) == 2
    assert "not a directory" in capsys.readouterr().err
    monkeypatch.setenv("PMI_REWARD_API_KEY", "s3cret key")
    assert main(["serve", "--scorer", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert "$PMI_REWARD_API_KEY must be printable ASCII" in err and "s3c" not in err and "not a directory" not in err


@pytest.mark.integration
def test_serve_answers_then_drains_on_sigterm(tmp_path):
    from pmi_reward.scoring.encoder import EncoderSpec, TextEncoder
    from pmi_reward.scoring.head import HeadConfig, PMIHead
    from pmi_reward.scoring.scorer import PMIScorer
    from pmi_reward.scoring.templates import TEMPLATES

    encoder = TextEncoder(EncoderSpec("minilm"), device="cpu")
    torch.manual_seed(0)
    PMIScorer(encoder, TEMPLATES["en"], PMIHead(HeadConfig(dim=encoder.dim))).save_pretrained(tmp_path / "s")
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pmi_reward.cli.main",
            "serve",
            "--scorer",
            str(tmp_path / "s"),
            "--port",
            "0",
            "--device",
            "cpu",
        ],
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        url = next(m.group(1) for line in server.stderr if (m := re.search(r"listening on (http://\S+)", line)))
        assert http(url, "GET", "/health")[1]["scorer"]["encoder"] == "minilm"
        body = {"query": ["I love jazz.\nMe too!"], "prompts": ["I love jazz.\n"]}
        status, answer = http(url, "POST", "/get_reward", body)
        assert status == 200 and len(answer["rewards"]) == 1 and math.isfinite(answer["rewards"][0])
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=60) == 0
        assert "SIGTERM received, draining" in (log := server.stderr.read()) and "stopped" in log
    finally:
        server.kill()
        server.stderr.close()


@pytest.mark.integration
def test_grpo_gets_its_reward_from_the_server(reward_server, tmp_path):
    spec = importlib.util.spec_from_file_location("grpo_smoke", ROOT / "recipes/remote_reward/grpo_smoke.py")
    recipe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(recipe)
    from pmi_reward.scoring.models import load_tokenizer

    tokenizer = load_tokenizer("smollm2")
    before = reward_server.batcher.stats.requests
    prompts = [[{"role": "user", "content": "I love jazz."}], [{"role": "user", "content": "I ran ten miles today!"}]]
    history = recipe.train_grpo(
        reward_server.url,
        recipe.tiny_policy(tokenizer),
        tokenizer,
        prompts,
        steps=1,
        num_generations=2,
        max_completion_length=8,
        output_dir=str(tmp_path),
    )
    logged = next(h for h in history if "rewards/pmi_remote/mean" in h)
    assert math.isfinite(logged["rewards/pmi_remote/mean"]) and logged["pmi_remote/empty_frac"] < 1
    assert reward_server.batcher.stats.requests > before

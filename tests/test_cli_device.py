"""``score``, ``rerank`` and ``evaluate`` take ``--device`` as ``serve`` does. Without it they loaded the scorer onto
the GPU wherever there was one: on a node whose GPU was full or another job's they failed there, with no way to stay
on the CPU but hiding the GPU (``CUDA_VISIBLE_DEVICES=``). A device this machine lacks is refused in serve's one line
(exit code 2) before any model loads; ``--device cpu`` keeps the scorer, and ``rerank``'s ``--model``, on the CPU of
a machine with a GPU."""

from __future__ import annotations

import json

import pytest
import torch

from pmi_reward.cli.main import main
from pmi_reward.policy import loading
from pmi_reward.scoring.scorer import PMIScorer

COMMANDS = ("score", "rerank", "evaluate")
CONTEXT = "I went hiking last weekend.\nWhere did you go?\nYosemite, up to Half Dome."


def _argv(command: str, scorer, tmp_path) -> list[str]:
    """A command line of ``command`` that would run to the end: each input exists and is valid, so that only the
    device can stop it. ``rerank`` samples its row's candidates with ``--model`` (a policy load, checked too)."""
    if command == "score":
        rows = tmp_path / "pairs.jsonl"
        rows.write_text(
            json.dumps({"context": CONTEXT, "response": "Did you see Half Dome?"})
            + "\n"
            + json.dumps({"context": "I cook.", "response": "What do you cook?"})
            + "\n"
        )
        out = tmp_path / "scored.jsonl"
        return ["score", "--scorer", str(scorer), "--input", str(rows), "--output", str(out), "--no_cache"]
    if command == "rerank":
        rows = tmp_path / "contexts.jsonl"
        rows.write_text(json.dumps({"context": CONTEXT}) + "\n")
        out = tmp_path / "ranked.jsonl"
        argv = ["rerank", "--scorer", str(scorer), "--input", str(rows), "--output", str(out), "--model", "m"]
        return [*argv, "--n", "2", "--no_cache", "--progress", "false"]
    pairs = tmp_path / "pairs.csv"
    pairs.write_text("context,response\n" + "".join(f"I like topic {i}.,Tell me about {i}!\n" for i in range(6)))
    out = tmp_path / "eval.json"
    argv = ["evaluate", "--scorer", str(scorer), "--input", str(pairs), "--output", str(out), "--no_cache"]
    return [*argv, "--k_random", "1", "--k_context", "0", "--n_boot", "10", "--progress", "false"]


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize(
    ("device", "message"),
    [
        ("gpu", "--device gpu: not a device; expected cpu, cuda, cuda:N or mps"),
        ("cuda", "--device cuda: this machine has no CUDA device (torch sees none); use --device cpu"),
    ],
)
def test_a_device_this_machine_lacks_is_refused_before_anything_loads(
    command, device, message, tmp_path, tiny_scorer_dir, capsys, monkeypatch
):
    """``--device gpu`` (no device name), or ``cuda`` on a machine without one: serve's one line on stderr and exit
    code 2, before the scorer (or rerank's --model) loads and before any output is written."""

    def forbidden(*args, **kwargs):
        raise AssertionError("a model was loaded before --device was checked")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(PMIScorer, "from_pretrained", forbidden)
    monkeypatch.setattr(loading, "load_policy", forbidden)
    argv = _argv(command, tiny_scorer_dir, tmp_path)
    assert main([*argv, "--device", device]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"pmi-reward {command}: {message}"), err
    assert not any(p.name in ("scored.jsonl", "ranked.jsonl", "eval.json") for p in tmp_path.iterdir())


@pytest.mark.parametrize("command", COMMANDS)
def test_device_cpu_runs_the_command_on_the_cpu_of_a_gpu_machine(
    command, gpu_machine, tmp_path, tiny_scorer_dir, smol_tokenizer, capsys, monkeypatch
):
    """``--device cpu`` reaches the scorer's loader (and rerank's policy loader: --model follows --device), whose
    encoder then runs on the CPU though the machine has a GPU; the command runs to its end and writes its output."""
    import pmi_reward.cli.rerank as rerank_cli

    real = PMIScorer.from_pretrained.__func__
    loaded: list[PMIScorer] = []
    policy_devices: list[str | None] = []

    def load_scorer(cls, *args, **kwargs):
        loaded.append(real(cls, *args, **kwargs))
        return loaded[-1]

    def load_policy(name, dtype="float32", attn_implementation=None, device=None):
        policy_devices.append(device)
        return None, smol_tokenizer

    monkeypatch.setattr(PMIScorer, "from_pretrained", classmethod(load_scorer))
    monkeypatch.setattr(loading, "load_policy", load_policy)
    monkeypatch.setattr(rerank_cli, "sample_replies", lambda m, t, prompts, n, s, d: [["Half Dome?", "Nice."]])
    assert main([*_argv(command, tiny_scorer_dir, tmp_path), "--device", "cpu"]) == 0, capsys.readouterr().err
    assert [s.encoder.device for s in loaded] == [torch.device("cpu")]
    assert policy_devices == (["cpu"] if command == "rerank" else [])
    if command == "score":
        scored = [json.loads(line) for line in (tmp_path / "scored.jsonl").read_text().splitlines()]
        expected = PMIScorer.from_pretrained(tiny_scorer_dir, device="cpu").score(
            [CONTEXT, "I cook."], ["Did you see Half Dome?", "What do you cook?"]
        )
        assert [r["pmi"] for r in scored] == pytest.approx(expected.tolist(), abs=1e-5)
    elif command == "rerank":
        row = json.loads((tmp_path / "ranked.jsonl").read_text())
        assert sorted(r["text"] for r in row["ranked"]) == ["Half Dome?", "Nice."] and row["best"]
    else:
        assert "auc" in json.dumps(json.loads((tmp_path / "eval.json").read_text())).lower()

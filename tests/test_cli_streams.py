"""What the commands write where: the policy commands' stdout holds only their JSON (transformers' logged steps go to
stderr), evaluate-policy's warnings go to stderr, a plain grpo run on a CPU warns of nothing its user did not set,
TRL renders the prompts with the pinned chat-template date (as the LM judges do), and progress bars redraw every
0.1 s on a terminal but every 30 s in a log."""

from __future__ import annotations

import copy
import datetime as dt
import importlib.resources
import io
import json
import time
import warnings

import pytest
import torch
import transformers.utils.chat_template_utils as chat_template_utils
from trl import GRPOTrainer

from pmi_reward import progress as progress_module
from pmi_reward.policy import trainers
from pmi_reward.policy.sampling import CHAT_TEMPLATE_KWARGS

PINNED = "26 Jul 2024"
# what a CPU-only grpo run warned of, none of it set by its user: TRL's default under transformers 5's deprecated
# name, TRL's and peft's calls of the renamed methods, and torch's pin_memory without an accelerator
UNACTIONABLE = ("gradient_checkpointing", "pin_memory")


def _common(policy_dir, prompt_file, tiny_scorer_dir, out) -> list[str]:
    return [
        "--model_name_or_path",
        str(policy_dir),
        "--prompt_file",
        str(prompt_file),
        "--scorer",
        str(tiny_scorer_dir),
        "--output_dir",
        str(out),
        "--report_to",
        "none",
        "--logging_steps",
        "1",
        "--bf16",
        "false",  # README's setting on a CPU (no --use_cpu, which turns pin_memory off itself)
    ]


def reply_length(prompts, completions, **kwargs) -> list[float]:
    """A reward function by name for rft/dpo's command: each reply's length in characters."""
    return [float(len(c[0]["content"] if isinstance(c, list) else c)) for c in completions]


def _unactionable(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if any(word in str(w.message) for word in UNACTIONABLE)]


def test_grpo_prints_only_its_summary_warns_of_nothing_unset_and_pins_the_date(
    policy_dir, prompt_file, tiny_scorer_dir, tmp_path, capsys, monkeypatch
):
    """`pmi-reward grpo > summary.json` holds the run summary alone (transformers' logged steps, written with
    tqdm.write, went to stdout first); no FutureWarning about gradient checkpointing (TRL's default, TRL's calls)
    nor torch's pin_memory warning, while the run checkpoints activations as TRL's default sets; TRL renders the
    prompts with the pinned date, the user's own template keywords kept beside it."""
    from pmi_reward.cli import grpo

    built = []

    class Recording(GRPOTrainer):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            built.append(self)

    monkeypatch.setattr(grpo, "GRPOTrainer", Recording)
    out = tmp_path / "out"
    argv = [
        *_common(policy_dir, prompt_file, tiny_scorer_dir, out),
        "--max_steps",
        "2",
        "--per_device_train_batch_size",
        "4",
        "--num_generations",
        "4",
        "--max_completion_length",
        "4",
        "--chat_template_kwargs",
        '{"enable_thinking": false}',
    ]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert grpo.main(argv) == 0
    printed = capsys.readouterr()
    assert json.loads(printed.out) == json.loads((out / "run_summary.json").read_text())
    assert "'loss'" in printed.err  # the logged steps: on stderr, beside the bars
    assert _unactionable(caught) == []
    (trainer,) = built
    assert trainer.args.activation_checkpointing is True and trainer.args.gradient_checkpointing is True
    assert trainer.chat_template_kwargs == {"date_string": PINNED, "enable_thinking": False}
    # run_args.json keeps the settings as given, for a resume to compare
    assert json.loads((out / "run_args.json").read_text())["trainer"]["chat_template_kwargs"] == {
        "enable_thinking": False
    }


@pytest.mark.parametrize("command", ["rft", "dpo"])
def test_rft_and_dpo_print_only_their_round_rows_and_summary(
    command, policy_dir, prompt_file, tiny_scorer_dir, tmp_path, capsys
):
    """Each round's row is one JSON line on stdout, then the run summary; TRL's SFT/DPO logs go to stderr."""
    from pmi_reward.cli import dpo, rft

    out = tmp_path / "out"
    argv = [
        *_common(policy_dir, prompt_file, tiny_scorer_dir, out),
        "--rounds",
        "1",
        "--prompts_per_round",
        "2",
        "--samples_per_prompt",
        "4",
        "--rollout_max_new_tokens",
        "4",
        "--drop_truncated",
        "false",  # a random tiny policy rarely stops within 4 tokens
        "--extra_reward_funcs",
        "test_cli_streams:reply_length",  # the tiny scorer's PMI sits at its cap: DPO needs unequal scores
        "--max_steps",
        "1",
        "--per_device_train_batch_size",
        "2",
        "--save_strategy",
        "no",
    ]
    assert {"rft": rft, "dpo": dpo}[command].main(argv) == 0
    printed = capsys.readouterr()
    first, rest = printed.out.split("\n", 1)
    assert json.loads(first) == json.loads((out / "rft_log.jsonl").read_text())
    assert json.loads(rest) == json.loads((out / "run_summary.json").read_text())
    assert "'loss'" in printed.err


def test_evaluate_policy_warnings_go_to_stderr(tmp_path, monkeypatch, tiny_policy, smol_tokenizer, tiny_scorer, capsys):
    """A judge reading replies with the base's own LM, and a samples file without its results.json: WARNING lines on
    stderr (the start-mismatch warning already was), still in results.md; stdout holds the report alone."""
    from pmi_reward.policy import evaluate
    from pmi_reward.policy.panel import Judge
    from pmi_reward.policy.sampling import SamplingSettings

    monkeypatch.setattr(evaluate, "_check_options", lambda *a: {})  # no judge folders to check
    monkeypatch.setattr(evaluate, "load_policy", lambda name: (tiny_policy(0), smol_tokenizer))
    args = evaluate.EvalArguments(
        tuned=[str(tmp_path / "tuned")], samples=1, output_dir=str(tmp_path / "eval"), kl=False
    )
    judge = Judge("lm", "x", tiny_scorer, {"method": "lm_pmi", "encoder": args.base_model})
    monkeypatch.setattr(evaluate, "load_judges", lambda *a: ([judge], None, None))
    prompt_path = tmp_path / "prompts.jsonl"
    prompt_path.write_text("\n".join(json.dumps({"prompt": f"A: I love topic {i}.\nB:"}) for i in range(2)))
    prompts = evaluate.EvalPromptArguments(prompt_file=str(prompt_path), max_prompts=None)
    evaluate.run_evaluation(prompts, args, SamplingSettings(max_new_tokens=2, seed=1))
    printed = capsys.readouterr()
    warning = "WARNING: judge lm reads replies with the base policy's own LM"
    assert warning in printed.err
    assert not [line for line in printed.out.splitlines() if line.startswith("WARNING")]  # in the report alone
    assert warning.removeprefix("WARNING: ") in (tmp_path / "eval" / "results.md").read_text()

    samples = tmp_path / "old" / "samples.jsonl"  # no results.json beside it
    samples.parent.mkdir()
    evaluate.samples_band(str(samples), evaluate.EvalPromptArguments())
    printed = capsys.readouterr()
    assert printed.out == "" and printed.err.startswith(f"WARNING: {samples}: no readable contexts record")
    (samples.parent / "results.json").write_text(json.dumps({"prompts": {"first_dialogue": 3400}}))
    evaluate.samples_band(str(samples), evaluate.EvalPromptArguments())
    printed = capsys.readouterr()
    assert printed.out == "" and printed.err.startswith(f"note: {samples}'s contexts came from")


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_bars_redraw_every_tenth_of_a_second_on_a_terminal_and_every_30_s_in_a_log(monkeypatch):
    """The interval follows stderr (or the bar's own file); TQDM_MININTERVAL and TQDM_DISABLE, read at each bar,
    win over the defaults and over the caller's ``disable=False``."""
    monkeypatch.delenv("TQDM_MININTERVAL", raising=False)
    monkeypatch.delenv("TQDM_DISABLE", raising=False)
    monkeypatch.setattr("sys.stderr", io.StringIO())
    bar = progress_module.progress_bar(range(3), "x", disable=False)
    assert (bar.mininterval, bar.maxinterval) == (30.0, 30.0)  # tqdm's monitor would redraw every 10 s
    monkeypatch.setattr("sys.stderr", _Terminal())
    bar = progress_module.progress_bar(range(3), "x", disable=False)
    assert (bar.mininterval, bar.maxinterval) == (0.1, 10.0)
    assert progress_module.progress_bar(range(3), file=io.StringIO()).mininterval == 30.0  # its own file
    monkeypatch.setenv("TQDM_MININTERVAL", "5")
    assert progress_module.progress_bar(range(3), disable=False).mininterval == 5.0
    assert not progress_module.progress_bar(range(3), disable=False).disable
    monkeypatch.setenv("TQDM_DISABLE", "1")
    assert progress_module.progress_bar(range(3), disable=False).disable


def test_scoring_writes_a_bar_record_per_30_s_in_a_log_not_ten_a_second(tiny_scorer, monkeypatch, capsys):
    """PMIScorer.score's bar in a log (capsys's stderr is no terminal): 6 blocks of 0.15 s were 7 redraws at
    tqdm's 0.1 s; at 30 s only the first draw and the last remain."""
    from pmi_reward.scoring import scorer as scorer_module

    monkeypatch.delenv("TQDM_MININTERVAL", raising=False)
    monkeypatch.delenv("TQDM_DISABLE", raising=False)
    monkeypatch.setattr(scorer_module, "SCORE_BLOCK", 1)
    embed = scorer_module.PMIScorer.embed

    def slow(self, *args, **kwargs):
        time.sleep(0.15)
        return embed(self, *args, **kwargs)

    monkeypatch.setattr(scorer_module.PMIScorer, "embed", slow)
    capsys.readouterr()
    tiny_scorer.score([f"I love topic {i}." for i in range(6)], ["Me too!"] * 6, progress=True)
    records = [r for r in capsys.readouterr().err.split("\r") if "scoring" in r]
    assert 1 <= len(records) <= 2, records


def test_the_samplers_bar_is_the_helpers(tiny_policy, smol_tokenizer, monkeypatch):
    """generate_replies draws its bar with ``progress_bar``: in a log, every 30 s."""
    from pmi_reward.policy.sampling import SamplingSettings, generate_replies

    made = []
    real = progress_module.tqdm

    class Spy(real):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.delenv("TQDM_MININTERVAL", raising=False)
    monkeypatch.setattr(progress_module, "tqdm", Spy)
    monkeypatch.setattr("sys.stderr", io.StringIO())
    generate_replies(tiny_policy(0), smol_tokenizer, ["A: hi\nB:"], 1, SamplingSettings(max_new_tokens=2), True)
    assert [(b.desc, b.mininterval) for b in made] == [("sampling", 30.0)]


@pytest.mark.parametrize("command", ["grpo", "rloo", "rft", "dpo"])
def test_the_configs_settle_what_warned_without_changing_the_run(command, monkeypatch):
    """TRL's default gradient checkpointing, read under its new name (no deprecation warning), stays on, and one
    the user turned off stays off; pin_memory is off only where torch finds no accelerator (it warned there)."""
    from pmi_reward.cli import grpo, rloo
    from pmi_reward.policy import rft

    config_cls = {
        "grpo": grpo.GRPOConfig,
        "rloo": rloo.RLOOConfig,
        "rft": rft.RFTSFTConfig,
        "dpo": rft.RFTDPOConfig,
    }[command]
    base = dict(output_dir="unused", bf16=False, report_to=[])  # use_cpu turns pin_memory off itself
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        config = config_cls(**base)
    assert _unactionable(caught) == []
    assert config.activation_checkpointing is True and config.gradient_checkpointing is True
    assert config.dataloader_pin_memory is False
    assert config_cls(**base, activation_checkpointing=False).gradient_checkpointing is False
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: True)
    assert config_cls(**base).dataloader_pin_memory is True
    # a resume on a machine with an accelerator (pinned) of a run begun without one compares the same settings
    assert (
        "dataloader_pin_memory"
        not in trainers.run_settings(trainers.ScriptArguments(scorer="unused"), None, config, None)["trainer"]
    )


class _Clock(dt.datetime):
    """transformers' clock for the templates' ``strftime_now``, set to a day that is not the pinned one."""

    @classmethod
    def now(cls, tz=None):
        return cls(2026, 11, 29)


def test_the_lm_judges_render_the_pinned_date(smol_tokenizer, tiny_policy, monkeypatch):
    """LM PMI's and MEEP's prompts, under a Llama 3.x template (it writes today's date into the system header),
    are the same on any day: the date is the package's pinned one."""
    from pmi_reward.evaluation.baselines.lm_pmi import LMPMIConfig, LMPMIScorer
    from pmi_reward.evaluation.baselines.meep import MEEPScorer

    monkeypatch.setattr(chat_template_utils, "datetime", _Clock)
    tok = copy.deepcopy(smol_tokenizer)
    tok.chat_template = (importlib.resources.files("trl") / "chat_templates" / "llama3_2.jinja").read_text()
    assert CHAT_TEMPLATE_KWARGS["date_string"] == PINNED
    lm = LMPMIScorer(LMPMIConfig(), model=tiny_policy(0), tokenizer=tok)
    for context in ("I love jazz.", None):  # p(r | c) and p(r), both under the system prompt
        text = tok.decode(lm.prefix(context))
        assert f"Today Date: {PINNED}" in text and "29 Nov 2026" not in text
    meep = MEEPScorer(model=tiny_policy(0), tokenizer=copy.deepcopy(tok))
    (prompt,) = meep.prompts(["I love jazz."], ["Me too!"])
    assert f"Today Date: {PINNED}" in prompt and "29 Nov 2026" not in prompt

"""The evaluation protocol, asserted from the configs themselves: the scorers' training dialogues, the policies'
prompts, the tuning contexts and the held-out contexts never share a dialogue (every shipped and recipe config),
and a judge never shares training dialogues with the reward it judges."""

from pathlib import Path

import pytest
import yaml
from test_configs import CONFIGS, ROOT, _arguments

from pmi_reward.configs import config_path, merged_config, parse_args
from pmi_reward.policy.panel import LM_PREFIX
from pmi_reward.policy.protocol import BANDS, Entry, entries, inside, overlaps, problems, run_warnings, span

RECIPE = "recipes/smollm2-135m/"


@pytest.fixture(scope="module")
def all_entries():
    import os

    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        found = []
        for name in CONFIGS:
            types, extra = _arguments(name)
            found += entries(name, parse_args(types, ["--config", name, *extra]))
        return found
    finally:
        os.chdir(cwd)


def test_the_bands_are_disjoint_and_cover_chitchat_in_order():
    spans = list(BANDS.values())
    assert all(not overlaps(a, b) for i, a in enumerate(spans) for b in spans[i + 1 :])
    assert [s[0] for s in spans] == [0, 2000, 3400, 3700] and spans[-1][1] is None


def test_no_config_breaks_the_protocol(all_entries):
    roles = {e.role for e in all_entries}
    assert roles == {"scorer", "policy", "evaluation"}, roles  # the check sees every kind of range
    assert problems(all_entries) == []


def test_tuning_configs_evaluate_on_the_tuning_contexts_and_finals_on_held_out(all_entries):
    evaluations = {e.source: e for e in all_entries if e.role == "evaluation"}
    for name in (RECIPE + "tune/evaluate.yaml", RECIPE + "tune/evaluate-all.yaml"):
        assert inside(evaluations[name].span, BANDS["tune"]), name
    for name in (RECIPE + "final/evaluate.yaml", RECIPE + "evaluate.yaml", "demo/evaluate"):
        assert inside(evaluations[name].span, BANDS["heldout"]), name
    for method in ("grpo", "rloo", "ppo", "rft", "dpo"):
        for stage in ("tune", "final"):
            policy = [e for e in all_entries if e.source == f"{RECIPE}{stage}/{method}.yaml"]
            assert [e.role for e in policy] == ["policy"] and inside(policy[0].span, BANDS["policy"])


def _scorer_ranges(all_entries) -> dict[str, Entry | None]:
    """Scorer output_dir -> its training dialogues (None: pair files), from the scorer data configs."""
    out: dict[str, Entry | None] = {}
    for name in CONFIGS:
        if name.startswith(("demo/scorers/", RECIPE + "scorers/")):
            path = ROOT / name if name.startswith("recipes/") else Path(config_path(name))
            values = yaml.safe_load(path.read_text())
            found = [e for e in all_entries if e.source == name]
            out[values["output_dir"]] = found[0] if found else None
    return out


def test_judges_share_no_training_dialogues_with_the_reward(all_entries):
    scorers = _scorer_ranges(all_entries)
    assert len(scorers) == 9
    checked = 0
    for name in (
        RECIPE + "tune/evaluate.yaml",
        RECIPE + "tune/evaluate-all.yaml",
        RECIPE + "final/evaluate.yaml",
        "demo/evaluate",
    ):
        values = merged_config([name if name.startswith("demo/") else str(ROOT / name)])
        reward = scorers[values["reward_scorer"]]
        for judge in values["judges"]:
            path = judge.partition("=")[2]
            seen = None if path.startswith(LM_PREFIX) else scorers[path]  # an untrained LM saw no dialogue
            assert seen is None or reward is None or not overlaps(seen.span, reward.span), (name, judge)
            checked += 1
    # both tune configs and final: (b), (c) and mpnet (e), final also the chat LM (d); the demo: its three
    assert checked == 13


def test_problems_finds_overlaps_and_ranges_outside_their_band():
    ok = [
        Entry("reward", "scorer", "chitchat", span(0, 1000)),
        Entry("policy", "policy", "chitchat", span(2000, 1400)),
        Entry("tune", "evaluation", "chitchat", span(3400, 300)),
        Entry("final", "evaluation", "chitchat", span(3700, None)),
        Entry("other corpus", "scorer", "my.jsonl", span(0, None)),
    ]
    assert problems(ok) == []
    leaky = Entry("leaky", "scorer", "chitchat", span(1500, 1000))  # runs into the policy's prompts
    found = problems([*ok, leaky])
    assert any("outside 0-1999" in p for p in found) and any("leaky" in p and "policy" in p for p in found)
    straddle = Entry("straddle", "evaluation", "chitchat", span(3600, 200))
    assert any("neither inside tune nor inside heldout" in p for p in problems([*ok, straddle]))


def test_run_warnings_name_what_saw_the_evaluation_contexts():
    where = Entry("evaluation", "evaluation", "chitchat", span(3700, None))
    metas = {
        "clean": {"data": {"dialogues": "chitchat", "skip_dialogues": 1000, "n_dialogues": [800, 100, 100]}},
        "dirty": {"data": {"dialogues": "chitchat", "skip_dialogues": 3600, "n_dialogues": [200, 25, 25]}},
        "pairs": {"data": {"train_file": "train.csv"}},
    }
    policies = {
        "good": {"prompts": {"dialogues": "chitchat", "first_dialogue": 2000, "max_dialogues": 1400}},
        "bad": {"prompts": {"dialogues": "chitchat", "first_dialogue": 2000, "max_dialogues": None}},
        "unknown": {},
    }
    found = run_warnings(where, metas, policies)
    assert len(found) == 2 and "dirty" in found[0] and "bad" in found[1]


def test_several_configs_merge_in_order(tmp_path):
    from pmi_reward.training.job import ARGUMENTS

    data = tmp_path / "data.yaml"
    data.write_text("dialogues: chitchat\nmax_dialogues: 7\nseed: 3\n")
    parsed = parse_args(ARGUMENTS, ["--config", "scorer/minilm", "--config", str(data), "--max_context_turns", "2"])
    train_data, encoder, *_, config = parsed
    assert encoder.model == "minilm"  # from the first file
    assert train_data.max_dialogues == 7 and config.seed == 3  # the second file overrides
    assert train_data.max_context_turns == 2  # flags still win


def _truncation_handled(method: str, values: dict) -> bool:
    """Whether a policy config keeps replies cut at the token limit from training as if ended there: masked or
    penalised; RFT and DPO (whose ``drop_truncated`` defaults to true) may instead never keep a cut reply."""
    if values.get("mask_truncated_completions") or values.get("truncation_penalty") is not None:
        return True
    return method in ("rft", "dpo") and bool(values.get("drop_truncated", True))


@pytest.mark.parametrize("stage", ["tune", "final", "demo"])
def test_policy_configs_mask_or_penalise_truncation_with_a_budget_that_fits_replies(stage):
    methods = ("grpo", "rloo", "ppo", "rft", "dpo")
    named = [("grpo", "demo/grpo")] if stage == "demo" else [(m, f"{RECIPE}{stage}/{m}.yaml") for m in methods]
    # the check can fail: an online method that neither masks nor penalises, or RFT told to keep cut replies
    assert not _truncation_handled("grpo", {"drop_truncated": True})
    assert not _truncation_handled("rft", {"drop_truncated": False})
    for method, name in named:
        values = merged_config([name if name.startswith("demo/") else str(ROOT / name)])
        assert _truncation_handled(method, values), name
        budget = values.get("max_completion_length") or values.get("max_new_tokens") or values["rollout_max_new_tokens"]
        assert budget >= 48, name  # base replies are ~20 words (~26 tokens); 32 cut a third of them

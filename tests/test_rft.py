"""Rejection-sampling fine-tuning and iterative DPO: the selection of each prompt's best reply (and worst), and rounds
on a tiny policy."""

import json
from dataclasses import replace

import numpy as np
import pytest
from conftest import tiny_fit_args
from trl import DPOConfig, ModelConfig, SFTConfig

from pmi_reward.data.records import DataError
from pmi_reward.policy.rft import RFTConfig, select_best, select_pairs, train_rft
from pmi_reward.policy.sampling import Replies
from pmi_reward.policy.trainers import ScriptArguments
from pmi_reward.rewards.combined import CombinedReward
from pmi_reward.rewards.truncation import TruncationPenalty


def _script(tmp_path, dialogues) -> ScriptArguments:
    """Prompts from 8 topic dialogues written as a JSONL file."""
    path = tmp_path / "dialogues.jsonl"
    path.write_text("\n".join(json.dumps({"id": d.id, "turns": list(d.turns)}) for d in dialogues[:8]))
    return ScriptArguments(dialogues=str(path), first_dialogue=0, max_dialogues=None, scorer="unused")


def _fit_args(output_dir: str, config: type = SFTConfig, **changes):
    """``tiny_fit_args`` (TRL's SFTConfig by default, or DPOConfig) with every step logged."""
    return tiny_fit_args(output_dir, config, **{"logging_steps": 1, **changes})


def test_select_best_skips_cut_empty_unscorable_and_low_replies():
    """Text prompts: each kept reply is text (a chat prompt's is an assistant message)."""
    prompts = ["p0", "p1", "p2", "p3"]
    replies = Replies(
        [["a", "b", "c"], ["d", "", "f"], ["g", "h", "i"], ["j", "k", "l"]],
        [[[1]] * 3] * 4,
        [[False, True, False], [False, False, True], [True, True, True], [False, False, False]],
    )
    scores = np.array([[1.0, 5.0, 2.0], [np.nan, 9.0, 3.0], [1.0, 2.0, 3.0], [-3.0, -2.0, -4.0]])
    rows = select_best(prompts, replies, scores)
    # p0: "b" is cut -> "c"; p1: "" is empty, "f" cut, "d" unscorable -> none; p2: all cut; p3: "k"
    assert [(r["prompt"], r["completion"]) for r in rows] == [("p0", "c"), ("p3", "k")]
    assert [r["prompt"] for r in select_best(prompts, replies, scores, min_score=0.0)] == ["p0"]
    assert select_best(prompts, replies, scores, drop_truncated=False)[0]["completion"] == "b"


def test_select_pairs_pairs_the_best_with_the_worst_of_the_same_candidates():
    prompts = ["p0", "p1", "p2", "p3", "p4"]
    replies = Replies(
        [["a", "b", "c"], ["d", "", "f"], ["g", "h", "i"], ["j", "k", "l"], ["m", "n", "o"]],
        [[[1]] * 3] * 5,
        [[False, True, False], [False, False, False], [False, False, False], [True, False, True], [False] * 3],
    )
    scores = np.array([[1.0, 9.0, 2.0], [4.0, 9.0, np.nan], [2.0, 2.0, 2.0], [5.0, 1.0, 0.0], [-1.0, 3.0, 0.5]])
    rows = select_pairs(prompts, replies, scores)
    # p0: "b" is cut -> "c" over "a"; p1: "" empty, "f" unscorable -> one candidate; p2: a tie; p3: only "k" uncut
    picked = [(r["prompt"], r["chosen"], r["rejected"]) for r in rows]
    assert picked == [("p0", "c", "a"), ("p4", "n", "m")]
    assert [(r["score"], r["rejected_score"]) for r in rows] == [(2.0, 1.0), (3.0, -1.0)]
    assert [r["prompt"] for r in select_pairs(prompts, replies, scores, min_score=2.5)] == ["p4"]
    assert select_pairs(prompts, replies, scores, drop_truncated=False)[0]["chosen"] == "b"


def _longer(prompts, completions, **kwargs) -> list[float]:
    """A reward that tells the tiny policy's samples apart (the tiny scorer saturates): the reply's length."""
    return [float(len(c if isinstance(c, str) else c[0]["content"])) for c in completions]


def test_cut_replies_kept_with_a_truncation_penalty_become_the_rejected_ones():
    """Trial dpo-d's settings (``--drop_truncated false --truncation_penalty``): a round's scores carry the penalty of
    a reply that ran into the token limit (its ids end without a stop id), so the cut reply, which the reward alone
    ranks first, becomes the pair's rejected one."""
    from pmi_reward.policy import rft

    cut = "a longer reply that never"
    replies = Replies([[cut, "short.", "mid reply."]], [[[5, 6], [5, 0], [7, 0]]], [[True, False, False]])
    plain = rft._score(CombinedReward([_longer]), ["p"], replies)
    assert select_pairs(["p"], replies, plain, drop_truncated=False)[0]["chosen"] == cut
    scores = rft._score(CombinedReward([_longer, TruncationPenalty({0}, -30.0)]), ["p"], replies)
    assert np.allclose(scores, [[25.0 - 30.0, 6.0, 10.0]])
    pair = select_pairs(["p"], replies, scores, drop_truncated=False)[0]
    assert (pair["chosen"], pair["rejected"]) == ("mid reply.", cut)


@pytest.mark.parametrize("chat", [True, False], ids=["chat", "text"])
def test_cut_replies_train_as_sampled_without_an_end_of_turn(tmp_path, tiny_policy, smol_tokenizer, chat):
    """TRL closes every completion with the end of turn: a cut reply kept as DPO's rejected one (a truncation penalty)
    lowered the end of turn after the cut text (teaching the policy not to stop), and as a kept SFT reply taught it to
    stop mid-sentence. Cut replies now train as their sampled ids; finished ones as TRL renders them."""
    from pmi_reward.policy import rft

    tok = smol_tokenizer
    prompt = [{"role": "user", "content": "I love pizza."}] if chat else "I love pizza."
    cut_ids = tok(" So do I, especially with", add_special_tokens=False)["input_ids"]  # no stop token: cut
    done_ids = tok(" Me too!", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    replies = Replies([[" So do I, especially with", " Me too!"]], [[cut_ids, done_ids]], [[True, False]])
    replies = rft._as_sampled(tok, [prompt], replies)
    pairs = select_pairs([prompt], replies, np.array([[-7.0, 1.0]]), drop_truncated=False)
    captured = {}

    def keep(trainer):
        captured["data"] = trainer.train_dataset
        return trainer.model

    dpo = _fit_args(str(tmp_path / "dpo"), DPOConfig)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(rft.CutRepliesDPOTrainer, "train", keep)
        rft._dpo(tiny_policy(), tok, pairs, dpo, None, tiny_policy())
    row = captured["data"][0]
    assert row["rejected_ids"] == cut_ids and row["chosen_ids"][-1] != cut_ids[-1]
    assert tok.eos_token_id in row["chosen_ids"]  # a finished reply keeps its end of turn
    kept = select_best([prompt], replies, np.array([[9.0, 1.0]]), drop_truncated=False)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(rft.CutRepliesSFTTrainer, "train", keep)
        rft._sft(tiny_policy(), tok, kept, _fit_args(str(tmp_path / "sft")), None)
    row = captured["data"][0]
    assert row["input_ids"][-len(cut_ids) :] == cut_ids and [t for t in row["labels"] if t != -100] == cut_ids
    short = _fit_args(str(tmp_path / "sft"), max_length=len(row["input_ids"]) - 2)  # TRL cut the row before
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(rft.CutRepliesSFTTrainer, "train", keep)
        rft._sft(tiny_policy(), tok, kept, short, None)
    assert captured["data"][0]["input_ids"] == row["input_ids"][:-2]  # cut to max_length, as TRL cuts


def test_cut_replies_follow_their_prompt_as_sampled_where_tokens_merge(tmp_path, tiny_policy, smol_tokenizer):
    """A text prompt ending in " Wow!" before a cut reply "!! so good": TRL tokenizes prompt + reply as " Wow" "!!!"
    and starts the reply after " Wow", so the sampled ids followed a prompt short of its "!", a context the policy
    never saw. A cut reply now trains after the prompt's own tokens (not trained on), in SFT and DPO; a pair whose
    finished reply merges into the prompt too has no one prompt for both replies, and is dropped with a warning."""
    from pmi_reward.policy import rft

    tok = smol_tokenizer
    prompt = "User: Wow!\nAssistant: Wow!"
    context = tok(prompt, add_special_tokens=False)["input_ids"]  # as the sampler gave it (SmolLM2 adds no BOS)
    cut = tok("!!", add_special_tokens=False)["input_ids"] + tok(" so good", add_special_tokens=False)["input_ids"]
    assert tok(prompt + tok.decode(cut))["input_ids"][: len(context)] != context  # "!" + "!!" merge
    done = tok(" Yes.", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    merged = tok("!! Yes.", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    replies = Replies([["", ""], ["", ""]], [[cut, done], [cut, merged]], [[True, False], [True, False]])
    replies = rft._as_sampled(tok, [prompt, prompt], replies)
    captured = {}

    def keep(trainer):
        captured["data"] = trainer.train_dataset
        return trainer.model

    kept = select_best([prompt], replies, np.array([[9.0, 1.0]]), drop_truncated=False)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(rft.CutRepliesSFTTrainer, "train", keep)
        rft._sft(tiny_policy(), tok, kept, _fit_args(str(tmp_path / "sft")), None)
    row = captured["data"][0]
    assert row["input_ids"] == context + cut and row["labels"] == [-100] * len(context) + cut
    pairs = select_pairs([prompt, prompt], replies, np.array([[-7.0, 1.0], [-7.0, 1.0]]), drop_truncated=False)
    with pytest.MonkeyPatch.context() as patch, pytest.warns(UserWarning, match="1 of 2 preference pairs dropped"):
        patch.setattr(rft.CutRepliesDPOTrainer, "train", keep)
        rft._dpo(tiny_policy(), tok, pairs, _fit_args(str(tmp_path / "dpo"), DPOConfig), None, tiny_policy())
    [row] = captured["data"]
    assert row["prompt_ids"] == context and row["rejected_ids"] == cut
    assert row["prompt_ids"] + row["chosen_ids"] == tok(prompt + " Yes." + tok.eos_token)["input_ids"]  # as TRL's


def test_cut_replies_kept_for_sft_need_the_loss_on_completions(tmp_path):
    """Without completion_only_loss (or with packing) a cut reply cannot be trained as sampled: refused before
    anything loads, not after a round of sampling."""
    script = ScriptArguments(dialogues="chitchat", scorer="unused")
    for changes in ({"completion_only_loss": False}, {"packing": True}):
        with pytest.raises(ValueError, match="drop_truncated false keeps cut replies"):
            train_rft(RFTConfig(drop_truncated=False), script, _fit_args(str(tmp_path), **changes), ModelConfig())


def test_dpo_rounds_learn_against_the_starting_model(tmp_path, topic_dialogues, tiny_policy, smol_tokenizer):
    """Round 1 starts at the reference (DPO margin 0 on its first batch); round 2's first batch is measured
    against the starting model again, not against round 1's policy, so its margin is no longer 0."""
    import torch

    script = _script(tmp_path, topic_dialogues)
    policy = tiny_policy()
    start = {k: v.clone() for k, v in policy.state_dict().items()}
    cfg = RFTConfig(rounds=2, prompts_per_round=4, samples_per_prompt=4, rollout_max_new_tokens=6, drop_truncated=False)
    summary = train_rft(
        cfg,
        script,
        _fit_args(str(tmp_path / "out"), DPOConfig, learning_rate=1e-2),
        ModelConfig(),
        policy,
        smol_tokenizer,
        [_longer],
    )
    assert summary["trainer"] == "DPO" and summary["steps"] == 2 and summary["settings"]["loss_type"] == ["sigmoid"]
    log = [json.loads(x) for x in (tmp_path / "out" / "rft_log.jsonl").read_text().splitlines()]
    assert all(r["kept"] > 0 and r["kept_score"] > r["rejected_score"] and r["rejected_words"] > 0 for r in log)
    assert log[0]["dpo_margin"] == pytest.approx(0.0, abs=1e-6) and abs(log[1]["dpo_margin"]) > 1e-4
    assert 0.0 <= log[1]["dpo_accuracy"] <= 1.0
    assert any(not torch.equal(v, start[k]) for k, v in policy.state_dict().items())  # the policy learned


@pytest.mark.parametrize("config", [SFTConfig, DPOConfig])
def test_text_prompts_get_text_replies(tmp_path, tiny_policy, smol_tokenizer, config):
    """A prompt file of plain text prompts: each kept reply is text too (as TRL pairs them; a chat message after a
    text prompt crashed SFT and DPO once the round had been sampled and scored), and the reward reads text."""
    path = tmp_path / "prompts.jsonl"
    path.write_text("\n".join(json.dumps({"prompt": f"User: I love pizza {i}.\nAssistant:"}) for i in range(4)))
    seen = []

    def longer(prompts, completions, **kwargs):
        seen.extend(completions)
        return [float(len(c)) for c in completions]

    script = ScriptArguments(prompt_file=str(path), scorer="unused")
    cfg = RFTConfig(rounds=1, prompts_per_round=2, samples_per_prompt=2, rollout_max_new_tokens=6, drop_truncated=False)
    summary = train_rft(
        cfg, script, _fit_args(str(tmp_path / "out"), config), ModelConfig(), tiny_policy(), smol_tokenizer, [longer]
    )
    assert summary["steps"] == 1 and seen and all(isinstance(c, str) for c in seen)
    rows = select_best(["User: hi\nAssistant:"], Replies([["yo"]], [[[1]]], [[False]]), np.array([[1.0]]))
    assert rows[0]["completion"] == "yo"
    chat = select_best([[{"role": "user", "content": "hi"}]], Replies([["yo"]], [[[1]]], [[False]]), np.array([[1.0]]))
    assert chat[0]["completion"] == [{"role": "assistant", "content": "yo"}]


def test_text_prompts_train_the_tokens_the_policy_sampled(smol_tokenizer):
    """After a text prompt TRL tokenizes prompt + reply as one string: the kept reply is the sampled text with its
    leading space (" Me too!" tokenizes back to the sampled ids), not the stripped text; after chat messages the
    stripped text stands."""
    from pmi_reward.policy.rft import _as_sampled

    prompt, chat = "User: I love pizza.\nAssistant:", [{"role": "user", "content": "I love pizza."}]
    ids = smol_tokenizer(" Me too!", add_special_tokens=False)["input_ids"]
    replies = Replies([["Me too!"], ["Me too!"]], [[ids], [ids]], [[False], [False]])
    texts = _as_sampled(smol_tokenizer, [prompt, chat], replies).texts
    assert texts == [[" Me too!"], ["Me too!"]]
    whole = smol_tokenizer(prompt + texts[0][0], add_special_tokens=False)["input_ids"]
    assert whole[-len(ids) :] == ids


def test_dpo_refuses_rounds_that_cannot_pair(tmp_path, monkeypatch):
    """One sample per prompt, or greedy samples (all alike), give no pair whose scores differ: every round kept
    nothing and the base was saved as the tuned policy. Refused before the policy loads."""
    from pmi_reward.policy import rft

    monkeypatch.setattr(rft, "policy_from", lambda *a, **k: pytest.fail("the policy loaded before the check"))
    monkeypatch.setattr(rft, "build_prompts", lambda *a, **k: pytest.fail("the prompts loaded before the check"))
    dpo = _fit_args(str(tmp_path / "out"), DPOConfig)
    for cfg in (RFTConfig(samples_per_prompt=1), RFTConfig(rollout_temperature=0.0)):
        with pytest.raises(ValueError, match="DPO pairs two sampled replies"):
            train_rft(cfg, ScriptArguments(scorer="unused"), dpo, ModelConfig(), rewards=[_longer])


def test_one_rft_round_on_a_tiny_policy(tmp_path, topic_dialogues, tiny_policy, smol_tokenizer, tiny_reward):
    script = _script(tmp_path, topic_dialogues)
    cfg = RFTConfig(rounds=2, prompts_per_round=4, samples_per_prompt=2, rollout_max_new_tokens=6, drop_truncated=False)
    sft = _fit_args(str(tmp_path / "out"))
    summary = train_rft(cfg, script, sft, ModelConfig(), tiny_policy(), smol_tokenizer, rewards=[tiny_reward])
    assert summary["trainer"] == "RFT" and summary["steps"] == 2 and summary["device"] == "cpu"
    # the model it started from (a name, a folder or None for a model built from a config), never the run's clock
    assert summary["start_model"] is None or isinstance(summary["start_model"], str), summary["start_model"]
    log = [json.loads(x) for x in (tmp_path / "out" / "rft_log.jsonl").read_text().splitlines()]
    assert [r["round"] for r in log] == [1, 2] and all(0 <= r["clipped_ratio"] <= 1 for r in log)
    assert all(r["words"] > 0 and r["kept_words"] > 0 for r in log if r["kept"])
    assert (tmp_path / "out" / "run_summary.json").is_file()


def test_sample_from_base_samples_the_starting_model_every_round(
    tmp_path, monkeypatch, topic_dialogues, tiny_policy, smol_tokenizer, tiny_reward
):
    import torch

    from pmi_reward.policy import rft

    script = _script(tmp_path, topic_dialogues)
    policy = tiny_policy()
    start = {k: v.clone() for k, v in policy.state_dict().items()}
    samplers = []
    real = rft.generate_replies

    def spy(model, *args, **kwargs):
        samplers.append(model)
        return real(model, *args, **kwargs)

    monkeypatch.setattr(rft, "generate_replies", spy)
    sft = _fit_args(str(tmp_path / "out"), max_steps=2, learning_rate=1e-2)
    cfg = RFTConfig(rounds=2, prompts_per_round=4, samples_per_prompt=2, rollout_max_new_tokens=6, drop_truncated=False)
    train_rft(
        replace(cfg, sample_from="base"), script, sft, ModelConfig(), policy, smol_tokenizer, rewards=[tiny_reward]
    )
    assert len(samplers) == 2 and samplers[0] is samplers[1] and samplers[0] is not policy
    assert all(torch.equal(v, start[k]) for k, v in samplers[1].state_dict().items())  # the base, untouched by SFT
    assert any(not torch.equal(v, start[k]) for k, v in policy.state_dict().items())  # while the policy learned

    samplers.clear()
    sft.output_dir = str(tmp_path / "out2")
    train_rft(cfg, script, sft, ModelConfig(), tiny_policy(), smol_tokenizer, rewards=[tiny_reward])
    assert samplers[0] is samplers[1]  # sample_from="policy": the one model that SFT trains
    with pytest.raises(ValueError, match="sample_from"):
        RFTConfig(sample_from="reference")


def test_reward_weights_weigh_the_scores_that_select_the_kept_replies(
    tmp_path, topic_dialogues, tiny_policy, smol_tokenizer, tiny_reward
):
    script = _script(tmp_path, topic_dialogues)
    kept = []
    for weight in (1.0, 3.0):
        cfg = RFTConfig(
            rounds=1, prompts_per_round=4, samples_per_prompt=2, rollout_max_new_tokens=6, drop_truncated=False
        )
        cfg.reward_weights = [weight]
        sft = _fit_args(str(tmp_path / f"w{weight}"))
        train_rft(cfg, script, sft, ModelConfig(), tiny_policy(), smol_tokenizer, rewards=[tiny_reward])
        kept.append(json.loads((tmp_path / f"w{weight}" / "rft_log.jsonl").read_text())["kept_score"])
    assert kept[0] != 0 and np.isclose(kept[1], 3.0 * kept[0])
    with pytest.raises(ValueError, match="reward_weights"):
        train_rft(
            replace(cfg, reward_weights=[1.0, 1.0]),
            script,
            sft,
            ModelConfig(),
            tiny_policy(),
            smol_tokenizer,
            rewards=[tiny_reward],
        )


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("rounds", 0),
        ("prompts_per_round", 0),
        ("samples_per_prompt", 0),
        ("rollout_max_new_tokens", 0),
        ("rollout_batch_size", 0),
        ("rollout_temperature", -1.0),
    ],
)
def test_settings_that_would_fail_after_loading_are_refused_when_read(name, value, monkeypatch, capsys):
    """Zero rounds trained nothing and saved the base as the tuned policy; zero prompts or samples per round and a
    zero batch crashed inside sampling or numpy once the policy and the scorer had loaded."""
    from pmi_reward.cli.main import main
    from pmi_reward.policy import rft

    monkeypatch.setattr(rft, "policy_from", lambda *a, **k: pytest.fail("the policy loaded before the check"))
    with pytest.raises(ValueError, match=rf"{name} must be >= [01]"):
        RFTConfig(**{name: value})
    assert main(["rft", "--use_cpu", "true", "--bf16", "false", f"--{name}", str(value)]) == 2
    assert f"{name} must be >= " in capsys.readouterr().err


@pytest.mark.parametrize("command", ["rft", "dpo"])
@pytest.mark.parametrize("value", [-0.1, 1.5])
def test_a_rollout_top_p_outside_zero_to_one_is_refused_when_read(command, value, monkeypatch, capsys):
    """A negative top_p failed inside generate() once the policy and the scorer had loaded; one above 1 sampled as
    1.0 without a word. 0 (greedy) and 1 (no cut) stay allowed."""
    from pmi_reward.cli.main import main
    from pmi_reward.policy import rft

    monkeypatch.setattr(rft, "policy_from", lambda *a, **k: pytest.fail("the policy loaded before the check"))
    with pytest.raises(ValueError, match=rf"rollout_top_p must be in \[0, 1\] \(0: greedy\), got {value}"):
        RFTConfig(rollout_top_p=value)
    assert main([command, "--use_cpu", "true", "--bf16", "false", "--rollout_top_p", str(value)]) == 2
    assert "rollout_top_p must be in [0, 1]" in capsys.readouterr().err
    assert [RFTConfig(rollout_top_p=v).rollout_top_p for v in (0.0, 1.0)] == [0.0, 1.0]


def test_a_round_with_nothing_scorable_logs_no_nan(tmp_path, topic_dialogues, tiny_policy, smol_tokenizer):
    """Every reply of the first round unscorable (the reward returns None): the round keeps nothing and logs a null
    score, not a NaN (which is not JSON) from the mean of no scores; the next round trains."""
    script = _script(tmp_path, topic_dialogues)
    cfg = RFTConfig(rounds=2, prompts_per_round=2, samples_per_prompt=2, rollout_max_new_tokens=4, drop_truncated=False)
    calls = []

    def unscorable_first(prompts, completions, **kwargs):
        calls.append(1)
        return [None if len(calls) == 1 else float(len(str(c))) for c in completions]

    summary = train_rft(
        cfg, script, _fit_args(str(tmp_path / "out")), ModelConfig(), tiny_policy(), smol_tokenizer, [unscorable_first]
    )

    def refuse(constant):
        raise AssertionError(f"a log holds {constant}")

    log = [json.loads(x, parse_constant=refuse) for x in (tmp_path / "out" / "rft_log.jsonl").read_text().splitlines()]
    assert log[0]["score"] is None and log[0]["kept"] == 0
    saved = json.loads((tmp_path / "out" / "run_summary.json").read_text(), parse_constant=refuse)
    assert saved["first_reward"] is None and summary["steps"] == 2 and log[1]["kept"] > 0


def test_a_run_whose_rounds_all_keep_nothing_saves_no_tuned_policy(
    tmp_path, topic_dialogues, tiny_policy, smol_tokenizer
):
    """No round trained: the starting model was saved as the tuned policy (evaluate-policy then read it as one)."""
    script = _script(tmp_path, topic_dialogues)
    cfg = RFTConfig(rounds=2, prompts_per_round=2, samples_per_prompt=2, rollout_max_new_tokens=4)

    def unscorable(prompts, completions, **kwargs):
        return [None] * len(completions)

    with pytest.raises(DataError, match="rft: no round trained \\(2 of 2 run"):
        train_rft(
            cfg, script, _fit_args(str(tmp_path / "out")), ModelConfig(), tiny_policy(), smol_tokenizer, [unscorable]
        )
    assert (
        not (tmp_path / "out" / "model.safetensors").exists()
        and not (tmp_path / "out" / "adapter_config.json").exists()
    )

"""Engagement-gain evaluation: metrics on known inputs, bootstrap CIs, the full comparison on tiny policies
(a panel of judges, best-of-n rows, KL, diagnostics, the report and sample files), loading LoRA adapters."""

import json
import math
from dataclasses import asdict

import numpy as np
import pytest
import torch

from pmi_reward.data.conversation import turns_to_messages
from pmi_reward.evaluation.metrics import copies_context, distinct_n, is_generic, mean_ci, row_means, win_rate, words
from pmi_reward.evaluation.report import plot_distributions
from pmi_reward.policy.evaluate import EvalArguments, evaluate_policies, score_grid
from pmi_reward.policy.loading import load_policy
from pmi_reward.policy.panel import Judge, check_panel, load_judges, parse_val_aucs, relation
from pmi_reward.policy.report import report_text
from pmi_reward.policy.samples import read_samples, sample_records, samples_markdown, write_samples
from pmi_reward.policy.sampling import SamplingSettings
from pmi_reward.rewards.reward import PMIReward


def test_text_metrics():
    assert words("That's GREAT, isn't it?!") == ["thats", "great", "isnt", "it"]
    assert distinct_n(["a b c", "a b d"], 1) == pytest.approx(4 / 6)
    assert distinct_n(["a b c", "a b d"], 2) == pytest.approx(3 / 4)
    assert distinct_n(["", "a"], 2) == 0.0
    ctx = "We went to Yosemite, the views were amazing.\nWhere did you go?"
    assert copies_context("Yosemite, the views were amazing!", ctx)
    assert copies_context("where did you go", ctx)
    assert not copies_context("Did you see Half Dome at Yosemite?", ctx)
    assert not copies_context("Yosemite", ctx)  # too short to call a copy
    assert is_generic("That's interesting.") and is_generic("lol") and is_generic("  ") and is_generic("OK!")
    assert not is_generic("Did you see Half Dome?")


def test_win_rate_counts_pairs_within_contexts_and_ties_half():
    a = np.array([[2.0, 0.0], [1.0, 1.0]])
    b = np.array([[1.0, 1.0], [1.0, 3.0]])
    # context 0: (2>1, 2>1, 0<1, 0<1) -> 2/4; context 1: (tie, 1<3, tie, 1<3) -> 1/4
    assert win_rate(a, b) == pytest.approx((0.5 + 0.25) / 2)
    assert win_rate(a, a[:, ::-1]) == pytest.approx(0.5)


def test_win_rate_leaves_out_unscored_replies_and_refuses_other_contexts():
    # a NaN (unscored) reply is no loss for either side: before, it lost for whichever side it was on (0.5 and
    # 0.0, which do not add up to 1)
    a, b = np.array([[1.0, np.nan]]), np.array([[0.0, 0.0]])
    assert win_rate(a, b) == pytest.approx(1.0) and win_rate(b, a) == pytest.approx(0.0)
    assert math.isnan(win_rate(np.array([[np.nan]]), np.array([[0.0]])))
    # one context against three is no pairing of contexts (it broadcast to 1.0 before)
    with pytest.raises(ValueError, match="contexts"):
        win_rate(np.ones((3, 2)), np.zeros((1, 2)))


def test_bootstrap_ci_is_seeded_covers_the_mean_and_narrows_with_more_contexts():
    rng = np.random.default_rng(0)
    small, large = rng.normal(1.0, 2.0, (20, 4)), rng.normal(1.0, 2.0, (500, 4))
    est = mean_ci(small)
    m, lo, hi = est.value, est.low, est.high
    assert lo < m < hi and m == pytest.approx(small.mean())
    assert mean_ci(small) == est
    big = mean_ci(large)
    lo2, hi2 = big.low, big.high
    assert hi2 - lo2 < (hi - lo) / 2 and lo2 < 1.0 < hi2
    paired = mean_ci(row_means(small + 3.0) - row_means(small))
    d, dlo, dhi = paired.value, paired.low, paired.high
    assert d == pytest.approx(3.0) and dlo == pytest.approx(3.0) and dhi == pytest.approx(3.0)  # paired: no noise


def _judges(scorer) -> list[Judge]:
    reward = {"encoder": "tiny", "training": {"seed": 0}, "data": {"dialogues": "chitchat", "n_dialogues": [8]}}
    twin = Judge("twin", "x", scorer, {**reward, "best_val_auc": 0.8})
    other = Judge("other-enc", "y", scorer, {"encoder": "other", "data": {"train_file": "en.csv"}, "best_val_auc": 0.7})
    for j in (twin, other):
        j.shares = relation(j.meta, reward)
    return [twin, other]


def test_evaluate_policies_on_tiny_models(tiny_policy, smol_tokenizer, tiny_scorer, tmp_path):
    prompts = [
        turns_to_messages(t)
        for t in (
            "I love jazz.\nWho do you like?",
            "Did you watch the match?",
            "I flew to Rome.\nHow was it?\nAmazing food.",
        )
    ]
    base, other = tiny_policy(0), tiny_policy(1)
    judges = _judges(tiny_scorer)
    args = EvalArguments(samples=2, best_of_n=[2, 4])
    settings = SamplingSettings(max_new_tokens=4, batch_size=8, seed=1234)
    out = evaluate_policies(
        {"base": (base, smol_tokenizer), "same": (base, smol_tokenizer), "other": (other, smol_tokenizer)},
        prompts,
        judges,
        tiny_scorer,
        args,
        settings,
        references=["Coltrane.", "Yes!", "Pasta?"],
    )
    rows = {r["policy"]: r for r in out["rows"]}
    assert list(rows) == ["base", "same", "other", "best-of-2", "best-of-4", "human reference"]
    assert "gain" not in rows["base"]["judges"]["twin"] and "verdict" not in rows["base"]
    same = rows["same"]["judges"]["twin"]
    assert same["gain"] == pytest.approx(0.0, abs=1e-6) and same["win_rate"] == pytest.approx(0.5)
    assert same["len_adj_gain"] == pytest.approx(0.0, abs=1e-6) and same["binned_gain"] == pytest.approx(0.0, abs=1e-6)
    assert rows["same"]["kl_reply"] == pytest.approx(0.0, abs=1e-4)  # the same weights: no divergence
    assert rows["other"]["kl_reply"] is not None and rows["best-of-4"]["kl_is_bound"]
    assert "val AUC 0.700" in rows["other"]["verdict"] and "other-enc" in rows["other"]["verdict"]
    for r in rows.values():
        for g in r["judges"].values():
            assert g["pmi_lo"] <= g["pmi_mean"] <= g["pmi_hi"]
        assert 0 <= r["distinct_2"] <= 1 and 0 <= r["top20_openings"] <= 1 and 0 <= r["questions"] <= 1
        assert r["reward_pmi"] == pytest.approx(r["judges"]["twin"]["pmi_mean"])  # same scorer on both sides
    # best-of-n: one reply per group of n from a pool of lcm(2, 4) = 4 samples
    assert [len(x) for x in out["replies"]["best-of-2"].texts] == [2, 2, 2]
    assert [len(x) for x in out["replies"]["best-of-4"].texts] == [1, 1, 1]
    assert np.asarray(out["scores"]["twin"]["other"]).shape == (3, 2)
    text = report_text(out, judges, None)
    assert "Reward-hacking diagnostics" in text and "0.800" in text and "best-of-4" in text
    records = sample_records(out, ["Coltrane.", "Yes!", "Pasta?"])
    assert len(records) == 3 and records[0]["reference"] == "Coltrane."
    assert set(records[0]["other"][0]) == {"reply", "pmi", "tokens", "cut"}
    md = samples_markdown(records, n_contexts=2)
    assert md.count("## ") == 2 and "| best-of-4 |" in md
    assert plot_distributions(out["scores"]["twin"], tmp_path / "h.png").stat().st_size > 1000


def test_best_of_n_keeps_the_rewards_favourite_and_the_kl_reads_the_tuned_policy_against_its_base(
    tiny_policy, smol_tokenizer, spread_scorer, monkeypatch
):
    """Best-of-n rows hold, of each disjoint group of n replies in the base's pool, the one the reward scores
    highest, and their reward mean is the mean of those maxima; a tuned policy's KL is log pi_tuned - log pi_base
    on its own replies (positive: they were drawn from it), per reply and per token. Ranked by ``tiny_scorer``
    (every pair the 20.0 cap) a best-of-n that kept the worst reply passed, and so did a KL with the roles
    swapped (negative)."""
    from pmi_reward.policy import evaluate
    from pmi_reward.policy.divergence import kl_to_base

    pools = []
    real_generate = evaluate.generate_replies

    def spy(model, tokenizer, prompts, n, settings, progress=False):
        replies = real_generate(model, tokenizer, prompts, n, settings, progress)
        if str(progress).startswith("sampling best-of-n pool"):
            pools.append(replies)
        return replies

    monkeypatch.setattr(evaluate, "generate_replies", spy)
    prompts = [
        turns_to_messages(t)
        for t in ("I love jazz.\nWho do you like?", "Did you watch the match?", "I flew to Rome.\nHow was it?")
    ]
    base, other = tiny_policy(0), tiny_policy(1)
    args = EvalArguments(samples=2, best_of_n=[2, 4])
    settings = SamplingSettings(max_new_tokens=6, batch_size=8, seed=1234)
    policies = {"base": (base, smol_tokenizer), "other": (other, smol_tokenizer)}
    out = evaluate_policies(policies, prompts, _judges(spread_scorer), spread_scorer, args, settings)
    rows = {r["policy"]: r for r in out["rows"]}
    (pool,) = pools
    scores = score_grid(PMIReward(spread_scorer, empty_score=None), prompts, pool.texts)
    assert scores.shape == (3, 4) and np.isfinite(scores).all()
    assert all(len(set(np.round(row, 4))) == 4 for row in scores)  # the pool's replies score apart
    for n in (2, 4):
        picks = [[g * n + int(np.argmax(row[g * n : (g + 1) * n])) for g in range(4 // n)] for row in scores]
        kept = out["replies"][f"best-of-{n}"]
        assert kept.texts == [[pool.texts[i][j] for j in row] for i, row in enumerate(picks)], n
        assert kept.tokens == [[pool.tokens[i][j] for j in row] for i, row in enumerate(picks)], n
        best = [[scores[i, j] for j in row] for i, row in enumerate(picks)]
        assert rows[f"best-of-{n}"]["reward_pmi"] == pytest.approx(float(np.mean(best)), abs=1e-5)
        assert rows[f"best-of-{n}"]["reward_pmi"] > float(scores.mean()) + 1e-3  # above the pool's mean
    tokens = out["replies"]["other"].tokens
    kl = kl_to_base(other, base, smol_tokenizer, prompts, tokens, settings.temperature)
    assert rows["other"]["kl_reply"] == pytest.approx(kl["kl_reply"], abs=1e-6)
    assert rows["other"]["kl_token"] == pytest.approx(kl["kl_token"], abs=1e-6)
    assert rows["other"]["kl_reply"] > 0 and rows["other"]["kl_token"] > 0  # its own replies: more likely under it


def test_saved_samples_judged_again_give_the_same_rows(tiny_policy, smol_tokenizer, spread_scorer, tmp_path):
    """--from_samples: an evaluation's samples.jsonl, read back and judged by the same panel, reproduces its
    rows (gains, lengths, cut shares, diversity) without sampling; only the KL needs the policies."""
    prompts = [turns_to_messages(t) for t in ("I love jazz.\nWho do you like?", "I flew to Rome.\nHow was it?")]
    policies = {"base": (tiny_policy(0), smol_tokenizer), "other": (tiny_policy(1), smol_tokenizer)}
    judges, refs = _judges(spread_scorer), ["Coltrane.", "Great."]
    args = EvalArguments(samples=3)
    settings = SamplingSettings(max_new_tokens=6, batch_size=8, seed=7)
    first = evaluate_policies(policies, prompts, judges, spread_scorer, args, settings, references=refs)
    scores = np.concatenate([np.ravel(v) for v in first["scores"]["twin"].values()])
    # the replies score apart (two sampled alike) and the gains are not 0: rows read back against the wrong reply or
    # context would show
    assert len(scores) == 14 and len(set(np.round(scores, 4))) >= 12
    assert all(abs(r["judges"]["twin"]["gain"]) > 1e-3 for r in first["rows"][1:])
    write_samples(tmp_path, first, refs, n_contexts=2)
    contexts, references, replies = read_samples(tmp_path / "samples.jsonl")
    assert references == refs and list(replies) == ["base", "other", "human reference"]
    again = evaluate_policies({}, contexts, judges, spread_scorer, args, settings, references, replies)
    assert [r["policy"] for r in again["rows"]] == ["base", "other", "human reference"]
    for old, new in zip(first["rows"], again["rows"], strict=True):
        for key in ("words", "distinct_2", "tokens", "cut", "reward_pmi"):
            assert new[key] == pytest.approx(old[key], abs=1e-5), key
        for name in ("twin", "other-enc"):
            for key in ("pmi_mean", "gain", "len_adj_gain", "win_rate"):
                assert new["judges"][name].get(key) == pytest.approx(old["judges"][name].get(key), abs=1e-4), key
    assert "kl_reply" in first["rows"][1] and "kl_reply" not in again["rows"][1]
    (tmp_path / "bad.jsonl").write_text('{"context": "hi", "base": [{"reply": "yo"}]}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl, row 1: .*tokens"):
        read_samples(tmp_path / "bad.jsonl")
    rows = (tmp_path / "samples.jsonl").read_text().splitlines()
    second = json.loads(rows[1])
    second["other"] = second["other"][:1]
    (tmp_path / "ragged.jsonl").write_text(rows[0] + "\n" + json.dumps(second) + "\n")
    with pytest.raises(ValueError, match=r"ragged.jsonl, row 2: .*other: 1 replies, the first row 3"):
        read_samples(tmp_path / "ragged.jsonl")


def test_a_base_drawn_more_often_is_paired_by_its_mean_and_read_back(
    tiny_policy, smol_tokenizer, spread_scorer, tmp_path
):
    """--base_samples: the base samples 4 replies a context, the policies 2; each gain is the policy's context mean
    minus the base's mean over its 4, the base's diversity is read on its first 2 (as many as a policy's), the
    header says both counts, and the samples file reads back to the same rows."""
    from pmi_reward.policy.evaluate import EvalPromptArguments, text_metrics
    from pmi_reward.policy.report import write_report

    prompts = [turns_to_messages(t) for t in ("I love jazz.\nWho do you like?", "I flew to Rome.\nHow was it?")]
    policies = {"base": (tiny_policy(0), smol_tokenizer), "other": (tiny_policy(1), smol_tokenizer)}
    judges = _judges(spread_scorer)
    args = EvalArguments(samples=2, base_samples=4, kl=False)
    settings = SamplingSettings(max_new_tokens=6, batch_size=8, seed=7)
    out = evaluate_policies(policies, prompts, judges, spread_scorer, args, settings)
    assert [len(r) for r in out["replies"]["base"].texts] == [4, 4]
    assert [len(r) for r in out["replies"]["other"].texts] == [2, 2]
    rows = {r["policy"]: r for r in out["rows"]}
    assert rows["base"]["replies"] == 4 and rows["other"]["replies"] == 2
    base, other = (np.asarray(out["scores"]["twin"][n]) for n in ("base", "other"))
    assert base.shape == (2, 4) and other.shape == (2, 2)
    assert len(set(np.round(np.r_[base.ravel(), other.ravel()], 4))) == 12  # the replies score apart
    expected = float(np.mean(other.mean(1) - base.mean(1)))
    # pairing with the base's first 2 replies, or unpaired means, would give another gain
    assert abs(expected - float(np.mean(other.mean(1) - base[:, :2].mean(1)))) > 1e-3
    assert rows["other"]["judges"]["twin"]["gain"] == pytest.approx(expected, abs=1e-6)
    first_two = text_metrics([row[:2] for row in out["replies"]["base"].texts], out["contexts"])
    assert rows["base"]["distinct_2"] == pytest.approx(first_two["distinct_2"])
    assert rows["base"]["reward_pmi"] == pytest.approx(float(base.mean()))  # the reward reads all 4
    text = write_report(tmp_path, out, judges, None, EvalPromptArguments(), args, settings)
    assert "2 contexts (chitchat dialogues 3700+) x 2 samples per policy, 4 for the base (T=" in text
    write_samples(tmp_path, out, None, n_contexts=2)
    contexts, _, replies = read_samples(tmp_path / "samples.jsonl")
    again = evaluate_policies({}, contexts, judges, spread_scorer, EvalArguments(), settings, None, replies)
    for old, new in zip(out["rows"], again["rows"], strict=True):
        assert new["distinct_2"] == pytest.approx(old["distinct_2"]) and new["replies"] == old["replies"]
        assert new["judges"]["twin"].get("gain") == pytest.approx(old["judges"]["twin"].get("gain"), abs=1e-4)


def test_an_untrained_chat_lm_judges_and_shares_nothing_with_the_reward(tiny_policy, smol_tokenizer, tmp_path):
    """``name=lm:MODEL``: the chat LM's own PMI as a judge, independent of any trained reward, with the validation
    AUC it is given; a misspelt AUC or one that names no LM judge is refused."""
    tiny_policy(3).save_pretrained(tmp_path / "lm")
    smol_tokenizer.save_pretrained(tmp_path / "lm")
    judges, _, _ = load_judges([f"lm-pmi=lm:{tmp_path / 'lm'}"], None, parse_val_aucs(["lm-pmi=0.886"]))
    judge = judges[0]
    assert judge.val_auc == pytest.approx(0.886) and judge.scorer.context_turns == 3
    reward = {"encoder": "minilm", "training": {"seed": 0}, "data": {"dialogues": "chitchat", "n_dialogues": [8]}}
    judge.shares = relation(judge.meta, reward)
    assert judge.independent and judge.shares["data"] == "different"
    scores = score_grid(PMIReward(judge.scorer), ["I love jazz.\nWho do you like?"], [["Coltrane.", "Ok."]])
    direct = judge.scorer.score(["I love jazz.\nWho do you like?"] * 2, ["Coltrane.", "Ok."])
    np.testing.assert_allclose(scores[0], direct, rtol=1e-5)
    with pytest.raises(ValueError, match="name=AUC"):
        parse_val_aucs(["lm-pmi=high"])
    with pytest.warns(UserWarning, match=r"not in the panel, ignored: \['other'\]"):
        check_panel([f"lm-pmi=lm:{tmp_path / 'lm'}"], {"other": 0.9})


def test_a_judges_flag_replaces_the_panel_of_a_config_with_val_aucs(tmp_path):
    """demo/evaluate (and recipes/smollm2-135m/final/evaluate.yaml) give ``judge_val_auc: [lm-pmi=0.886]`` for their
    panel; ``--judges other=DIR`` was refused for it (a judge_val_auc naming no judge of the panel), and a list flag
    cannot empty it. An entry for a judge not in the panel is ignored with a warning; one for a judge whose folder
    holds its own AUC, or out of [0, 1], is still refused."""
    from pmi_reward.configs import parse_args
    from pmi_reward.policy.evaluate import ARGUMENTS, _check_options

    _, args, settings = parse_args(ARGUMENTS, ["--config", "demo/evaluate", "--judges", f"mine={tmp_path}"])
    assert args.judge_val_auc == ["lm-pmi=0.886"]
    with pytest.warns(UserWarning, match=r"judge_val_auc names judges not in the panel, ignored: \['lm-pmi'\]"):
        assert _check_options(args, settings) == {"lm-pmi": pytest.approx(0.886)}
    with pytest.raises(ValueError, match=r"names no lm: judge of the panel: \['mine'\]"):
        check_panel([f"mine={tmp_path}"], {"mine": 0.8})
    with pytest.raises(ValueError, match="AUC in \\[0, 1\\]"):
        parse_val_aucs(["lm-pmi=1.5"])


def test_load_policy_dir_merges_lora_adapters(tiny_policy, smol_tokenizer, tmp_path):
    from peft import LoraConfig, get_peft_model

    base = tiny_policy(0)
    base.save_pretrained(tmp_path / "base")
    smol_tokenizer.save_pretrained(tmp_path / "base")
    lora = LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    tuned = get_peft_model(tiny_policy(0), lora)
    tuned.peft_config["default"].base_model_name_or_path = str(tmp_path / "base")
    tuned.save_pretrained(tmp_path / "adapter")
    ids = torch.tensor([[1, 5, 9, 12]])
    model, tok = load_policy(str(tmp_path / "adapter"))
    torch.testing.assert_close(model(ids).logits, tuned.eval()(ids).logits, atol=1e-4, rtol=1e-4)
    assert tok.padding_side == "left" and not hasattr(model, "peft_config")
    plain, _ = load_policy(str(tmp_path / "base"))
    torch.testing.assert_close(plain(ids).logits, base.eval()(ids).logits)


def test_an_adapter_trained_on_an_adapter_loads_on_it(tiny_policy, smol_tokenizer, tmp_path):
    """A second LoRA run started from a first one's adapter (``--model_name_or_path stage1 --use_peft``) recorded the
    first one's base as its own, so loading it dropped the first stage. A loaded policy is named by what was asked
    for: the second adapter's base is the first adapter, and it loads merged on it."""
    from peft import LoraConfig, get_peft_model

    tiny_policy(0).save_pretrained(tmp_path / "base")
    smol_tokenizer.save_pretrained(tmp_path / "base")
    lora = LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    tuned = None
    for stage, start in enumerate(("base", "stage1"), 1):
        model, tok = load_policy(str(tmp_path / start), device="cpu")
        torch.manual_seed(stage)
        tuned = get_peft_model(model, lora)
        tuned.save_pretrained(tmp_path / f"stage{stage}")
    recorded = json.loads((tmp_path / "stage2" / "adapter_config.json").read_text())["base_model_name_or_path"]
    assert recorded == str((tmp_path / "stage1").resolve())
    ids = torch.tensor([[1, 5, 9, 12]])
    loaded, tok = load_policy(str(tmp_path / "stage2"), device="cpu")
    torch.testing.assert_close(loaded(ids).logits, tuned.eval()(ids).logits, atol=1e-4, rtol=1e-4)
    assert tok.padding_side == "left"


def test_an_adapter_on_another_machines_copy_of_a_shipped_model_loads_on_this_ones(
    tiny_policy, smol_tokenizer, tmp_path, monkeypatch
):
    """An adapter trained on the shipped SmolLM2 records the converted copy's path in that machine's cache; where
    that path is missing, its base is the shipped model by name."""
    from peft import LoraConfig, get_peft_model

    from pmi_reward.policy import loading

    asked = []
    monkeypatch.setattr(loading, "load_causal_lm", lambda name, *a, **k: asked.append(name) or tiny_policy(0))
    monkeypatch.setattr(loading, "load_tokenizer", lambda *a, **k: smol_tokenizer)
    lora = LoraConfig(r=4, target_modules=["q_proj"], init_lora_weights=False)
    tuned = get_peft_model(tiny_policy(0), lora)
    tuned.peft_config["default"].base_model_name_or_path = "/elsewhere/.cache/pmi_reward/models/smollm2-135m-instruct"
    tuned.save_pretrained(tmp_path / "adapter")
    loading.load_policy(str(tmp_path / "adapter"), device="cpu")
    assert asked == ["smollm2-135m-instruct"]


def test_policies_land_on_the_device_asked_and_training_honours_use_cpu(
    tiny_policy, smol_tokenizer, tmp_path, monkeypatch
):
    """A loaded policy sits on the device asked for (the meta device stands in for a GPU here), by default the one
    ``default_device`` names (the GPU where there is one: sampling, KL and judges run there); a trainer loads it on
    its config's device, so ``use_cpu`` keeps it on the CPU even where a GPU is visible."""
    from trl import ModelConfig, SFTConfig

    from pmi_reward.policy import loading
    from pmi_reward.policy.trainers import policy_from

    tiny_policy(0).save_pretrained(tmp_path)
    smol_tokenizer.save_pretrained(tmp_path)
    model, _ = load_policy(str(tmp_path), device="meta")
    assert {p.device.type for p in model.parameters()} == {"meta"}
    asked = []
    monkeypatch.setattr(loading, "default_device", lambda device=None: asked.append(device) or torch.device("cpu"))
    trainer_device = str(SFTConfig(output_dir=str(tmp_path / "out"), use_cpu=True).device)
    for device in (trainer_device, None):
        model, _ = policy_from(ModelConfig(model_name_or_path=str(tmp_path)), device=device)
        assert next(model.parameters()).device.type == "cpu"
    assert asked == ["cpu", None]


def test_reply_logprobs_match_one_unpadded_pass_per_reply(tiny_policy, smol_tokenizer):
    """The batched, left-padded log-probabilities (logits kept for the reply positions only) equal a plain
    forward pass over each prompt + reply alone, for prompts and replies of different lengths, an empty reply
    included; at temperature 0.5 the logits are divided before the softmax."""
    from pmi_reward.policy.divergence import reply_logprobs

    model, tok = tiny_policy(3), smol_tokenizer
    prompts = [turns_to_messages(t) for t in ("Hi.", "I love jazz.\nWho do you like best, and why?\nColtrane.")]
    replies = [[[11, 12, 13, 14, 15, 16, 17], []], [[21], [31, 32, 33]]]
    got = reply_logprobs(model, tok, prompts, replies, temperature=0.5, batch_size=4)
    for i, p in enumerate(prompts):
        prefix = tok(tok.apply_chat_template(p, add_generation_prompt=True, tokenize=False), add_special_tokens=False)
        for j, r in enumerate(replies[i]):
            ids = torch.tensor([prefix["input_ids"] + r])
            with torch.no_grad():
                logp = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float() / 0.5, -1)
            want = sum(float(logp[len(prefix["input_ids"]) - 1 + k, t]) for k, t in enumerate(r))
            assert got[i, j] == pytest.approx(want, abs=1e-4)
    assert got[0, 1] == 0.0


def test_kl_to_base_is_the_tuned_minus_the_base_log_probability_per_reply_and_per_token(tiny_policy, smol_tokenizer):
    """kl_reply is the mean over replies of log pi_tuned(y|x) - log pi_base(y|x) (the tuned policy first: swapped,
    its sign flips), and kl_token the sum of those differences over the replies' tokens (replies of 1 to 7
    tokens: a mean per reply differs from it); identical policies give exactly 0."""
    from pmi_reward.policy.divergence import kl_to_base, reply_logprobs

    tuned, base, tok = tiny_policy(1), tiny_policy(0), smol_tokenizer
    prompts = [turns_to_messages(t) for t in ("Hi.", "I love jazz.\nWho do you like best, and why?\nColtrane.")]
    replies = [[[11, 12, 13, 14, 15, 16, 17], [40]], [[21], [31, 32, 33]]]
    diff = reply_logprobs(tuned, tok, prompts, replies, 0.7) - reply_logprobs(base, tok, prompts, replies, 0.7)
    assert diff.shape == (2, 2) and np.abs(diff).min() > 1e-3
    kl = kl_to_base(tuned, base, tok, prompts, replies, temperature=0.7)
    assert kl["kl_reply"] == pytest.approx(float(diff.mean()), abs=1e-9)
    assert kl["kl_token"] == pytest.approx(float(diff.sum()) / 12, abs=1e-9)  # 7 + 1 + 1 + 3 tokens
    assert abs(kl["kl_token"] - kl["kl_reply"]) > 1e-3  # a per-reply mean would not pass for it
    swapped = kl_to_base(base, tuned, tok, prompts, replies, temperature=0.7)
    assert swapped["kl_reply"] == pytest.approx(-kl["kl_reply"], abs=1e-9)
    assert kl_to_base(base, base, tok, prompts, replies) == {"kl_reply": 0.0, "kl_token": 0.0}


@pytest.fixture
def no_loading(monkeypatch):
    """Loading a policy or a scorer fails the test: evaluate-policy must check its options first."""
    from pmi_reward.policy import evaluate, panel

    def forbidden(*args, **kwargs):
        raise AssertionError("evaluate-policy loaded a model before checking its options")

    monkeypatch.setattr(evaluate, "load_policy", forbidden)
    monkeypatch.setattr(panel.PMIScorer, "read_config", forbidden)
    monkeypatch.setattr(panel.PMIScorer, "from_pretrained", forbidden)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--samples", "0"], "samples must be >= 1"),
        (["--base_samples", "0"], "base_samples must be >= 1"),
        (["--base_samples", "2"], "base_samples (2) below samples (4)"),
        (["--best_of_n", "4", "0"], "best_of_n must be >= 1"),
        (["--best_of_n", "4"], "--best_of_n reranks with the reward: give --reward_scorer"),
        (["--batch_size", "0"], "batch_size must be >= 1"),
        (["--top_p", "-0.1"], "top_p must be in [0, 1] (0: greedy), got -0.1"),  # generate() failed after loading
        (["--top_p", "1.5"], "top_p must be in [0, 1] (0: greedy), got 1.5"),  # sampled as 1.0 without a word
        (["--judges", "x="], "expected name=scorer_dir"),
        (["--judges", "a=lm:"], "name the chat LM"),
        (["--judges", "a=d1", "a=d2"], "judge names must differ"),
        (["--judge_val_auc", "minilm=high"], "expected name=AUC"),
        (["--judge_val_auc", "j=0.8"], "judge_val_auc names no lm: judge"),  # j's folder holds its own AUC
        (["--judges", "j=outputs/no/judge"], "j=outputs/no/judge: no such scorer folder"),
        (["--tuned", "runs/base"], "is named 'base' like another row"),
        (["--tuned", "a/grpo", "b/grpo"], "is named 'grpo' like another row"),
        (["--tuned", "x/best-of-4", "--best_of_n", "4", "--reward_scorer", "r"], "named 'best-of-4' like another"),
        (["--tuned", "x/best-of-8-rft"], "named 'best-of-8-rft' like another"),  # its KL read as best-of-n's bound
        (["--tuned", "x/reference"], "named 'reference' like another"),  # a samples.jsonl record's key
        (["--max_prompts", "1"], "needs at least 2 contexts, got 1"),
        (["--tuned", "runs/grpo", "--temperature", "0"], "greedy replies (--temperature 0) have none: --kl false"),
    ],
)
def test_evaluate_policy_checks_its_options_before_loading(tmp_path, capsys, no_loading, flags, message):
    """A bad option is one line and exit code 2 before any policy or judge loads; best-of-n without a reward
    scorer or a zero best-of-n failed only after every policy had been sampled, a malformed judge after the
    policies loaded, a tuned policy named like a best-of-n row was silently replaced by it, and one context gave
    a zero-width CI that the verdict read as a certain gain."""
    from pmi_reward.cli.main import main

    prompts = tmp_path / "p.jsonl"
    prompts.write_text("\n".join(json.dumps({"prompt": t}) for t in ("I love jazz.", "I flew to Rome.", "Hi.")))
    argv = ["evaluate-policy", "--prompt_file", str(prompts), "--output_dir", str(tmp_path / "eval")]
    argv += ["--judges", f"j={tmp_path}", *flags]  # a judge folder that is there (flags may name others)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err


@pytest.mark.parametrize(
    ("record", "message"),
    [
        ({"context": "hi", "reference": "yo"}, "no policy's replies"),
        ({"context": "hi", "human reference": [{"reply": "yo", "tokens": 0, "cut": False}]}, "no policy's replies"),
        ({"context": "hi", "base": []}, "base: no replies"),
        ({"context": None, "base": [{"reply": "yo", "tokens": 1, "cut": False}]}, "context: expected text"),
        ({"context": "hi", "base": [{"reply": None, "tokens": 1, "cut": False}]}, "base reply: expected text"),
    ],
)
def test_a_samples_file_without_replies_is_refused_with_its_row(tmp_path, record, message):
    """A row with no policy (was a StopIteration traceback), a policy with no replies (was a report of NaN) and a
    null text (was read as the text "None") name the file and row."""
    path = tmp_path / "s.jsonl"
    path.write_text(json.dumps(record) + "\n")
    with pytest.raises(ValueError, match=rf"s.jsonl, row 1: .*{message}"):
        read_samples(path)


def test_the_report_holds_no_nan(tiny_scorer, tmp_path):
    """A statistic with no value (the length-adjusted gain of one context, distinct-n within one sample) is blank
    in results.md and null in results.json, never the text nan or a NaN that is not JSON."""
    from pmi_reward.policy.evaluate import EvalPromptArguments
    from pmi_reward.policy.report import write_report
    from pmi_reward.policy.sampling import Replies

    texts = {"base": "Ok.", "o": "Who is your favourite?"}
    replies = {name: Replies([[text]], [[[1, 2]]], [[False]], [[2]]) for name, text in texts.items()}
    args, settings = EvalArguments(samples=1), SamplingSettings()
    judges = _judges(tiny_scorer)
    out = evaluate_policies({}, ["I love jazz."], judges, tiny_scorer, args, settings, None, replies)
    assert np.isnan(out["rows"][1]["judges"]["twin"]["len_adj_lo"])
    out["rows"][1].update(kl_reply=float("nan"), kl_token=float("nan"))  # greedy replies: no KL
    text = write_report(tmp_path, out, judges, None, EvalPromptArguments(), args, settings)
    assert "nan" not in text.lower()

    def refuse(constant):
        raise AssertionError(f"results.json holds {constant}")

    saved = json.loads((tmp_path / "results.json").read_text(), parse_constant=refuse)
    assert saved["rows"][1]["judges"]["twin"]["len_adj_lo"] is None


def test_the_report_header_says_where_the_replies_came_from(tiny_scorer, tmp_path):
    """Replies read back from a samples file: the header gives that file and its reply count (3), not the
    --samples default (4), the dialogue range or sampling settings that played no part."""
    from pmi_reward.policy.evaluate import EvalPromptArguments
    from pmi_reward.policy.report import write_report
    from pmi_reward.policy.sampling import Replies

    texts = [["Ok.", "Sure.", "Who?"], ["Nice.", "Where to?", "Fun!"]]
    replies = {"base": Replies(texts, [[[1]] * 3] * 2, [[False] * 3] * 2, [[1] * 3] * 2)}
    args, settings = EvalArguments(from_samples="old/samples.jsonl"), SamplingSettings()
    judges = _judges(tiny_scorer)
    out = evaluate_policies({}, ["I love jazz.", "I flew to Rome."], judges, tiny_scorer, args, settings, None, replies)
    out["prompts_on_trust"] = True  # no contexts record beside the samples: the given options were taken on trust
    text = write_report(tmp_path, out, judges, None, EvalPromptArguments(), args, settings)
    assert text.startswith("2 contexts (from old/samples.jsonl) x 3 samples per policy (replies read back")
    assert json.loads((tmp_path / "results.json").read_text())["prompts_on_trust"] is True


def test_saved_samples_are_placed_by_the_results_beside_them(tmp_path, capsys):
    """--from_samples: the overlap check and the report name the contexts the samples file was drawn from (the
    ``prompts`` record of its results.json), not the prompt options given with it; without that record the given
    options stand, with a warning."""
    from pmi_reward.policy.evaluate import EvalPromptArguments, samples_band

    (tmp_path / "samples.jsonl").write_text("{}\n")
    given = EvalPromptArguments()
    assert samples_band(str(tmp_path / "samples.jsonl"), given) is given
    assert "WARNING" in capsys.readouterr().err
    (tmp_path / "results.json").write_text(json.dumps({"prompts": None}))  # not a record: the given options stand
    assert samples_band(str(tmp_path / "samples.jsonl"), given) is given
    assert "WARNING" in capsys.readouterr().err
    tuning = EvalPromptArguments(first_dialogue=3400, max_dialogues=300)
    (tmp_path / "results.json").write_text(json.dumps({"prompts": {**asdict(tuning), "retired_option": 1}}))
    band = samples_band(str(tmp_path / "samples.jsonl"), given)
    assert (band.first_dialogue, band.max_dialogues) == (3400, 300)
    assert "came from" in capsys.readouterr().err
    # an evaluation of read-back samples written into their own folder recorded the options it took on trust
    on_trust = {"prompts": asdict(tuning), "prompts_on_trust": True}
    (tmp_path / "results.json").write_text(json.dumps(on_trust))
    assert samples_band(str(tmp_path / "samples.jsonl"), given) is given
    assert "taken on trust" in capsys.readouterr().err
    (tmp_path / "results.json").write_text("[]")  # JSON, but not an object
    assert samples_band(str(tmp_path / "samples.jsonl"), given) is given
    assert "WARNING" in capsys.readouterr().err


class _FlakyJudge:
    """A judge that scores every reply but the tuned policy's (NaN for those, or an exception: a bf16 overflow, an
    out-of-memory error)."""

    context_turns = 3

    def __init__(self, mode: str) -> None:
        self.mode = mode

    def score(self, contexts, replies):
        if self.mode == "raise" and any(r.startswith("tuned") for r in replies):
            raise RuntimeError("CUDA out of memory")
        return np.array([np.nan if r.startswith("tuned") else -1.5 + 0.1 * (len(r) % 3) for r in replies])


def _flaky_judge(mode: str) -> Judge:
    reward = {"encoder": "tiny", "training": {"seed": 0}, "data": {"dialogues": "chitchat", "n_dialogues": [8]}}
    judge = Judge("indep", "y", _FlakyJudge(mode), {"encoder": "other", "data": {"train_file": "en.csv"}})
    judge.shares = relation(judge.meta, reward)
    return judge


@pytest.mark.parametrize("mode", ["nan", "raise"])
def test_a_reply_a_judge_could_not_score_is_unscored_not_a_pmi_of_zero(mode, tmp_path):
    """A judge that raised or returned NaN gave the reply PMI 0.0, which entered the gain, its CI and a verdict of
    "gain counts" (the tuned policy's 0.0 beat the base's -1.5); the reward scorer's mean likewise. Now the reply is
    unscored: no PMI, gain or win-rate over it, its share shown, and the verdict not established."""
    from pmi_reward.policy.evaluate import EvalPromptArguments
    from pmi_reward.policy.report import write_report
    from pmi_reward.policy.sampling import Replies

    n = 6
    rows = {
        "base": [[f"base reply {i}", "ok then"] for i in range(n)],
        "tuned": [[f"tuned {i}", "tuned"] for i in range(n)],
    }
    replies = {k: Replies(t, [[[1]] * 2] * n, [[False] * 2] * n, [[1] * 2] * n) for k, t in rows.items()}
    judge, args, settings = _flaky_judge(mode), EvalArguments(samples=2), SamplingSettings()
    prompts = [f"context {i}" for i in range(n)]
    out = evaluate_policies({}, prompts, [judge], _FlakyJudge(mode), args, settings, None, replies)
    base, tuned = out["rows"]
    g = tuned["judges"]["indep"]
    assert g["unscored"] == 1.0 and base["judges"]["indep"]["unscored"] == 0.0
    for key in ("pmi_mean", "gain", "gain_lo", "gain_hi", "len_adj_gain", "binned_gain", "win_rate"):
        assert math.isnan(g[key]), key
    assert all(math.isnan(b["gain"]) for b in g["bins"])
    assert tuned["verdict"].startswith("not established") and "indep left replies unscored" in tuned["verdict"]
    assert math.isnan(tuned["reward_pmi"]) and tuned["reward_unscored"] == 1.0
    assert base["reward_unscored"] == 0.0 and base["reward_pmi"] == pytest.approx(base["judges"]["indep"]["pmi_mean"])
    assert np.isnan(out["scores"]["indep"]["tuned"]).all()
    text = write_report(tmp_path, out, [judge], None, EvalPromptArguments(), args, settings)
    assert "| unscored |" in text and "100.0%" in text and "(100.0% unscored)" in text and "nan" not in text.lower()
    records = sample_records(out, None)
    assert records[0]["tuned"][0]["pmi"] == {"indep": None}  # null in samples.jsonl: JSON has no NaN
    assert "| tuned | tuned 0 | – |" in samples_markdown(records, 1)


def test_only_a_reply_that_shows_nothing_scores_zero_and_counts_as_empty(tiny_scorer):
    """An empty reply scores 0.0 as before; one of invisible characters only scored 0.0 too but was no "empty" reply
    in the report, and a reply that ends inside a <think> block (unfinished reasoning) scored 0.0 unseen. Now both
    empty kinds score 0.0 and count as empty (the reward's own visibility test), and an unfinished reply is
    unscored."""
    from pmi_reward.policy.evaluate import text_metrics
    from pmi_reward.policy.sampling import Replies

    texts = [["", "  \n", "\u200b\ufeff", "<think>hmm</think>\u200b"], ["Jazz!", "<think>so", "Who?", "Rome."]]
    replies = {"base": Replies(texts, [[[1]] * 4] * 2, [[False] * 4] * 2, [[1] * 4] * 2)}
    judge = _judges(tiny_scorer)[1]
    out = evaluate_policies(
        {}, ["I love jazz.", "I flew to Rome."], [judge], None, EvalArguments(), None, None, replies
    )
    scores = np.asarray(out["scores"]["other-enc"]["base"])
    assert (scores[0] == 0.0).all() and math.isnan(scores[1, 1]) and np.isfinite(scores[1]).sum() == 3
    assert (
        out["rows"][0]["empty"] == pytest.approx(4 / 8) and out["rows"][0]["judges"]["other-enc"]["unscored"] == 1 / 8
    )
    assert text_metrics(texts, ["a", "b"])["empty"] == pytest.approx(4 / 8)
    # a run without failures scores every reply exactly as the 0.0-for-every-unscored reward did
    from pmi_reward.policy.evaluate import judge_grid

    normal = [["", "Jazz!", "Who is that?"], ["Rome.", " ", "Pasta?"]]
    old = score_grid(PMIReward(tiny_scorer, empty_score=0.0), ["I love jazz.", "I flew to Rome."], normal)
    np.testing.assert_array_equal(judge_grid(tiny_scorer, ["I love jazz.", "I flew to Rome."], normal), old)


def test_rows_with_fewer_replies_per_context_show_their_count(tiny_scorer, tmp_path):
    """Distinct-n and the top-20 openings share fall as more replies are counted, and best-of-n rows and the human
    reply hold fewer per context than the base and tuned rows, yet the header said "N samples per policy" for every
    row: the diagnostics table now gives each row's replies/context (the base's cut to the tuned count) and the
    header and legend say which rows compare; the figures themselves are as before."""
    from pmi_reward.policy.evaluate import EvalPromptArguments, text_metrics
    from pmi_reward.policy.report import write_report
    from pmi_reward.policy.sampling import Replies

    def rep(texts):
        return Replies(texts, [[[1]] * len(texts[0])] * 2, [[False] * len(texts[0])] * 2, [[1] * len(texts[0])] * 2)

    base = [["Ok.", "Sure.", "Who?", "Jazz!"], ["Nice.", "Where to?", "Fun!", "Rome?"]]
    replies = {
        "base": rep(base),
        "tuned": rep([["Hi.", "Who?"], ["Oh.", "Nice!"]]),
        "best-of-4": rep([["Ok."], ["Fun!"]]),
    }
    args, settings = EvalArguments(samples=2, base_samples=4), SamplingSettings()
    judges = _judges(tiny_scorer)
    prompts = ["I love jazz.", "I flew to Rome."]
    out = evaluate_policies({}, prompts, judges, None, args, settings, ["Coltrane.", "Pasta."], replies)
    rows = {r["policy"]: r for r in out["rows"]}
    assert rows["best-of-4"]["distinct_2"] == text_metrics([["Ok."], ["Fun!"]], prompts)["distinct_2"]
    text = write_report(tmp_path, out, judges, None, EvalPromptArguments(), args, settings)
    assert "x 2 samples per policy, 4 for the base, 1 for best-of-4 and human reference (T=" in text
    table = text[text.index("### Reward-hacking diagnostics") :]
    assert "| policy | replies/context |" in table
    assert "| base | 2 |" in table and "| tuned | 2 |" in table
    assert "| best-of-4 | 1 |" in table and "| human reference | 1 |" in table
    assert "compare them only between rows with the same replies/context" in table


def test_a_tuned_policy_given_as_dot_is_named_by_its_folder(tmp_path, monkeypatch, no_loading):
    """--tuned . (or ./) named its row "" and / too: now "." is the folder it is, and a path with no folder name
    or one that resolves to another row's name is refused."""
    from pmi_reward.policy import evaluate
    from pmi_reward.policy.evaluate import _check_options, _load_policies

    run = tmp_path / "grpo-s0"
    run.mkdir()
    monkeypatch.chdir(run)
    settings = SamplingSettings()
    for given in (".", "./", "../grpo-s0/"):
        _check_options(EvalArguments(tuned=[given], judges=[f"j={tmp_path}"], kl=False), settings)
    monkeypatch.setattr(evaluate, "load_policy", lambda path: (None, None))
    assert list(_load_policies(EvalArguments(tuned=["./"]))[0]) == ["base", "grpo-s0"]
    with pytest.raises(ValueError, match="no folder name"):
        _check_options(EvalArguments(tuned=["/"], judges=[f"j={tmp_path}"], kl=False), settings)
    with pytest.raises(ValueError, match="named 'grpo-s0' like another row"):
        _check_options(EvalArguments(tuned=[".", "../grpo-s0"], judges=[f"j={tmp_path}"], kl=False), settings)


def test_the_trials_log_names_the_contexts_as_the_report_does(tmp_path):
    """The trials log called every run's contexts "chitchat 3700+", a prompt file's and a range's alike."""
    from pmi_reward.policy.evaluate import EvalPromptArguments, _log_trials

    log = tmp_path / "trials.jsonl"
    for prompt_args in (
        EvalPromptArguments(prompt_file="my_prompts.jsonl"),
        EvalPromptArguments(first_dialogue=3400, max_dialogues=300),
    ):
        _log_trials(log, {"rows": [{"policy": "base"}]}, EvalArguments(), prompt_args, {})
    lines = [json.loads(line)["contexts"] for line in log.read_text().splitlines()]
    assert lines == ["from my_prompts.jsonl", "chitchat dialogues 3400-3699"]


def test_policies_are_evaluated_on_prompts_their_chat_templates_accept(smol_tokenizer):
    """A context that opens with an assistant turn ended an evaluation at its first batch under a template that
    requires alternation from a user turn (Gemma, Mistral v0.1-0.3, Llama 2); one set of prompts serves every policy."""
    import copy

    from test_policy_prompts import GEMMA

    from pmi_reward.data.records import DataError
    from pmi_reward.policy.evaluate import _fit_to_templates

    prompts = [[{"role": "assistant", "content": "a"}, {"role": "user", "content": "b"}], "plain text"]
    gemma = copy.deepcopy(smol_tokenizer)
    gemma.chat_template = GEMMA
    assert _fit_to_templates(prompts, {"base": (None, smol_tokenizer)}) == prompts
    assert _fit_to_templates(prompts, {"base": (None, gemma), "t": (None, gemma)}) == [prompts[0][1:], prompts[1]]
    named = copy.deepcopy(gemma)
    named.chat_template = {"default": GEMMA, "tool_use": GEMMA}  # named templates (Command-R, Hermes-2-Pro)
    assert _fit_to_templates(prompts[1:], {"base": (None, named)}) == prompts[1:]
    with pytest.raises(DataError, match="accept different prompts"):
        _fit_to_templates(prompts, {"base": (None, smol_tokenizer), "t": (None, gemma)})


def test_the_default_judge_is_the_folder_its_named_command_writes(tmp_path, capsys, monkeypatch, no_loading):
    """The default panel named outputs/scorers/judge-minilm, a folder nothing writes (the recipe's judge (a) writes
    outputs/scorers/eval-minilm-s1), and the error sent the user to a README section that leaves that judge out."""
    import shlex

    from pmi_reward.cli.main import main
    from pmi_reward.configs import merged_config
    from pmi_reward.policy.evaluate import DEFAULT_JUDGE_COMMAND

    command = shlex.split(DEFAULT_JUDGE_COMMAND)
    configs = [command[i + 1] for i, w in enumerate(command) if w == "--config"]
    written = command[command.index("--output_dir") + 1]
    assert "output_dir" not in merged_config(configs)  # the flag is the folder the command writes
    assert command[:2] == ["pmi-reward", "train"] and EvalArguments().judges == [f"minilm={written}"]
    monkeypatch.chdir(tmp_path)  # where no judge has been trained
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("\n".join(json.dumps({"prompt": t}) for t in ("I love jazz.", "I flew to Rome.")))
    assert main(["evaluate-policy", "--prompt_file", str(prompts), "--output_dir", str(tmp_path / "eval")]) == 2
    err = capsys.readouterr().err
    assert f"judge minilm={written}: no such scorer folder (train it first: {DEFAULT_JUDGE_COMMAND};" in err, err


def test_judges_saved_with_dtype_auto_share_one_encoder(tiny_scorer_dir, tmp_path, monkeypatch):
    """Judges of one encoder share one loaded copy; a config holding "auto" was compared unresolved with the loaded
    encoders' concrete dtype, so every such judge loaded its own."""
    from pmi_reward.policy.panel import _load
    from pmi_reward.scoring import encoder as encoder_module
    from pmi_reward.scoring.encoder import EncoderSpec, TextEncoder
    from pmi_reward.scoring.scorer import PMIScorer

    monkeypatch.setattr(encoder_module, "native_bf16", lambda device: False)
    base = PMIScorer.from_pretrained(tiny_scorer_dir, device="cpu")
    auto = TextEncoder(EncoderSpec(**{**base.encoder.spec.to_dict(), "dtype": "auto"}), device="cpu")
    dirs = [PMIScorer(auto, base.template, base.head).save_pretrained(tmp_path / name) for name in "ab"]
    loaded: list = []
    first, second = (_load(str(d), loaded) for d in dirs)
    assert first.encoder is second.encoder and len(loaded) == 1

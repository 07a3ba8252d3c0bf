"""Reward-hacking diagnostics (length-binned and length-adjusted gain, diversity, templates, questions), the
judge panel (what a judge shares with the reward, the verdict with each judge's AUC) and best-of-n."""

import json
import math

import numpy as np
import pytest

from pmi_reward.evaluation.metrics import mean_ci, row_means
from pmi_reward.policy.best_of_n import best_of_n_kl_bound, best_of_n_replies
from pmi_reward.policy.diagnostics import (
    binned_gain,
    length_adjusted_gain,
    length_edges,
    opening_share,
    question_rate,
    reply_lengths,
    text_diagnostics,
)
from pmi_reward.policy.panel import (
    Judge,
    describe,
    parse_judge,
    pretrained_encoder,
    relation,
    training_range,
    verdict,
)
from pmi_reward.policy.sampling import Replies


def test_length_binned_and_adjusted_gain_equal_the_plain_gain_when_lengths_are_equal():
    rng = np.random.default_rng(0)
    base = rng.normal(0.0, 1.0, (40, 4))
    policy = base + 0.7 + rng.normal(0.0, 0.3, (40, 4))
    lengths = np.full((40, 4), 12.0)
    plain = mean_ci(row_means(policy) - row_means(base)).value
    binned = binned_gain(policy, base, lengths, lengths, length_edges(lengths))
    assert len(binned["bins"]) == 1 and binned["gain"] == pytest.approx(plain)
    assert length_adjusted_gain(policy, base, lengths, lengths).value == pytest.approx(plain)
    # different lengths per context but the same within each context pair: still the plain gain
    varied = np.repeat(rng.integers(3, 30, (40, 1)).astype(float), 4, axis=1)
    assert length_adjusted_gain(policy, base, varied, varied).value == pytest.approx(plain)


def test_a_gain_bought_by_length_vanishes_inside_bins_and_after_the_regression():
    rng = np.random.default_rng(1)
    base_len = rng.integers(5, 40, (60, 4)).astype(float)
    policy_len = base_len + 10.0  # the policy only talks longer
    base, policy = 0.1 * base_len, 0.1 * policy_len  # and PMI is pure length: +1 nat "gain"
    plain = float(np.mean(policy - base))
    assert plain == pytest.approx(1.0)
    adjusted = length_adjusted_gain(policy + rng.normal(0, 1e-3, policy.shape), base, policy_len, base_len)
    assert abs(adjusted.value) < 0.05 and adjusted.low <= adjusted.value <= adjusted.high
    both = np.concatenate([base_len, policy_len], axis=1)
    binned = binned_gain(policy, base, policy_len, base_len, length_edges(both, bins=8))
    assert abs(binned["gain"]) < 0.5 * plain  # inside a bin, lengths (and so PMI) barely differ
    assert sum(b["n_policy"] for b in binned["bins"]) == policy.size


def test_length_adjusted_gain_is_undefined_when_length_and_policy_cannot_be_told_apart():
    # every policy reply 3 words longer than the base's replies to its context (all of one length there): the
    # policy and length columns are collinear within every context, so the coefficient has no value (not a
    # number made of rounding error: 1.25 [-0.38, 3.50] before)
    rng = np.random.default_rng(3)
    base_len = np.repeat(rng.integers(3, 20, (30, 1)).astype(float), 4, axis=1)
    policy_len = base_len[:, :1] + 3.0
    base, policy = rng.normal(0.0, 1.0, (30, 4)), rng.normal(0.5, 1.0, (30, 1))
    adjusted = length_adjusted_gain(policy, base, policy_len, base_len)
    assert math.isnan(adjusted.value) and math.isnan(adjusted.low) and math.isnan(adjusted.high)
    # one context apart from the rest makes it identifiable again
    policy_len[0] += 5.0
    assert math.isfinite(length_adjusted_gain(policy, base, policy_len, base_len).value)


def test_text_diagnostics_see_sameness_templates_and_questions():
    same = [["I love that so much!"] * 3, ["I love that so much!"] * 3]
    varied = [["Where did you go?", "That sounds fun.", "Nice, I have been there too"], ["Who won?", "Ugh", "Ok!"]]
    d_same, d_varied = text_diagnostics(same), text_diagnostics(varied)
    assert d_same["distinct_2_within"] < d_varied["distinct_2_within"]
    assert d_same["distinct_2_across"] < d_varied["distinct_2_across"]
    assert d_same["top20_openings"] == 1.0 and opening_share([f"w{i} x y" for i in range(40)]) == 0.5
    assert d_same["questions"] == 0.0 and question_rate(["a?", "b", "c?", "d"]) == 0.5
    assert reply_lengths([["a b", ""], ["c", "d e f"]]).tolist() == [[2, 0], [1, 3]]
    # one-word replies hold no bigram: their context is left out of distinct-2 within, not counted as all repeats
    short = text_diagnostics([["Sure.", "Nope."], ["I went hiking there last year", "My brother lives near the lake"]])
    assert short["distinct_2_within"] == 1.0 and short["distinct_1_within"] == 1.0
    assert math.isnan(text_diagnostics([["Sure.", "Nope."]])["distinct_2_within"])
    # an empty reply opens with nothing: it is no template, and it counts among the replies
    assert opening_share([f"w{i} x y" for i in range(40)] + [""] * 40) == 0.25


def test_distinct_n_across_contexts_is_undefined_without_an_n_gram_as_within():
    """Different one-word replies to three contexts read distinct-2 across 0.0 (as if everyone got one reply) where
    within gave NaN: neither says anything about repetition without a bigram."""
    d = text_diagnostics([["Sure.", "Nope."], ["Wow!", "Really?"], ["Cool.", "Why?"]])
    assert math.isnan(d["distinct_2_within"]) and math.isnan(d["distinct_2_across"])
    assert d["distinct_1_across"] == 1.0
    empty = text_diagnostics([["", ""], ["", ""]])
    assert all(math.isnan(empty[f"distinct_{n}_{where}"]) for n in (1, 2) for where in ("within", "across"))
    assert text_diagnostics([["Sure thing.", "x"], ["Sure thing.", "y"]])["distinct_2_across"] == 0.5


def test_text_metrics_read_the_answer_the_judges_read():
    """A reasoning model's reply was measured with its <think> block: a generic "Ok." after a long block read as
    a long, non-generic reply (its reasoning's words, openings and question marks counted)."""
    from pmi_reward.policy.evaluate import text_metrics

    think = "<think>\nThe user said hi. Should I ask how they are?\n</think>\n\n"
    replies = [[think + "Ok.", "<think>\n\n</think>\n\nlol"], [think + "I went hiking there last week.", "Ok."]]
    plain = [["Ok.", "lol"], ["I went hiking there last week.", "Ok."]]
    contexts = ["hi", "Where did you go hiking last week?"]
    assert text_metrics(replies, contexts) == text_metrics(plain, contexts)
    metrics = text_metrics(replies, contexts)
    assert metrics["generic"] == 0.75 and metrics["words"] == 2.25 and metrics["questions"] == 0.0
    assert metrics["empty"] == 0.0
    unfinished = text_metrics([["<think>\nStill thinking about it", "Ok."]], ["hi"])
    assert unfinished["empty"] == 0.0 and unfinished["words"] == 0.5  # no answer yet, but not an empty reply


def test_the_pmi_histogram_is_drawn_when_no_reply_was_scored(tmp_path):
    """evaluate-policy draws it after writing its report: with no reply scored by the main judge it raised
    ValueError (the min of nothing) and the command ended in an error."""
    from pmi_reward.evaluation.report import plot_distributions

    assert plot_distributions({}, tmp_path / "none.png").stat().st_size > 1000
    assert plot_distributions({"base": [], "tuned": [1.0, 2.0]}, tmp_path / "one.png").stat().st_size > 1000


REWARD = {
    "encoder": "minilm",
    "training": {"seed": 0},
    "data": {"dialogues": "chitchat", "skip_dialogues": 0, "n_dialogues": [800, 100, 100]},
}


def test_relation_tells_a_twin_from_a_judge_that_shares_nothing():
    twin = {**REWARD, "training": {"seed": 1}, "data": {**REWARD["data"], "skip_dialogues": 1000}}
    smol = {"encoder": "smollm2-135m-instruct", "training": {"seed": 0}, "data": {"train_file": "en/train.csv"}}
    minilm_en = {"encoder": "minilm", "training": {"seed": 0}, "data": {"train_file": "en/train.csv"}}
    r_twin, r_smol, r_en = relation(twin, REWARD), relation(smol, REWARD), relation(minilm_en, REWARD)
    assert r_twin == {"encoder": True, "seed": False, "data": "disjoint dialogues of one corpus", "data_shared": False}
    assert r_smol["data"] == "different" and not r_smol["encoder"] and r_smol["seed"]
    assert relation(REWARD, REWARD)["data"] == "same dialogues"
    leaky = {**twin, "data": {**REWARD["data"], "skip_dialogues": 500}}
    assert relation(leaky, REWARD)["data_shared"]
    judges = [Judge(n, n, None, m, r) for n, m, r in (("twin", twin, r_twin), ("smol", smol, r_smol))]
    judges.append(Judge("minilm-en", "p", None, minilm_en, r_en))
    assert [j.independent for j in judges] == [False, True, False]  # same seed number is moot across encoders
    assert training_range(twin) == ("chitchat", 1000, 2000) and training_range(smol) is None
    assert describe(twin) == "minilm, seed 1, chitchat dialogues 1000-1999"
    assert parse_judge("a=/x/y") == ("a", "/x/y") and parse_judge("/s/sc-lines/") == ("sc-lines", "/s/sc-lines/")


def test_a_fine_tuned_encoder_and_pair_files_beside_dialogues_count_as_shared():
    """A fine-tuned MiniLM is still MiniLM; a reward trained on dialogues AND a pair file shares that file."""
    tuned = {**REWARD, "base_encoder": "minilm", "encoder": pretrained_encoder("./encoder", {"base_encoder": "minilm"})}
    smol = {"encoder": "smollm2-135m-instruct", "training": {"seed": 0}, "data": {"train_file": "en/train.csv"}}
    minilm_en = {**smol, "encoder": "minilm"}
    assert relation(minilm_en, tuned)["encoder"] and not relation(smol, tuned)["encoder"]
    assert pretrained_encoder("minilm", {"base_encoder": "other"}) == "minilm"  # a named encoder is itself
    both = {**REWARD, "data": {**REWARD["data"], "train_file": "en/train.csv"}}  # `make scorer` with ../shared
    assert relation(smol, both) == {"encoder": False, "seed": True, "data": "shared pair files", "data_shared": True}
    assert not Judge("smol", "p", None, smol, relation(smol, both)).independent
    assert relation(smol, REWARD)["data"] == "different"
    twin = {**both, "data": {**both["data"], "skip_dialogues": 1000}}  # other dialogues, the same file
    assert relation(twin, both)["data"] == "shared pair files"


def test_one_encoder_under_another_name_and_a_judge_of_unknown_data_are_not_independent():
    """Encoders were compared as typed: a MiniLM judge saved as "all-MiniLM-L6-v2" (or its Hub id) shared "nothing"
    with a "minilm" reward and could decide the verdict; a judge whose metadata does not say what it trained on
    (saved by recipes/scorer/run.py) counted as sharing no data."""
    smol = {"encoder": "smollm2-135m-instruct", "training": {"seed": 0}, "data": {"train_file": "en/train.csv"}}
    for name in ("all-MiniLM-L6-v2", "MiniLM", "sentence-transformers/all-MiniLM-L6-v2"):
        assert relation({**smol, "encoder": name}, REWARD)["encoder"]
    assert not relation({**smol, "encoder": "HuggingFaceTB/SmolLM2-135M-Instruct"}, REWARD)["encoder"]
    smol_lm = {**smol, "encoder": "smollm2-135m-instruct"}
    assert relation({**smol, "encoder": "HuggingFaceTB/SmolLM2-135M-Instruct"}, smol_lm)["encoder"]
    assert not relation({**smol, "encoder": "HuggingFaceTB/SmolLM2-135M"}, smol_lm)["encoder"]  # the base LM: another
    assert not relation({**smol, "encoder": "someone/all-MiniLM-L6-v2"}, REWARD)["encoder"]  # another org's weights
    unrecorded = {"encoder": "smollm2-135m-instruct", "training": {"seed": 3}, "recipe": "scorer"}
    shares = relation(unrecorded, REWARD)
    assert shares["data"] == "unknown" and not Judge("u", "p", None, unrecorded, shares).independent
    lm = {"encoder": "smollm2", "method": "lm_pmi", "data": {}, "training": {}}
    assert Judge("lm", "p", None, lm, relation(lm, REWARD)).independent  # trains on nothing: still independent


def test_verdict_needs_every_independent_judge_and_prints_their_auc():
    def judge(name, independent, auc):
        shares = {"encoder": not independent, "seed": False, "data": "different", "data_shared": False}
        return Judge(name, name, None, {"best_val_auc": auc}, shares)

    panel = [judge("twin", False, 0.85), judge("a", True, 0.80), judge("b", True, None)]
    up = {"twin": (1.0, 0.5, 1.5), "a": (0.4, 0.1, 0.7), "b": (0.3, 0.05, 0.6)}
    text = verdict(up, panel)
    assert text.startswith("gain counts") and "val AUC 0.800" in text and "val AUC unknown" in text
    assert "twin" not in text
    assert verdict({**up, "b": (0.3, -0.1, 0.6)}, panel).startswith("not established")
    assert verdict({**up, "a": (-1, -2, -0.5), "b": (-1, -2, -0.1)}, panel).startswith("loss")
    assert verdict(up, panel[:1]).startswith("no judge shares nothing")


def test_best_of_n_keeps_the_reward_favourite_of_each_disjoint_group():
    texts = [[f"r{i}" for i in range(8)], [f"s{i}" for i in range(8)]]
    pool = Replies(texts, [[[i] for i in range(8)]] * 2, [[i == 7 for i in range(8)]] * 2)
    scores = np.array([[0, 5, 1, 2, 9, 1, 1, 3], [np.nan, np.nan, np.nan, 1, 0, 0, 0, np.nan]], dtype=float)
    b4 = best_of_n_replies(pool, scores, 4)
    assert b4.texts == [["r1", "r4"], ["s3", "s4"]]
    b8 = best_of_n_replies(pool, scores, 8)
    assert b8.texts == [["r4"], ["s3"]] and b8.truncated == [[False], [False]]
    assert best_of_n_replies(pool, scores, 1).texts == texts
    with pytest.raises(ValueError, match="multiple of 3"):
        best_of_n_replies(pool, scores, 3)
    assert best_of_n_kl_bound(1) == 0.0 and best_of_n_kl_bound(16) == pytest.approx(math.log(16) - 15 / 16)


def test_repetition_recipe_separates_repeats_inside_replies(tmp_path, capsys, monkeypatch):
    from conftest import load_recipe

    recipe = load_recipe("recipes/smollm2-135m/repetition.py")
    clean = recipe.reply_stats(["I went hiking with my dog today.", "Which book are you reading now?"])
    assert clean == {"replies": 2, "repeated_3grams": 0.0, "with_repeat": 0.0, "distinct2_in_reply": 1.0}
    looped = recipe.reply_stats(["it is crazy it is crazy it is crazy", "I went hiking with my dog today."])
    assert looped["with_repeat"] == 0.5 and 0.0 < looped["repeated_3grams"] < 0.5
    assert looped["distinct2_in_reply"] < 1.0
    row = {"context": "c", "reference": "r", "base": [{"reply": "ok then ok then ok then"}], "human reference": []}
    (tmp_path / "samples.jsonl").write_text(json.dumps(row) + "\n")
    monkeypatch.setattr("sys.argv", ["repetition.py", str(tmp_path / "samples.jsonl")])
    recipe.main()
    out = capsys.readouterr().out
    assert "| base | 1 |" in out and "human reference" not in out


def test_repetition_recipe_names_an_empty_samples_file(tmp_path, monkeypatch, capsys):
    from conftest import load_recipe

    recipe = load_recipe("recipes/smollm2-135m/repetition.py")
    empty = tmp_path / "samples.jsonl"
    empty.write_text("\n")
    monkeypatch.setattr("sys.argv", ["repetition.py", str(empty)])
    with pytest.raises(SystemExit):
        recipe.main()
    assert f"{empty}: no samples" in capsys.readouterr().err


def test_seeds_recipe_averages_gains_over_seeds(tmp_path, monkeypatch, capsys):
    from conftest import load_recipe

    recipe = load_recipe("recipes/smollm2-135m/seeds.py")
    assert recipe.seed_groups(["base", "grpo-s0", "grpo-s1", "grpo-s2", "best-of-4", "rloo-s0"]) == {
        "grpo": ["grpo-s0", "grpo-s1", "grpo-s2"]
    }
    offsets = {"grpo-s0": 0.5, "grpo-s1": 1.0, "grpo-s2": 1.5}  # each seed's mean gain over the base
    rows = []
    for c in range(20):
        row = {"context": f"c{c}", "base": [{"reply": "b", "pmi": {"j": float(c)}} for _ in range(2)]}
        spread = 0.4 if c % 2 else -0.4  # contexts differ, so the CI over contexts has a width
        for p, d in offsets.items():
            row[p] = [{"reply": "p", "pmi": {"j": c + d + spread + e}} for e in (-0.25, 0.25)]
        rows.append(row)
    (tmp_path / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    g = recipe.group_gain(rows, list(offsets), "j")
    assert g["seeds"] == pytest.approx([0.5, 1.0, 1.5])
    assert g["mean"] == pytest.approx(1.0) and g["std"] == pytest.approx(0.5)
    assert g["pooled"] == pytest.approx(1.0) and 0.6 <= g["low"] < 1.0 < g["high"] <= 1.4
    diag = [{"policy": "base", "reward_pmi": 2.0, "words": 20.0, "distinct_2": 0.7, "kl_reply": 0.0}]
    diag += [{"policy": p, "reward_pmi": 3.0, "words": 16.0, "distinct_2": 0.8, "kl_reply": 2.0} for p in offsets]
    (tmp_path / "results.json").write_text(json.dumps({"rows": diag}))
    monkeypatch.setattr("sys.argv", ["seeds.py", str(tmp_path)])
    recipe.main()
    out = capsys.readouterr().out
    assert "| grpo | j | 3 | +0.50 / +1.00 / +1.50 | +1.00 ± 0.50 |" in out
    assert "| +3.00 (base +2.00) | 16.0 (-20%) | 0.800 (base 0.700) | 2.00 |" in out


def test_overlap_recipe_measures_how_far_replies_moved_from_the_base(tmp_path, monkeypatch, capsys):
    from conftest import load_recipe

    recipe = load_recipe("recipes/smollm2-135m/overlap.py")
    assert recipe.shared_opening("I went hiking today", "I went swimming") == 0.5
    assert recipe.shared_opening("ok", "ok") == 1.0 and recipe.shared_opening("ok", "no") == 0.0
    stats = recipe.overlap_stats(["a b", "c d", "e f g h"], ["a b", "x d", "e f y"])
    assert stats == {"replies": 3, "identical": pytest.approx(1 / 3), "shared_opening": pytest.approx(0.5)}
    with pytest.raises(ValueError, match="same seeds"):
        recipe.overlap_stats(["a"], ["a", "b"])
    row = {"context": "c", "base": [{"reply": "a b"}, {"reply": "c d"}], "p": [{"reply": "a b"}, {"reply": "e"}]}
    (tmp_path / "samples.jsonl").write_text(json.dumps({**row, "human reference": [{"reply": "h"}]}) + "\n")
    monkeypatch.setattr("sys.argv", ["overlap.py", str(tmp_path / "samples.jsonl")])
    recipe.main()
    out = capsys.readouterr().out
    assert "| p | 2 | 0.500 | 0.500 |" in out and "human reference" not in out and "| base |" not in out


def test_base_draw_recipe_measures_the_gain_a_lucky_or_unlucky_base_draw_gives_every_trial(
    tmp_path, monkeypatch, capsys
):
    from conftest import load_recipe

    recipe = load_recipe("recipes/smollm2-135m/base_draw.py")

    def write(name: str, scores: list[list[float]], contexts: list[str]) -> str:
        rows = [
            {"context": c, "base": [{"reply": "r", "pmi": {"j": x, "k": 0.0}} for x in xs]}
            for c, xs in zip(contexts, scores, strict=True)
        ]
        (tmp_path / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
        return str(tmp_path / name)

    fixed = write("fixed.jsonl", [[0.0, 1.0], [1.0, 1.0], [2.0, 0.0]], ["a", "b", "c"])
    fresh = write("fresh.jsonl", [[1.0, 1.0, 1.0], [2.0, 2.0, 2.0], [2.0, 2.0, 2.0]], ["a", "b", "c"])
    monkeypatch.setattr("sys.argv", ["base_draw.py", fixed, fresh])
    recipe.main()
    out = capsys.readouterr().out
    assert (
        "3 contexts" in out
        and "| j | +0.83 | +1.67 | +0.83 [" in out
        and "| k | +0.00 | +0.00 | +0.00 [+0.00, +0.00] |" in out
    )
    write("other.jsonl", [[1.0], [1.0], [1.0]], ["a", "b", "d"])
    with pytest.raises(ValueError, match="different contexts"):
        recipe.compare(tmp_path / "fixed.jsonl", tmp_path / "other.jsonl")


def test_judge_scale_recipe_gives_every_context_another_contexts_base_reply(tmp_path, monkeypatch):
    from conftest import load_recipe

    from pmi_reward.policy.samples import read_samples

    recipe = load_recipe("recipes/smollm2-135m/judge_scale.py")
    for n in (2, 3, 10):
        donor = recipe.derangement(n, seed=n)
        assert sorted(donor) == list(range(n)) and all(donor != np.arange(n))
    with pytest.raises(ValueError, match="at least 2 contexts"):
        recipe.derangement(1)
    rows = [
        {
            "context": f"c{i}",
            "reference": f"h{i}",
            "base": [{"reply": f"b{i}-{k}", "pmi": {"j": 0.0}, "tokens": 3, "cut": False} for k in range(2)],
            "other": [{"reply": f"o{i}", "pmi": {"j": 0.0}, "tokens": 2, "cut": False}],
            "human reference": [{"reply": f"h{i}", "pmi": {"j": 0.0}, "tokens": 0, "cut": False}],
        }
        for i in range(5)
    ]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    monkeypatch.setattr("sys.argv", ["judge_scale.py", str(tmp_path / "in.jsonl"), str(tmp_path / "out.jsonl")])
    recipe.main()
    contexts, references, replies = read_samples(tmp_path / "out.jsonl")
    assert contexts == [f"c{i}" for i in range(5)] and references == [f"h{i}" for i in range(5)]
    assert list(replies) == ["base", "mismatched", "human reference"]
    assert replies["base"].texts == [[f"b{i}-0", f"b{i}-1"] for i in range(5)]
    given = [row[0] for row in replies["mismatched"].texts]
    assert sorted(given) == [f"b{i}-0" for i in range(5)] and all(g != f"b{i}-0" for i, g in enumerate(given))


def test_judge_agreement_recipe_reads_one_judges_pick_by_another(tmp_path, monkeypatch, capsys):
    from conftest import load_recipe

    recipe = load_recipe("recipes/smollm2-135m/judge_agreement.py")
    # judge a and b agree on the order of every context's replies, c reverses it
    a = np.array([[0.0, 1.0, 2.0], [3.0, 1.0, 2.0]])
    b, c = 2 * a, -a
    assert recipe.pick_gain(a, b).tolist() == pytest.approx([4.0 - 2.0, 6.0 - 4.0])
    assert recipe.pick_gain(a, c).tolist() == pytest.approx([-2.0 + 1.0, -3.0 + 2.0])
    assert recipe.within_spearman(a, b) == pytest.approx(1.0) and recipe.within_spearman(a, c) == pytest.approx(-1.0)
    rows = [
        {
            "context": f"c{i}",
            "base": [{"reply": "r", "pmi": {"a": x, "b": y, "c": z}} for x, y, z in zip(*t, strict=True)],
        }
        for i, t in enumerate(zip(a, b, c, strict=True))
    ]
    (tmp_path / "s.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    monkeypatch.setattr("sys.argv", ["judge_agreement.py", str(tmp_path / "s.jsonl")])
    recipe.main()
    out = capsys.readouterr().out
    assert "2 contexts, 3 replies of base each" in out and "| a | b | +2.00 [+2.00, +2.00] | +1.00 |" in out
    assert "| a | c | -1.00 [-1.00, -1.00] | -1.00 |" in out
    rows[1]["base"] = rows[1]["base"][:2]
    (tmp_path / "ragged.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(ValueError, match="same number"):
        recipe.agreement(tmp_path / "ragged.jsonl")


def test_scrambled_recipe_tells_a_scorer_that_reads_word_order_from_one_that_reads_bags_of_words(
    tmp_path, monkeypatch, capsys
):
    from conftest import load_recipe

    recipe = load_recipe("recipes/smollm2-135m/scrambled.py")
    fluent = ["I went hiking today with my dog", "Have you ever been to the coast?"]
    base = [{"reply": fluent[0]}, {"reply": "ok"}]
    rows = [{"context": "c", "base": base, "human reference": [{"reply": fluent[1]}]}]
    (tmp_path / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

    class Scorer:
        def __init__(self, reads_order: bool):
            self.reads_order = reads_order

        def score(self, contexts, replies):
            return [float(r in fluent) if self.reads_order else float(len(set(r.split()))) for r in replies]

    monkeypatch.setattr(recipe.PMIScorer, "from_pretrained", lambda d: Scorer(d == "lm"))
    monkeypatch.setattr(recipe, "require_scorer", lambda *args: None)  # "lm" and "bow" are stand-ins, no folders
    monkeypatch.setattr("sys.argv", ["scrambled.py", str(tmp_path / "samples.jsonl"), "--scorers", "a=lm", "b=bow"])
    recipe.main()
    out = capsys.readouterr().out
    assert "| a | base | 1 | 1.00 | +1.00 | +0.00 |" in out  # "ok" has no scramble and is left out
    assert "| b | human reference | 1 | 0.50 | +7.00 | +7.00 |" in out


def test_fluency_recipe_puts_word_salad_and_invented_words_above_fluent_replies_under_the_real_base_model(
    tmp_path, monkeypatch, capsys
):
    from conftest import load_recipe

    from pmi_reward.evaluation.baselines.lm_pmi import LMPMIScorer

    recipe = load_recipe("recipes/smollm2-135m/fluency.py")
    lm = LMPMIScorer()
    context = "What did you do this weekend?"
    fluent = "I went hiking with my dog and we had a great time."
    salad = "dog time hiking great went I a and my had with we."
    invented = "Especially pyrofloakes haha. They're a lifeskiaerwalk!! balances haha."
    nll = recipe.reply_nll(lm, [context] * 4, [fluent, salad, invented, ""])
    assert nll[0] < nll[1] and nll[0] < nll[2] and np.isfinite(nll[3])  # empty: the NLL of stopping at once
    row = {"context": context, "base": [{"reply": fluent}], "p": [{"reply": invented}]}
    (tmp_path / "samples.jsonl").write_text(json.dumps(row) + "\n")
    monkeypatch.setattr(recipe, "LMPMIScorer", lambda config: lm)
    recipe.main([str(tmp_path / "samples.jsonl"), "--policies", "base", "p"])
    out = capsys.readouterr().out
    assert "| base | 1 |" in out and "0.0% |" in out and "| p | 1 |" in out and "100.0% |" in out

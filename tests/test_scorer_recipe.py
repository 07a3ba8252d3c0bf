"""recipes/scorer/run.py: the self-normalised score, the rule that reuses a saved scorer instead of retraining, and
how the human set's contexts are cut."""

from __future__ import annotations

import copy
import json
from dataclasses import asdict

import numpy as np
from conftest import load_recipe
from scipy.special import logsumexp

from pmi_reward.data.pairs import PairSet
from pmi_reward.training.loop import TrainConfig

RUN = load_recipe("recipes/scorer/run.py")


def test_self_normalised_scores_average_to_one_in_exp_over_the_reference_for_every_context(tiny_encoder):
    """The transform enforces E_{r ~ p(r)} exp s(c, r) = 1 per context (the NWJ optimum's property)."""
    reference = ["the cat sat on the mat", "rain again today", "I like trains a lot", "see you tomorrow"]
    contexts = ["hello there\nhow are you doing", "what do you do for a living"]
    pairs = PairSet.from_pairs([c for c in contexts for _ in reference], reference * len(contexts))
    scoring = RUN.Scoring(tiny_encoder)
    raw = scoring(scoring.features(pairs), pairs.ctx, pairs.resp).astype(np.float64).reshape(2, -1)
    offset = RUN.self_normalise(scoring, pairs, reference).reshape(2, -1)
    assert np.allclose(offset, offset[:, :1])  # one offset per context
    assert abs(offset[0, 0] - offset[1, 0]) > 1e-6  # and it differs between contexts
    assert np.allclose(logsumexp(raw - offset, axis=1) - np.log(len(reference)), 0.0, atol=1e-9)


def test_reference_replies_are_distinct_seeded_training_replies():
    train = PairSet.from_pairs(["a", "b", "c", "d"], ["x", "y", "x", "z"])
    first = RUN.reference_replies(train, 3)
    assert sorted(first) == ["x", "y", "z"] and first == RUN.reference_replies(train, 3)


def test_a_saved_scorer_is_reused_when_a_later_option_sits_at_its_default():
    current = {"train_data": ["study"], "training": json.loads(json.dumps(asdict(TrainConfig(seed=1))))}
    saved = copy.deepcopy(current)
    del saved["training"]["encoder_attention_dropout"]  # saved before the option existed
    assert RUN.same_settings(saved, current)

    def changed(**training) -> dict:
        return {**current, "training": {**current["training"], **training}}

    assert not RUN.same_settings(saved, changed(encoder_attention_dropout=0.0))
    assert not RUN.same_settings(saved, changed(seed=2))
    assert not RUN.same_settings(None, current)


def test_the_paired_difference_of_spearman_is_zero_for_a_scorer_against_itself_and_sees_a_real_gap():
    rng = np.random.default_rng(0)
    y = rng.normal(size=300)
    noisy = y + rng.normal(scale=2.0, size=300)
    same, same_ci = RUN.paired_difference(noisy, noisy, y, n_boot=200)
    assert same == 0.0 and same_ci == (0.0, 0.0)
    delta, (low, high) = RUN.paired_difference(y + rng.normal(scale=0.5, size=300), noisy, y, n_boot=200)
    assert delta > 0.3 and 0 < low < delta < high
    assert RUN.paired_difference(noisy, y, y, n_boot=200)[1][1] < 0  # the other way round: the interval below 0


def test_the_lm_mix_weights_a_head_and_the_chat_lm_and_reads_texts_by_index(tiny_encoder, tiny_policy, smol_tokenizer):
    from pmi_reward.evaluation.baselines.lm_pmi import LMPMIConfig, LMPMIScorer

    contexts = ["hello there\nhow are you doing", "what do you do for a living"]
    replies = ["fine thanks", "I teach maths", "ok"]
    pairs = PairSet.from_pairs([c for c in contexts for _ in replies], replies * len(contexts))
    lm = LMPMIScorer(LMPMIConfig(), model=tiny_policy(0), tokenizer=smol_tokenizer)
    cosine, lm_scoring = RUN.Scoring(tiny_encoder), RUN.LMScoring(tiny_encoder, lm)
    features = cosine.features(pairs)
    ctx, resp = pairs.ctx.reshape(2, 3), pairs.resp.reshape(2, 3)  # 2-D index arrays keep their shape
    direct = lm.score(pairs.context_texts, pairs.response_texts).reshape(2, 3)
    np.testing.assert_allclose(lm_scoring(features, ctx, resp), direct, rtol=1e-6)
    mix = RUN.MixScoring(cosine, lm_scoring, 0.2)
    np.testing.assert_allclose(mix(features, ctx, resp), 0.8 * cosine(features, ctx, resp) + 0.2 * direct, rtol=1e-5)
    both = RUN.MixScoring(cosine, lm_scoring, 0.2, "min")
    want = np.minimum(cosine(features, ctx, resp), 0.2 * direct)
    np.testing.assert_allclose(both(features, ctx, resp), want, rtol=1e-5)


def test_the_cosine_mix_adds_the_cosine_of_plain_embeddings_to_a_head_that_reads_context_lines(tiny_encoder):
    """head + w x cos: the cosine is that of the context and reply embeddings alone (the cosine row's), not of the
    head's stacked line features, and the head's own score is unchanged."""
    import torch

    from pmi_reward.scoring.head import HeadConfig, PMIHead

    torch.manual_seed(0)
    head = RUN.Scoring(tiny_encoder, PMIHead(HeadConfig(dim=tiny_encoder.dim, line_turns=2)))
    contexts = ["hello there\nhow are you doing\nfine", "what do you do for a living"]
    replies = ["fine thanks", "I teach maths", "ok"]
    pairs = PairSet.from_pairs([c for c in contexts for _ in replies], replies * len(contexts))
    ctx, resp = pairs.ctx.reshape(2, 3), pairs.resp.reshape(2, 3)
    features = head.features(pairs)
    cosine = RUN.Scoring(tiny_encoder)
    want_cos = cosine(cosine.features(pairs), ctx, resp)
    mix = RUN.MixScoring(head, cosine, 4.0, "add")
    got = mix(features, ctx, resp)
    np.testing.assert_allclose(got, head(features, ctx, resp) + 4.0 * want_cos, rtol=1e-5, atol=1e-6)
    assert np.ptp(want_cos) > 1e-3  # the cosine term varies, so a wrong one would show


def test_a_row_scores_with_its_trained_head_the_mix_the_lm_or_the_cosine(tiny_encoder, tiny_policy, smol_tokenizer):
    """The row's scorer follows the method: a trained head is never replaced by the cosine (a regression of
    ffb1eff scored plain head rows with the cosine)."""
    from pmi_reward.evaluation.baselines.lm_pmi import LMPMIConfig, LMPMIScorer
    from pmi_reward.scoring.head import HeadConfig, PMIHead

    head = RUN.Scoring(tiny_encoder, PMIHead(HeadConfig(dim=tiny_encoder.dim)))
    lm = LMPMIScorer(LMPMIConfig(), model=tiny_policy(0), tokenizer=smol_tokenizer)
    args = RUN.ScorerRecipeArguments(name="t", lm_weight=0.3, lm_combine="min")
    assert RUN.row_scoring(tiny_encoder, head, None, args) is head
    mix = RUN.row_scoring(tiny_encoder, head, lm, args)
    assert isinstance(mix, RUN.MixScoring) and mix.combine == "min" and mix.weight == 0.3
    assert type(RUN.row_scoring(tiny_encoder, None, lm, args)) is RUN.LMScoring
    cosine = RUN.row_scoring(tiny_encoder, None, None, args)
    assert type(cosine) is RUN.Scoring and cosine.head is None
    plus = RUN.row_scoring(tiny_encoder, head, None, RUN.ScorerRecipeArguments(name="t", cosine_weight=2.0))
    assert isinstance(plus, RUN.MixScoring) and plus.combine == "add" and plus.other.head is None


def test_the_human_set_is_cut_like_the_others_unless_read_whole(tmp_path):
    """`--human_context_turns 0` reads the raters' whole conversation; by default it is cut at `--context_turns`."""
    turns = "\n".join(f"turn {i}" for i in range(6))
    (tmp_path / "human.csv").write_text(
        f'context,response,dialog_key,annot_relevant_mean,annot_engaging_mean\n"{turns}",a reply,k1,2.5,1.0\n'
    )

    def context(*argv: str) -> str:
        args = RUN.parse_args((RUN.ScorerRecipeArguments,), ["--name", "x", *argv])[0]
        return RUN.human_pairs(args, tmp_path).context_texts[0]

    assert context() == "turn 3\nturn 4\nturn 5"
    assert context("--context_turns", "2") == "turn 4\nturn 5"
    assert context("--human_context_turns", "0") == turns
    assert context("--human_context_turns", "4") == "turn 2\nturn 3\nturn 4\nturn 5"


def test_the_report_adds_the_paired_columns_where_every_seed_has_them():
    report = load_recipe("recipes/scorer/report.py")
    row = {"stage": "test", **{c: 0.5 for c in report.COLUMNS["test"]}}
    runs = [
        {**row, "name": "cosine", "seed": 0},
        *({**row, "name": "head", "seed": s, "spearman_relevant_minus_cosine": d} for s, d in ((0, -0.1), (1, -0.3))),
    ]
    lines = report.table("test", runs).splitlines()
    assert "spearman_relevant_minus_cosine" in lines[0] and "spearman_engaging_minus_cosine" not in lines[0]
    assert lines[2].rstrip(" |").endswith("-") and "-0.200 ± 0.141" in lines[3]
    assert "-0.2000 ± 0.1414" in report.table("test", runs, digits=4).splitlines()[3]  # --digits 4


def test_the_report_keeps_rows_that_read_the_human_set_another_way_apart():
    """The same scorer's test rows with the human set's contexts cut (the default) and whole are two protocols: one
    table row each, and one per-seed row each (they were merged into one mean, and the per-seed table kept the last)."""
    report = load_recipe("recipes/scorer/report.py")
    row = {"stage": "test", "name": "head", **{c: 0.5 for c in report.COLUMNS["test"]}}
    runs = [{**row, "seed": s, "spearman_relevant": 0.2} for s in (0, 1)]
    runs += [{**row, "seed": s, "spearman_relevant": 0.3, "human_context_turns": 0} for s in (0, 1)]
    runs += [{"stage": "val", "name": "head", "seed": s, "auc_random": 0.9} for s in (0, 1)]
    lines = report.table("test", runs).splitlines()[2:]
    assert len(lines) == 2 and "0.200 ± 0.000" in lines[0] and "0.300 ± 0.000" in lines[1]
    assert "head (human set: whole contexts)" in lines[1]
    seeds = report.per_seed_table(runs, ["head"]).splitlines()[2:]
    assert [line.split("|")[-2].strip() for line in seeds] == ["0.200", "0.200", "0.300", "0.300"]
    assert all("0.900" in line for line in seeds)  # the validation figure the choice read, beside both


def test_the_report_keeps_a_rerun_of_one_name_apart(tmp_path):
    """A name rerun into the same log (the README's `$M` after `$R --name lines-3r1c-k8+chitchat2k`, 2026-11-25) merged
    both runs into one row of 6 "seeds" while the per-seed table kept only the later: the rerun is its own row, "(run
    2)". More seeds of one run (--first_seed) still join its row."""
    report = load_recipe("recipes/scorer/report.py")
    row = {"name": "k8", "stage": "val", "train_pairs": 15434, **{c: 0.5 for c in report.COLUMNS["val"]}}
    log = tmp_path / "runs.jsonl"
    log.write_text("".join(json.dumps({**row, "seed": s, "auc_random": 0.9 + 0.02 * (s > 2)}) + "\n" for s in range(6)))
    assert "| k8 | 15434 | 6 | 0.910 ± 0.011 |" in report.table("val", json_lines(log))  # seeds 3-5 extend the run
    log.write_text(
        "".join(json.dumps({**row, "seed": s, "auc_random": 0.91}) + "\n" for s in range(3))
        + "".join(json.dumps({**row, "seed": s, "auc_random": 0.92}) + "\n" for s in range(3))
    )
    text = report.table("val", json_lines(log))
    assert "| k8 | 15434 | 3 | 0.910 ± 0.000 |" in text and "| k8 (run 2) | 15434 | 3 | 0.920 ± 0.000 |" in text
    per_seed = report.per_seed_table(json_lines(log), ["k8", "k8 (run 2)"])
    assert per_seed.count("| 0.910 |") == 3 and per_seed.count("| 0.920 |") == 3
    assert report.main(["--runs", str(log)]) == 0


def json_lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_a_prompt_mode_scorer_scores_its_prompts_on_negatives_mined_by_plain_embeddings(tiny_encoder):
    """A prompt-mode row scores (context, reply) prompts with its own scorer, as ``PMIScorer.score`` does, while
    the features it hands out for mining are the pretrained encoder's pair embeddings (every row's negatives)."""
    import torch

    from pmi_reward.scoring.head import HeadConfig, PMIHead
    from pmi_reward.scoring.scorer import PMIScorer
    from pmi_reward.scoring.templates import TEMPLATES

    torch.manual_seed(0)
    head = PMIHead(HeadConfig(dim=tiny_encoder.dim, input_mode="prompt"))
    scorer = PMIScorer(tiny_encoder, TEMPLATES["en"], head)
    row = RUN.PromptScoring(tiny_encoder, scorer)
    contexts = ["hello there\nhow are you doing", "what do you do for a living"]
    replies = ["fine thanks", "I teach maths", "ok"]
    pairs = PairSet.from_pairs([c for c in contexts for _ in replies], replies * len(contexts))
    features = row.features(pairs)
    assert features.input_mode == "pair"
    got = row(features, pairs.ctx.reshape(2, 3), pairs.resp.reshape(2, 3))
    want = scorer.score(pairs.context_texts, pairs.response_texts).reshape(2, 3)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert np.ptp(got) > 1e-4


def test_every_row_is_evaluated_on_negatives_mined_by_the_pretrained_encoder(tiny_encoder):
    """The fixed `nearest` negatives are the pretrained encoder's (RESULTS.md: "nearest the context by MiniLM") for
    every row and seed: a fine-tuned pair-mode scorer's own encoder mined its own pool, and `pairs.mined` handed the
    first row's pool to every later row of the process. A frozen row's draw is what it was (mined by the same
    encoder; its line features do not change the context and reply embeddings)."""
    from dataclasses import replace

    import torch

    from pmi_reward.data.negatives import sample_negatives
    from pmi_reward.scoring.encoder import TextEncoder
    from pmi_reward.scoring.head import HeadConfig, PMIHead
    from pmi_reward.training.fit import mine_negatives

    rng = np.random.default_rng(0)
    words = ["cat", "dog", "rain", "sun", "tea", "bus", "song", "book", "game", "city", "sea", "jazz", "tree"]
    texts = [" ".join(rng.choice(words, 5)) for _ in range(120)]
    pairs = PairSet.from_pairs(texts[:60], texts[60:], [f"d{i}" for i in range(60)])
    model = copy.deepcopy(tiny_encoder.model)  # a stand-in for a fine-tuned encoder
    torch.manual_seed(1)
    with torch.no_grad():
        for weight in model.parameters():
            weight.add_(0.2 * torch.randn_like(weight))
    tuned = TextEncoder(tiny_encoder.spec, model=model, tokenizer=tiny_encoder.tokenizer)
    head = PMIHead(HeadConfig(dim=tiny_encoder.dim, line_turns=2))
    frozen, fine_tuned = RUN.Scoring(tiny_encoder, head), RUN.Scoring(tuned, head)

    def own_draw(scoring) -> np.ndarray:  # the draw from the row's own features, as evaluate made it before
        fresh = replace(pairs, mined={})
        mine_negatives(fresh, RUN.EVAL_NEGATIVES, scoring.features(fresh))
        return sample_negatives(fresh, RUN.EVAL_NEGATIVES, np.random.default_rng(RUN.EVAL_SEED))

    want = RUN.eval_negatives(pairs, tiny_encoder)
    np.testing.assert_array_equal(own_draw(frozen), want)
    assert not np.array_equal(own_draw(fine_tuned), want)  # the fine-tuned encoder's pool is another

    class Recording(RUN.Scoring):
        """A row's scoring that keeps the replies of the first call (positives and negatives)."""

        def __init__(self, inner: RUN.Scoring) -> None:
            super().__init__(inner.encoder, inner.head)
            self.inner, self.seen = inner, []

        def __call__(self, features, ctx, resp):
            self.seen.append(np.asarray(resp))
            return self.inner(features, ctx, resp)

    mine_negatives(pairs, RUN.EVAL_NEGATIVES, fine_tuned.features(pairs))  # as training with that encoder leaves it
    left = {kind: tuple(t.copy() for t in table) for kind, table in pairs.mined.items()}
    for scoring in (fine_tuned, frozen, fine_tuned):  # one process, rows and seeds in turn
        row = Recording(scoring)
        out = RUN.evaluate(row, pairs, tiny_encoder, None, n_boot=10)
        np.testing.assert_array_equal(row.seen[0][:, 1:], want)
        np.testing.assert_array_equal(row.seen[0][:, 0], pairs.resp)
        assert 0.0 <= out["auc_nearest"] <= 1.0
    assert all(np.array_equal(a, b) for k in left for a, b in zip(left[k], pairs.mined[k], strict=True))


def test_a_saved_scorer_of_another_context_cut_is_not_reused(tiny_encoder, topic_dialogues, tmp_path, monkeypatch):
    """The cut leaves the pair count as it is, so a run with --context_turns 30 loaded the scorer saved by a
    3-turn run of the same name (and reported it as a whole-context one); it trains its own now."""
    from pmi_reward.data.negatives import NegativeSpec
    from pmi_reward.scoring.head import HeadConfig

    trained: list[int] = []
    real = RUN.fit_scorer
    monkeypatch.setattr(RUN, "fit_scorer", lambda *a, **k: (trained.append(1), real(*a, **k))[1])
    config, head, negatives = TrainConfig(epochs=1, patience=1), HeadConfig(line_turns=0), NegativeSpec(2, 0, 0)
    for turns, expected in ((3, 1), (30, 2), (3, 2)):  # the third: the 3-turn scorer, kept in its own folder
        args = RUN.parse_args((RUN.ScorerRecipeArguments,), ["--name", "x", "--scorer_dir", str(tmp_path)])[0]
        args.context_turns = turns
        train, val = (PairSet.from_dialogues(topic_dialogues[a:b], turns) for a, b in ((0, 20), (60, 70)))
        scorer, _ = RUN.train_or_reuse(args, train, val, tiny_encoder, config, head, negatives)
        assert len(trained) == expected and scorer.context_turns == turns

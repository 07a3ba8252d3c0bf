from pathlib import Path

import numpy as np
import pytest
from conftest import load_recipe

from pmi_reward.data.negatives import NegativeSpec, sample_negatives
from pmi_reward.data.pairs import PairSet
from pmi_reward.evaluation.metrics import roc_auc
from pmi_reward.evaluation.study import (
    EvalSet,
    FeatureBank,
    MethodScores,
    StudyArguments,
    average_rounds,
    load_scores,
    merge_scores,
    run_round,
    save_scores,
    score_texts,
)
from pmi_reward.evaluation.study.report import cell
from pmi_reward.scoring.templates import TEMPLATES
from pmi_reward.training.loop import TrainConfig


@pytest.fixture(scope="module")
def sets(topic_dialogues):
    train, val, test = (PairSet.from_dialogues(topic_dialogues[a:b]) for a, b in ((0, 40), (40, 60), (60, 80)))
    rng = np.random.default_rng(0)
    spec = NegativeSpec(2, 1, 0)
    return (
        EvalSet("train", train, sample_negatives(train, spec, rng)),
        EvalSet("val", val, sample_negatives(val, spec, rng)),
        EvalSet("test", test, sample_negatives(test, NegativeSpec(3, 0, 0), rng)),
    )


def test_round_scores_every_method_on_the_shared_negatives(sets, tiny_encoder):
    train, val, test = sets
    bank = FeatureBank(tiny_encoder, TEMPLATES["en"], progress=False)
    config = TrainConfig(batch_size=32, epochs=2, patience=5, lr=3e-3, seed=1)
    runs = run_round(["nwj", "kde"], ["pair"], 0, train, val, [test], bank, config, progress=False)
    assert [(r.method, r.input_mode) for r in runs] == [("nwj", "pair"), ("kde", "pair")]
    for run in runs:
        assert run.pos["test"].shape == (len(test.pairs),) and run.neg["test"].shape == (len(test.pairs), 3)
        assert np.isfinite(run.pos["test"]).all() and np.isfinite(run.neg["test"]).all()
        assert 0.0 <= run.info["best_val_auc"] <= 1.0
    # the bank embeds each split once for all methods
    assert bank(train, "pair") is bank(train, "pair")
    with pytest.raises(ValueError, match="unknown method"):
        run_round(["nope"], ["pair"], 0, train, val, [test], bank, config)


def test_text_methods_score_a_subset_and_averages_and_storage(sets, tmp_path):
    _, _, test = sets
    seen = []

    def fake(contexts, responses):
        seen.append(len(contexts))
        return np.array([len(r) for r in responses], dtype=np.float32)

    run = score_texts("lm", "meep", fake, [test], limit={"test": 5})
    assert seen == [5 * 4]  # 5 positives and their 3 negatives each
    assert np.isfinite(run.pos["test"][:5]).all() and np.isnan(run.pos["test"][5:]).all()
    assert run.neg["test"][4, 2] == len(test.pairs.responses[test.negatives[4, 2]])
    skipped = score_texts("lm", "meep", fake, [test], limit={"test": 0})  # a limit of 0 calls the method not at all
    assert seen == [5 * 4] and np.isnan(skipped.pos["test"]).all() and np.isnan(skipped.neg["test"]).all()
    a = MethodScores("enc", "nwj", "pair", 0, {"test": np.array([1.0, 2.0])}, {"test": np.zeros((2, 1))})
    b = MethodScores("enc", "nwj", "pair", 1, {"test": np.array([3.0, 4.0])}, {"test": np.ones((2, 1))})
    (avg,) = average_rounds([a, b])
    assert avg.round == -1 and avg.pos["test"].tolist() == [2.0, 3.0] and avg.neg["test"].tolist() == [[0.5], [0.5]]
    save_scores(tmp_path / "s.npz", [a, run])
    loaded = load_scores(tmp_path / "s.npz")
    assert loaded[0].pos["test"].tolist() == [1.0, 2.0] and loaded[1].method == "meep"
    np.testing.assert_array_equal(loaded[1].neg["test"], run.neg["test"])
    # the labels live in the scores file itself: a stale .json beside it (a run killed between two writes) and a
    # name without ".npz" change nothing
    (tmp_path / "s.json").write_text('[{"encoder": "x", "method": "kde", "input_mode": "pair", "round": 5}]')
    assert [r.method for r in load_scores(tmp_path / "s.npz")] == ["nwj", "meep"]
    save_scores(tmp_path / "plain", [a])
    assert load_scores(tmp_path / "plain")[0].pos["test"].tolist() == [1.0, 2.0]


def test_the_feature_bank_keys_by_pair_set_not_by_name(sets, tiny_encoder):
    """Two evaluation sets of one name (a user's "val" beside the study's own) hold other texts: other features."""
    train, val, _ = sets
    bank = FeatureBank(tiny_encoder, TEMPLATES["en"], progress=False)
    assert bank(EvalSet("val", train.pairs), "pair") is not bank(val, "pair")
    assert bank(EvalSet("val", train.pairs), "pair") is bank(EvalSet("train", train.pairs), "pair")


def test_report_cell_bootstraps_the_mean_over_rounds():
    rng = np.random.default_rng(0)
    pos = [rng.normal(1.0, 1.0, 300) for _ in range(3)]
    neg = [rng.normal(0.0, 1.0, (300, 2)) for _ in range(3)]
    c = cell(roc_auc, list(zip(pos, neg, strict=True)), n_boot=200)
    assert len(c["rounds"]) == 3 and c["rows"] == 300
    assert c["ci95"][0] < np.mean(c["rounds"]) < c["ci95"][1]
    pos[0][:10] = np.nan  # rows a method did not score are left out
    assert cell(roc_auc, list(zip(pos, neg, strict=True)), n_boot=50)["rows"] == 290


def _rounds(encoder: str, method: str, rounds: int, rows: dict[str, int], seed: int = 0) -> list[MethodScores]:
    """``rounds`` rounds of a method's scores on evaluation sets of ``rows[set]`` rows (6 negatives each: 5 random
    and 1 in-dialogue), with their round average."""
    rng = np.random.default_rng(seed)
    runs = [
        MethodScores(
            encoder,
            method,
            "pair",
            r,
            {name: rng.normal(1.0, 1.0, n) for name, n in rows.items()},
            {name: rng.normal(0.0, 1.0, (n, 6)) for name, n in rows.items()},
        )
        for r in range(rounds)
    ]
    return runs + average_rounds(runs)


def test_merged_folders_may_not_hold_one_encoders_method_twice(tmp_path):
    """Two folders' rounds of one (encoder, method, mode) would pool into one row (rounds 0, 0, 1, 1, ... and two
    round averages as a mean ± std of 2): merging them is refused, naming both folders and the model; folders of
    other encoders merge."""
    for folder, encoder in (("a", "minilm"), ("b", "minilm"), ("c", "mpnet")):
        (tmp_path / folder).mkdir()
        save_scores(tmp_path / folder / "scores.npz", _rounds(encoder, "nwj", 3, {"test": 20}))
    merged = merge_scores([tmp_path / "a", tmp_path / "c"])
    assert sorted({(r.encoder, r.round) for r in merged}) == [(e, r) for e in ("minilm", "mpnet") for r in range(-1, 3)]
    with pytest.raises(ValueError, match=r"/a and .*/b both hold runs of encoder 'minilm', method nwj \(pair"):
        merge_scores([tmp_path / "a", tmp_path / "c", tmp_path / "b"])
    with pytest.raises(ValueError, match="/c and .*/c both hold runs of encoder 'mpnet'"):  # one folder named twice
        merge_scores([tmp_path / "c", tmp_path / "a", tmp_path / "c"])


def test_the_empirical_and_synthetic_reports_refuse_to_merge_one_model_twice(tmp_path):
    """``--merge`` of a folder that holds the same encoder's runs of a method as the output folder stops with both
    folders named (the report pooled their rounds into one row)."""
    data = tmp_path / "data"
    human = data / "datasets" / "empirical" / "en" / "human.csv"
    human.parent.mkdir(parents=True)
    human.write_text(
        "context,response,dialog_key,annot_relevant_mean,annot_engaging_mean\n"
        + "".join(f"context {i},reply {i},k{i},{i % 5},{i % 3}\n" for i in range(12))
    )
    for folder, seed in (("out", 0), ("other", 1)):
        (tmp_path / folder).mkdir()
        save_scores(tmp_path / folder / "scores.npz", _rounds("minilm", "nwj", 3, {"test": 20, "human": 12}, seed))
    empirical = load_recipe("recipes/empirical/run.py")
    argv = ["--data_dir", str(data), "--test_k_random", "5", "--test_k_in_dialogue", "1", "--report_only", "true"]
    argv += ["--output_dir", str(tmp_path / "out"), "--merge", str(tmp_path / "other"), "--n_boot", "20"]
    with pytest.raises(ValueError, match="/out and .*/other both hold runs of encoder 'minilm'"):
        empirical.main(argv)
    _synthetic_block(data)
    for folder, seed in (("synth", 0), ("synth-other", 1)):
        (tmp_path / folder / "block").mkdir(parents=True)
        save_scores(tmp_path / folder / "block" / "scores.npz", _rounds("minilm", "nwj", 3, {"test": 20}, seed))
    synthetic = load_recipe("recipes/synthetic/run.py")
    argv = ["--data_dir", str(data), "--test_k_random", "5", "--datasets", "block", "--report_only", "true"]
    argv += ["--output_dir", str(tmp_path / "synth"), "--merge", str(tmp_path / "synth-other"), "--n_boot", "20"]
    with pytest.raises(ValueError, match="synth/block and .*/synth-other/block both hold runs of encoder 'minilm'"):
        synthetic.main(argv)


@pytest.mark.parametrize("ratings", ["annot_relevant_mean,annot_engaging_mean", "annot_overall_mean"])
def test_the_empirical_report_leaves_out_blank_ratings_and_plots_any_rating_column(tmp_path, ratings):
    """A blank human rating is a row left out of that column's correlations (not a crash), and a human file whose
    only rating is one the paper has no column for (``annot_overall_mean``) still gets its report and plots."""
    data = tmp_path / "data"
    human = data / "datasets" / "empirical" / "en" / "human.csv"
    human.parent.mkdir(parents=True)
    width = len(ratings.split(","))
    rating = ["" if i == 3 else str(i % 5) for i in range(12)]  # row 4's rating blank
    rows = [",".join([f"context {i}", f"reply {i}", f"k{i}"] + [rating[i]] * width) for i in range(12)]
    human.write_text(f"context,response,dialog_key,{ratings}\n" + "\n".join(rows) + "\n")
    (tmp_path / "out").mkdir()
    save_scores(tmp_path / "out" / "scores.npz", _rounds("minilm", "nwj", 3, {"test": 20, "human": 12}))
    empirical = load_recipe("recipes/empirical/run.py")
    argv = ["--data_dir", str(data), "--test_k_random", "5", "--test_k_in_dialogue", "1", "--report_only", "true"]
    assert empirical.main([*argv, "--output_dir", str(tmp_path / "out"), "--n_boot", "20"]) in (0, None)
    table = (tmp_path / "out" / "results.md").read_text()
    assert "nan" not in table.lower()
    first = ratings.split(",")[0].removeprefix("annot_").removesuffix("_mean")
    assert (tmp_path / "out" / f"spearman_{first}.png").exists()


def test_the_study_s_kde_bandwidth_defaults_to_the_recipes_10():
    """sklearn's scott rule assumes unit-variance components, which the unwhitened PCA is not (en validation AUC 0.58
    against 0.90 for 10): a study run without --kde_bandwidth got the weak KDE. Every recorded study sets 10."""
    assert StudyArguments().kde_config().bandwidth == 10.0
    assert StudyArguments(kde_bandwidth="scott").kde_config().bandwidth == "scott"
    assert StudyArguments(kde_whiten=True).kde_config().bandwidth == "scott"  # the rule for unit-variance components
    assert StudyArguments(kde_whiten=True, kde_bandwidth="2").kde_config().bandwidth == 2.0


def test_the_synthetic_report_does_not_call_kde_defined_up_to_a_constant(tmp_path):
    """KDE's score is log p+ - log p- of two normalised densities: no free constant (MINE's and InfoNCE's have one),
    so its MSE against the analytic PMI means something; the legend said otherwise."""
    data = tmp_path / "data"
    _synthetic_block(data)
    (tmp_path / "out" / "block").mkdir(parents=True)
    save_scores(tmp_path / "out" / "block" / "scores.npz", _rounds("minilm", "kde", 3, {"test": 20}))
    synthetic = load_recipe("recipes/synthetic/run.py")
    argv = ["--data_dir", str(data), "--test_k_random", "5", "--datasets", "block", "--report_only", "true"]
    assert synthetic.main([*argv, "--output_dir", str(tmp_path / "out"), "--n_boot", "20"]) in (0, None)
    legend = next(p for p in (tmp_path / "out" / "results.md").read_text().split("\n\n") if "MSE is only" in p)
    assert "KDE are defined up to a constant" not in legend
    assert "MINE and InfoNCE are defined up to a constant" in legend
    assert "hellinger) and KDE" in legend


def _synthetic_block(data: Path) -> None:
    """A 20-row synthetic Block set (test and val) under ``data``, as the shared folder lays it out."""
    block = data / "datasets" / "synthetic" / "block"
    block.mkdir(parents=True)
    for split in ("test", "val"):
        (block / f"{split}.csv").write_text(
            "context_paraphrased,response_paraphrased,p_xy,p_x,p_y\n"
            + "".join(f"context {i},reply {i},0.0{i + 1},0.1,0.1\n" for i in range(20))
        )

import csv

import numpy as np
import pytest

from pmi_reward.data.pairs import load_pairs
from pmi_reward.data.synthetic import (
    KINDS,
    PROTOTYPES,
    light_paraphrase,
    make_joint,
    make_records,
    sample_pairs,
    true_pmi,
    write_splits,
)


@pytest.mark.parametrize("kind", KINDS)
def test_joint_is_a_distribution_with_consistent_marginals(kind):
    joint = make_joint(kind, seed=1)
    assert joint.p_xy.shape == (20, 20) and np.all(joint.p_xy >= 0)
    assert joint.p_xy.sum() == pytest.approx(1.0)
    np.testing.assert_allclose(joint.p_x, joint.p_xy.sum(1))
    np.testing.assert_allclose(joint.p_y, joint.p_xy.sum(0))
    # PMI is log p(x, y) - log p(x) - log p(y), entry by entry
    i, j = 3, 7
    assert joint.pmi[i, j] == pytest.approx(np.log(joint.p_xy[i, j] / (joint.p_x[i] * joint.p_y[j])))
    # and its expectation under p is the mutual information, which is non-negative
    assert np.sum(joint.p_xy * joint.pmi) >= -1e-12


def test_exact_independent_has_zero_pmi_everywhere():
    joint = make_joint("independent", exact=True, seed=5)
    np.testing.assert_allclose(joint.pmi, 0.0, atol=1e-12)
    # the paper's independent structure (random weights) is only approximately independent
    assert np.abs(make_joint("independent", seed=5).pmi).max() > 0.1


def test_structures_put_mass_where_they_should():
    diag = make_joint("diagonal", exact=True, seed=0)
    assert np.count_nonzero(diag.p_xy) == 20 and np.all(np.diag(diag.pmi) > 0)
    block = make_joint("block", exact=True, seed=0)
    assert block.p_xy[0, 4] > 0 and block.p_xy[0, 5] == 0  # same topic / other topic
    noisy = make_joint("diagonal", seed=0)
    assert np.diag(noisy.pmi).mean() > np.log(5) > noisy.pmi[~np.eye(20, dtype=bool)].mean()


def test_sampling_follows_the_joint():
    joint = make_joint("block", seed=2)
    x, y = sample_pairs(joint, 40000, seed=3)
    empirical = np.bincount(x * 20 + y, minlength=400).reshape(20, 20) / len(x)
    assert np.abs(empirical - joint.p_xy).max() < 0.01
    assert np.all(joint.p_xy[x, y] > 0)


def test_records_carry_analytic_pmi_and_texts(tmp_path):
    joint = make_joint("diagonal", seed=0)
    rows = make_records(joint, 50, seed=1, paraphrase=light_paraphrase)
    for r in rows[:10]:
        assert r["context"] == PROTOTYPES["diagonal"][0][r["x_id"]]
        assert r["response"] == PROTOTYPES["diagonal"][1][r["y_id"]]
        assert true_pmi(r["p_xy"], r["p_x"], r["p_y"]) == pytest.approx(joint.pmi[r["x_id"], r["y_id"]])
    assert any(r["context_paraphrased"] != r["context"] for r in rows)
    paths = write_splits("block", tmp_path, n=100, seed=4)
    with open(paths["test"], newline="") as f:
        test = list(csv.DictReader(f))
    assert len(test) == 20 and set(test[0]) >= {"x_id", "p_xy", "context_paraphrased", "response_paraphrased"}
    pairs = load_pairs(
        paths["train"], "context_paraphrased", "response_paraphrased", extra_columns=["p_xy", "p_x", "p_y"]
    )
    assert len(pairs) == 60 and isinstance(pairs.extras["p_xy"][0], float)


def test_generation_is_seeded():
    a = make_records(make_joint("independent", seed=9), 30, seed=2, paraphrase=light_paraphrase)
    b = make_records(make_joint("independent", seed=9), 30, seed=2, paraphrase=light_paraphrase)
    assert a == b


def test_block_texts_are_refused_for_a_joint_that_does_not_match_their_topics():
    """Block texts come in 4 topics of 5: at size 8 a trip to Rome paired with a sightseeing reply had PMI -inf."""
    with pytest.raises(ValueError, match="4 topics of 5"):
        make_records(make_joint("block", size=8), 10)
    assert len(make_records(make_joint("diagonal", size=8), 10)) == 10  # one reply per context at any size


def test_the_recipe_refuses_a_text_column_set_it_does_not_know(tmp_path):
    """``--text paraphrase`` (a typo) read the prototype columns, whose repeated replies bias the NWJ optimum away
    from the analytic PMI; only paraphrased and prototype are read."""
    from conftest import load_recipe

    run = load_recipe("recipes/synthetic/run.py")
    with pytest.raises(SystemExit, match="--text must be paraphrased or prototype, got 'paraphrase'"):
        run._load(tmp_path / "test.csv", "paraphrase")

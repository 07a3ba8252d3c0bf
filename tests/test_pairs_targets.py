"""What ``load_pairs`` keeps of a pair file's extra columns and keys, as ``pmi-reward evaluate`` reads them."""

import json

import pytest

from pmi_reward.data.dialogues import Dialogue
from pmi_reward.data.negatives import NegativeSpec
from pmi_reward.data.pairs import PairSet, load_pairs
from pmi_reward.data.records import DataError
from pmi_reward.evaluation.scorer_report import EvaluateArguments, evaluation_columns


def test_json_true_and_false_in_a_targets_column_are_an_error_naming_the_row(tmp_path):
    """float() read JSON's true/false as 1.0 and 0.0, so a --targets column of booleans was correlated as ratings
    nobody wrote; they stay booleans, and the numeric check names the row."""
    path = tmp_path / "rated.jsonl"
    rows = [{"context": "a", "response": "b", "good": 3}, {"context": "c", "response": "d", "good": True}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    pairs = load_pairs(path, extra_columns=["good"])
    assert pairs.extras["good"][0] == 3.0 and pairs.extras["good"][1] is True  # not 1.0 (True == 1.0 in Python)
    args = EvaluateArguments(scorer="s", input=str(path), targets=["good"])
    with pytest.raises(DataError, match=r"rated\.jsonl, row 2, field 'good': True is not a number"):
        evaluation_columns(pairs, NegativeSpec(0, 0, 0), args)


def test_pairs_know_whether_they_were_given_keys(tmp_path):
    """``pmi-reward evaluate`` resamples a keyless file's rows by context text (several rated replies to one context
    are not independent draws), a keyed file's by (dialogue, context): the pairs say which they are."""
    path = tmp_path / "pairs.csv"
    path.write_text("context,response,dialog_key\nHi,Yo,d1\nHi,Hey,d2\n")
    keyed, keyless = load_pairs(path), load_pairs(path, key_column=None)
    assert keyed.keyed and not keyless.keyed
    assert keyless.group.tolist() == keyed.group.tolist() == [0, 1]  # each row its own dialogue either way
    assert PairSet.concat([keyed, keyed]).keyed and not PairSet.concat([keyed, keyless]).keyed
    assert PairSet.from_dialogues([Dialogue("a", ("hi", "yo", "bye"))]).keyed

"""Two evaluations' samples merged into one side-by-side file: only when they compare like for like."""

import json

import pytest

from pmi_reward.policy.samples import HUMAN, merge_records, samples_markdown


def _reply(text: str, **pmi: float) -> dict:
    return {"reply": text, "pmi": pmi, "tokens": len(text.split()), "cut": False}


def _record(context: str, base: str, **policies: str) -> dict:
    record = {"context": context, "reference": "Yes!", "base": [_reply(base, b=0.1, e=0.2)]}
    record.update({name: [_reply(text, b=1.0, e=2.0)] for name, text in policies.items()})
    record[HUMAN] = [_reply("Yes!", b=0.5, e=0.7)]
    return record


def test_merged_records_hold_both_evaluations_policies_with_the_human_reply_last():
    first = [_record("Hi\nHow are you?", "Fine.", grpo="Great, you?")]
    second = [_record("Hi\nHow are you?", "Fine.", dpo="Good, thanks.")]
    for r in second[0].values():
        if isinstance(r, list):
            r[0]["pmi"]["lm"] = 3.0  # a judge only the second evaluation ran
    merged = merge_records(first, second)
    assert [k for k in merged[0] if k not in ("context", "reference")] == ["base", "grpo", "dpo", HUMAN]
    assert merged[0]["dpo"][0]["pmi"] == {"b": 1.0, "e": 2.0}
    md = samples_markdown(merged, n_contexts=1)
    assert "PMI in nats by judge (b, e)" in md and "| dpo | Good, thanks. | +1.00 / +2.00 |" in md
    assert md.index("| grpo |") < md.index("| dpo |") < md.index(f"| {HUMAN} |")


def test_merging_refuses_evaluations_that_do_not_compare_like_for_like():
    a = [_record("Hi", "Fine.", grpo="Great.")]
    with pytest.raises(ValueError, match="base's replies differ"):
        merge_records(a, [_record("Hi", "Fine!", dpo="Good.")])
    with pytest.raises(ValueError, match="context 1 differs"):
        merge_records(a, [_record("Hello", "Fine.", dpo="Good.")])
    with pytest.raises(ValueError, match=r"policies \['grpo'\]"):
        merge_records(a, [_record("Hi", "Fine.", grpo="Good.")])
    with pytest.raises(ValueError, match="1 contexts against 2"):
        merge_records(a, a + a)


def test_merge_recipe_writes_one_side_by_side_file(tmp_path, capsys):
    from conftest import load_recipe

    recipe = load_recipe("recipes/smollm2-135m/merge_samples.py")
    for name, policy in (("a", {"grpo-s0": "Great."}), ("b", {"dpo-s0": "Good."})):
        (tmp_path / f"{name}.jsonl").write_text(json.dumps(_record("Hi", "Fine.", **policy)) + "\n")
    recipe.main([str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl"), "--output_dir", str(tmp_path / "out")])
    rows = (tmp_path / "out" / "samples.jsonl").read_text().splitlines()
    assert len(rows) == 1 and list(json.loads(rows[0]))[2:] == ["base", "grpo-s0", "dpo-s0", HUMAN]
    assert "| dpo-s0 | Good. |" in (tmp_path / "out" / "samples.md").read_text()
    assert "policies ['base', 'grpo-s0', 'dpo-s0', 'human reference']" in capsys.readouterr().out


def test_merging_refuses_a_judge_of_one_name_that_scores_the_shared_base_replies_otherwise():
    """A judge was kept by its name alone: two evaluations whose judge "b" gave the very same base reply 0.1 and 2.4
    nats (another scorer under that name) were merged into one column. Now that is refused, naming the judge and
    both files; PMI equal up to the 3 decimals written (or both unscored: null) merge."""
    a, b = [_record("Hi", "Fine.", grpo="Great.")], [_record("Hi", "Fine.", dpo="Good.")]
    b[0]["base"][0]["pmi"]["b"] = 2.4
    with pytest.raises(ValueError, match="judge 'b' gives the same base reply"):
        merge_records(a, b)
    with pytest.raises(ValueError, match=r"judge 'b' .* 0\.1 in a/samples\.jsonl but 2\.4 in b/samples\.jsonl"):
        merge_records(a, b, names=("a/samples.jsonl", "b/samples.jsonl"))
    b[0]["base"][0]["pmi"].update(b=0.1004, e=None)
    a[0]["base"][0]["pmi"]["e"] = None
    assert merge_records(a, b)[0]["dpo"][0]["pmi"] == {"b": 1.0, "e": 2.0}
    # one rounding step apart (a judge's score moves slightly with its batch): -2.997 and -2.998 differ by > 1e-3
    a[0]["base"][0]["pmi"]["b"], b[0]["base"][0]["pmi"]["b"] = -2.997, -2.998
    assert merge_records(a, b)[0]["dpo"][0]["pmi"]["b"] == 1.0

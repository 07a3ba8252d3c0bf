"""Policy prompts cut from dialogues: roles, the human reference, ranges, length filter, prompt files."""

import copy
import json

import pytest
from datasets import Dataset

from pmi_reward.data.dialogues import Dialogue
from pmi_reward.data.records import DataError
from pmi_reward.policy.prompts import PromptArguments, build_prompts, dialogue_prompts
from pmi_reward.policy.trainers import ScriptArguments, lora_config

DIALOGUES = [Dialogue(f"d{i}", tuple(f"turn {j} of {i}" for j in range(6))) for i in range(5)]


def test_prompts_end_with_the_user_and_keep_the_next_turn_as_reference():
    rows = dialogue_prompts(DIALOGUES, max_context_turns=3, per_dialogue=2, system_prompt="Be brief.", seed=0)
    assert len(rows) == 10
    for row in rows:
        msgs = row["prompt"]
        assert msgs[0] == {"role": "system", "content": "Be brief."} and msgs[-1]["role"] == "user"
        roles = [m["role"] for m in msgs[1:]]
        assert all(a != b for a, b in zip(roles, roles[1:], strict=False)) and 1 <= len(roles) <= 3
        i, j = map(int, msgs[-1]["content"].replace("turn ", "").split(" of ")[::-1])
        assert row["reference"] == f"turn {j + 1} of {i}" and row["dialogue_id"] == f"d{i}"
    assert rows == dialogue_prompts(DIALOGUES, max_context_turns=3, per_dialogue=2, system_prompt="Be brief.", seed=0)
    short = dialogue_prompts(DIALOGUES, max_context_turns=3, max_context_chars=12, system_prompt=None)
    assert all(len(r["prompt"]) == 1 for r in short)  # only one-turn contexts fit in 12 characters


def test_build_prompts_from_ranges_and_files(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(json.dumps({"id": d.id, "turns": list(d.turns)}) for d in DIALOGUES))
    data = build_prompts(PromptArguments(dialogues=str(path), first_dialogue=1, max_dialogues=2))
    assert sorted(set(data["dialogue_id"])) == ["d1", "d2"]
    with pytest.raises(DataError, match="no dialogues from index 9"):
        build_prompts(PromptArguments(dialogues=str(path), first_dialogue=9))
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "hi"}) + "\n" + json.dumps({"prompt": 3}))
    with pytest.raises(DataError, match="row 2, field 'prompt'"):
        build_prompts(PromptArguments(prompt_file=str(prompts)))
    prompts.write_text(json.dumps({"prompt": [{"role": "user", "content": "hi"}]}))
    assert build_prompts(PromptArguments(prompt_file=str(prompts)))["prompt"] == [[{"role": "user", "content": "hi"}]]


def test_lora_on_the_top_layers_only(tiny_policy):
    from trl import ModelConfig

    model = tiny_policy()
    assert lora_config(ModelConfig(), model, 1) is None
    config = lora_config(
        ModelConfig(use_peft=True, lora_target_modules=["q_proj"]),
        model,
        ScriptArguments(lora_top_layers=1).lora_top_layers,
    )
    assert config.layers_to_transform == [1]


@pytest.mark.parametrize(
    ("prompt", "message"),
    [
        ([], "no conversation to reply to"),
        ("  \n ", "no conversation to reply to"),
        ([{"role": "system", "content": "Be brief."}], "no conversation to reply to"),
        ([1, 2], r"expected chat messages \({role, content} objects\)"),
        ([{"role": "user"}], r"expected chat messages \({role, content} objects\)"),
    ],
)
def test_a_prompt_file_row_without_a_conversation_names_its_row(tmp_path, prompt, message):
    """A prompt with nothing to reply to (no messages, blank text, a system message only) or a list that is not
    chat messages is refused with its row, not sampled from as an empty conversation."""
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "hi"}) + "\n" + json.dumps({"prompt": prompt}) + "\n")
    with pytest.raises(DataError, match=rf"p.jsonl, row 2, field 'prompt': {message}"):
        build_prompts(PromptArguments(prompt_file=str(prompts)))


def test_a_prompt_file_mixing_strings_and_messages_names_the_first_odd_row(tmp_path):
    prompts = tmp_path / "p.jsonl"
    rows = [{"prompt": [{"role": "user", "content": "hi"}]}, {"prompt": "I love jazz."}]
    prompts.write_text("\n".join(map(json.dumps, rows)))
    with pytest.raises(DataError, match="row 2, field 'prompt': a string where row 1 has chat messages"):
        build_prompts(PromptArguments(prompt_file=str(prompts)))


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("first_dialogue", -5),
        ("max_dialogues", -1),
        ("max_prompts", -1),
        ("prompts_per_dialogue", 0),
        ("prompts_per_dialogue", -1),
        ("prompt_turns", 0),
    ],
)
def test_prompt_counts_that_would_cut_silently_are_refused(option, value):
    """A negative index would count from the end of the corpus or the prompt list, and no context turns would
    leave a prompt with nothing to reply to: refused when the options are read, before any model loads."""
    with pytest.raises(ValueError, match=rf"{option} must be >= [01], got {value}"):
        PromptArguments(**{option: value})
    with pytest.raises(ValueError, match=option):
        ScriptArguments(**{option: value})


# Gemma 2's chat template (google/gemma-2-2b-it): no system role, and turns must alternate from a user turn
GEMMA = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
    "{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}"
    "{% endif %}{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + '<end_of_turn>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{'<start_of_turn>model\\n'}}{% endif %}"
)


def test_prompts_fit_a_template_that_requires_alternation_from_a_user_turn(smol_tokenizer, caplog):
    from pmi_reward.policy.prompts import fit_prompt_column, fit_prompts
    from pmi_reward.policy.sampling import prompt_texts

    dialogue = Dialogue("d", ("a", "b", "c", "d", "e"))
    rows = dialogue_prompts([dialogue], 3, per_dialogue=4, system_prompt=None)  # every position: 1, 2, 3, 3 turns
    prompts = [r["prompt"] for r in rows]
    assert any(p[0]["role"] == "assistant" for p in prompts)  # two-turn contexts open with an assistant turn
    assert fit_prompts(prompts, smol_tokenizer) == prompts  # ChatML takes them as they are
    smol_tokenizer = copy.deepcopy(smol_tokenizer)  # the fixture's tokenizer is shared (load_tokenizer's cache)
    smol_tokenizer.chat_template = GEMMA
    with pytest.raises(Exception, match="alternate"):
        prompt_texts(smol_tokenizer, prompts)
    fitted = fit_prompts(prompts, smol_tokenizer)
    assert len(prompt_texts(smol_tokenizer, fitted)) == len(prompts)
    for before, after in zip(prompts, fitted, strict=True):
        assert after == (before[1:] if before[0]["role"] == "assistant" else before)
        assert after[0]["role"] == "user" and after[-1] == before[-1]
    assert "opened with an assistant turn" in caplog.text
    dataset = fit_prompt_column(Dataset.from_list(rows), smol_tokenizer)
    assert list(dataset["prompt"]) == fitted and list(dataset["reference"]) == [r["reference"] for r in rows]


def test_a_prompt_the_template_refuses_otherwise_names_it(smol_tokenizer):
    from pmi_reward.policy.prompts import fit_prompts

    smol_tokenizer = copy.deepcopy(smol_tokenizer)  # the fixture's tokenizer is shared (load_tokenizer's cache)
    smol_tokenizer.chat_template = GEMMA
    prompts = [
        [{"role": "user", "content": "hi"}],
        [{"role": "system", "content": "Be kind."}, {"role": "user", "content": "hi"}],
    ]
    with pytest.raises(DataError, match=r"prompt 2: .*System role not supported.*--system_prompt ''"):
        fit_prompts(prompts, smol_tokenizer)

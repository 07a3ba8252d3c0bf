"""How ``load_dialogues`` reads chat files for training, and that it reads them as the reward reads a prompt."""

import json

import pytest

from pmi_reward.data.conversation import prompt_to_context
from pmi_reward.data.dialogues import load_dialogues
from pmi_reward.data.pairs import join_turns
from pmi_reward.data.records import DataError


def _jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def test_a_message_without_a_role_is_an_error_naming_its_row(tmp_path):
    """A message with no "role" was read as the user's: a chat of role-less messages was one user turn, a dialogue
    of under two turns, dropped without a word (only the other row's dialogue came back)."""
    path = _jsonl(
        tmp_path / "chats.jsonl",
        [
            {"id": "b", "turns": ["x", "y"]},
            {"id": "a", "messages": [{"content": "hi"}, {"content": "hello"}, {"content": "how are you"}]},
        ],
    )
    with pytest.raises(DataError, match=r"chats\.jsonl, row 2, field 'messages': message 1 has no 'role'"):
        load_dialogues(path)
    _jsonl(path, [{"id": "a", "messages": [{"role": "user", "content": "hi"}, {"content": "hello"}]}])
    with pytest.raises(DataError, match="row 1, field 'messages': message 2 has no 'role'"):
        load_dialogues(path)
    assert prompt_to_context([{"content": "hi"}, {"content": "hello"}]) == "hi hello"  # the reward stays lenient


def test_openai_content_parts_read_as_the_reward_reads_them(tmp_path):
    """A message whose content is OpenAI's list of parts was refused for training while the reward reads its text
    parts (``conversation.message_text``): training reads them alike now."""
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {}}]},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": [{"type": "text", "text": "how"}, {"type": "text", "text": "are you?"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "fine"}]},
    ]
    path = _jsonl(tmp_path / "chat.jsonl", [{"id": "a", "messages": messages}])
    (dialogue,) = load_dialogues(path)
    assert dialogue.turns == ("hi", "hello", "how are you?", "fine")
    assert join_turns(dialogue.turns[:-1]) == prompt_to_context(messages[:-1])
    _jsonl(path, [{"id": "a", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}])
    with pytest.raises(DataError, match="row 1, field 'messages': expected"):  # no text part: no text to read
        load_dialogues(path)


def test_a_developer_message_is_a_system_prompt_for_training_and_the_reward(tmp_path):
    """A "developer" message (OpenAI's successor of "system") was an unknown role for training while the reward
    skipped it: both skip it now, as a system message, and the reward reads it as one with include_system."""
    messages = [
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
    ]
    system = [{**messages[0], "role": "system"}, *messages[1:]]
    path = _jsonl(tmp_path / "chat.jsonl", [{"id": "a", "messages": messages}, {"id": "b", "messages": system}])
    assert [d.turns for d in load_dialogues(path)] == [("hi", "hello")] * 2
    assert prompt_to_context(messages[:-1]) == prompt_to_context(system[:-1]) == "hi"
    assert prompt_to_context(messages[:-1], include_system=True) == "Be brief.\nhi"
    assert prompt_to_context(system[:-1], include_system=True) == "Be brief.\nhi"


def test_a_turn_per_row_dialog_id_is_text_or_a_whole_number(tmp_path):
    """dialog_id 1 and 1.0 were two dialogues, "1" and "1.0": the 1.0 row a dialogue of one turn, dropped without a
    word. A dialog_id is text or a whole number (JSON's ids; 1.0 as pandas writes an int column with gaps is 1),
    else a DataError naming the row."""
    path = tmp_path / "turns.jsonl"
    rows = [{"dialog_id": 1, "text": "a"}, {"dialog_id": 1.0, "text": "b"}, {"dialog_id": 1, "text": "c"}]
    assert [(d.id, d.turns) for d in load_dialogues(_jsonl(path, rows))] == [("1", ("a", "b", "c"))]
    rows = [{"dialog_id": 1, "text": "a"}, {"dialog_id": 1.5, "text": "b"}, {"dialog_id": 1, "text": "c"}]
    with pytest.raises(DataError, match=r"turns\.jsonl, row 2, field 'dialog_id': expected text or a whole number"):
        load_dialogues(_jsonl(path, rows))
    with pytest.raises(DataError, match="row 1, field 'dialog_id'"):
        load_dialogues(_jsonl(path, [{"dialog_id": True, "text": "a"}, {"dialog_id": True, "text": "b"}]))
    rows = [{"dialog_id": 1, "text": "a"}, {"dialog_id": "x", "text": "b"}, {"dialog_id": 1, "text": "c"}]
    assert [(d.id, d.turns) for d in load_dialogues(_jsonl(path, rows + [{"dialog_id": "x", "text": "d"}]))] == [
        ("1", ("a", "c")),
        ("x", ("b", "d")),
    ]


def test_a_tool_call_message_is_skipped_for_training_as_the_reward_skips_it(tmp_path):
    """An assistant message that only calls a tool (content None, ``tool_calls``; OpenAI's format) was refused for
    training while the reward skips it: training skips it too, with the tool's answer (role "tool"). A message
    with no content and no tool call is still an error naming the row."""
    call = {"role": "assistant", "content": None, "tool_calls": [{"type": "function", "function": {"name": "f"}}]}
    messages = [
        {"role": "user", "content": "weather in Paris?"},
        call,
        {"role": "tool", "content": "sunny"},
        {"role": "assistant", "content": "It is sunny."},
        {"role": "user", "content": "thanks"},
    ]
    path = _jsonl(tmp_path / "chat.jsonl", [{"id": "a", "messages": messages}])
    (dialogue,) = load_dialogues(path)
    assert dialogue.turns == ("weather in Paris?", "It is sunny.", "thanks")
    assert join_turns(dialogue.turns[:-1]) == prompt_to_context(messages[:-1])
    _jsonl(path, [{"id": "a", "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None}]}])
    with pytest.raises(DataError, match="row 1, field 'messages': expected"):
        load_dialogues(path)

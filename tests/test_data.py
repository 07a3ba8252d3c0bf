import json

import numpy as np
import pytest

from pmi_reward.data.dialogues import chitchat_dialogues, load_dialogues, split_dialogues
from pmi_reward.data.pairs import PairSet, load_pairs
from pmi_reward.data.records import DataError


def test_split_is_by_dialogue(topic_dialogues):
    train, val, test = split_dialogues(topic_dialogues, 0.2, 0.2, seed=3)
    ids = [{d.id for d in s} for s in (train, val, test)]
    assert not (ids[0] & ids[1]) and not (ids[0] & ids[2]) and not (ids[1] & ids[2])
    assert sum(map(len, ids)) == len(topic_dialogues)
    sets = [PairSet.from_dialogues(s) for s in (train, val, test)]
    contexts = [set(s.context_texts) for s in sets]
    # a dialogue's pairs all land in its split
    splits = (train, val, test)
    assert all(len(s) == sum(len(d.turns) - 1 for d in split) for s, split in zip(sets, splits, strict=True))
    assert contexts[0] and contexts[1] and contexts[2]


def test_pairs_from_dialogue_use_previous_turns_newest_last(topic_dialogues):
    d = topic_dialogues[0]
    pairs = PairSet.from_dialogues([d], max_context_turns=2)
    assert pairs.response_texts == list(d.turns[1:])
    assert pairs.context_texts[0] == d.turns[0]
    assert pairs.context_texts[2] == d.turns[1] + "\n" + d.turns[2]


def test_a_turn_with_line_breaks_is_one_context_line_as_at_inference():
    """A turn "Here is my list:\n1. eggs" was two context lines in training (two line features, two context-line
    negatives, two turns of max_context_turns) but one line at inference (a chat message's breaks become spaces)."""
    from pmi_reward.data.conversation import prompt_to_context
    from pmi_reward.data.dialogues import Dialogue

    turns = ("Here is my list:\n1. eggs\n2. milk", "Anything else?", "Bread.")
    pairs = PairSet.from_dialogues([Dialogue("d", turns)])
    messages = [{"role": r, "content": t} for r, t in zip(("user", "assistant"), turns[:2], strict=True)]
    assert pairs.context_texts[1] == prompt_to_context(messages) == "Here is my list: 1. eggs 2. milk\nAnything else?"


def test_chitchat_corpus_loads():
    dialogues = chitchat_dialogues()
    assert len(dialogues) > 7000
    assert all(isinstance(t, str) and t for d in dialogues[:50] for t in d.turns)


def test_load_dialogue_formats(tmp_path):
    jl = tmp_path / "d.jsonl"
    jl.write_text(
        json.dumps({"id": "a", "turns": ["hi", "hello"]})
        + "\n"
        + json.dumps(
            {
                "id": "b",
                "messages": [
                    {"role": "system", "content": "be nice"},
                    {"role": "user", "content": "yo"},
                    {"role": "assistant", "content": "hey"},
                ],
            }
        )
        + "\n"
    )
    ds = load_dialogues(jl)
    assert [d.turns for d in ds] == [("hi", "hello"), ("yo", "hey")]
    csv_path = tmp_path / "d.csv"
    csv_path.write_text("dialog_id,text\n1,hi\n1,there\n2,one\n2,two\n2,three\n")
    assert [len(d.turns) for d in load_dialogues(csv_path)] == [2, 3]


def test_other_names_of_the_speakers_are_read_and_unknown_roles_refused(tmp_path):
    """A role outside user/assistant was dropped without a word: Gemini's "model" turns vanished and the pairs became
    "user replies to user". Common aliases are speakers; an unknown role is an error naming the row."""
    from pmi_reward.data.records import DataError

    def dialogue(*roles: str) -> dict:
        return {"id": "a", "messages": [{"role": r, "content": f"turn {i}"} for i, r in enumerate(roles)]}

    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps(dialogue("User", "model", "tool", "human", "Assistant")) + "\n")
    assert load_dialogues(path)[0].turns == ("turn 0", "turn 1", "turn 3", "turn 4")
    path.write_text(json.dumps(dialogue("user", "narrator")) + "\n")
    with pytest.raises(DataError, match="row 1, field 'messages': unknown role 'narrator'"):
        load_dialogues(path)


def test_pair_file_builds_in_dialogue_pool_from_context_lines(tmp_path):
    f = tmp_path / "p.csv"
    f.write_text('dialog_key,context,response\nk1,"a\nb",c\nk1,"b\nc",d\nk2,x,y\n')
    pairs = load_pairs(f)
    g = pairs.group[0]
    pool = {pairs.responses[i] for i in pairs.pool[pairs.pool_ptr[g] : pairs.pool_ptr[g + 1]]}
    assert pool == {"a", "b", "c", "d"}
    assert len(set(pairs.group.tolist())) == 2


@pytest.mark.parametrize(
    "content,suffix,message",
    [
        (b"context,other\nhi,there\n", ".csv", "missing column 'response'"),
        (b"", ".csv", "empty"),
        (b"context,response\nhi,\xff\xfe\n", ".csv", "not UTF-8"),
        (b"context,response\nhi,\n", ".csv", "row 1, field 'response': empty"),
        (b'{"context": "hi", "response": 3}\n', ".jsonl", "row 1, field 'response': expected text"),
        (b'{"context": "hi", "response": "x"}\nnot json\n', ".jsonl", "row 2: invalid JSON"),
        (b"context,response\nhi,there\n", ".parquet", "unsupported file type"),
        # an unclosed quote would swallow the rows after it into one field
        (b'context,response\nhi,"there\nyo,you\nhey,ho\n', ".csv", "row 1: malformed CSV"),
        (b'context,response\nhi,there\nyo,"you"!\n', ".csv", "row 2: malformed CSV"),
        (b"context,response,response\nhi,there,yo\n", ".csv", "duplicate column 'response'"),
        (b"context,response\nhi\n", ".csv", "row 1, field 'response'"),
        # a TSV written without quoting: a reply that opens with a quote ran on over the next rows, as one field
        (b'context\tresponse\n"hmm\tok\nhi\tthere\nx\ty"\n', ".tsv", "row 1: fewer values than header columns (a"),
        # rows count records: a blank line is none, and a parse error names its line too
        (b'{"context": "hi", "response": "x"}\n\n{"context": "a", "response": 3}\n', ".jsonl", "row 2, field"),
        (b'{"context": "hi", "response": "x"}\n\nnot json\n', ".jsonl", "row 2 (line 3): invalid JSON"),
        (b"[" * 100_000 + b"]" * 100_000 + b"\n", ".jsonl", "row 1: invalid JSON (nested too deeply)"),
        (b'{"context": "hi", "response": "x", "n": ' + b"9" * 5000 + b"}\n", ".jsonl", "row 1: invalid JSON"),
        (b"[" * 100_000 + b"]" * 100_000, ".json", "invalid JSON (nested too deeply)"),
        (b'{"context": "hi", "response": "a\\ud83d"}\n', ".jsonl", "row 1, field 'response': not valid text"),
        (b'[{"context": "hi", "response": "x"}, {"context": "\\uDC00", "response": "x"}]', ".json", "row 2"),
    ],
)
def test_bad_pair_files_name_file_and_field(tmp_path, content, suffix, message):
    f = tmp_path / f"bad{suffix}"
    f.write_bytes(content)
    with pytest.raises(DataError) as err:
        load_pairs(f)
    assert str(f) in str(err.value) and message in str(err.value)


def test_bad_dialogue_file_names_the_field(tmp_path):
    f = tmp_path / "bad.jsonl"
    f.write_text(json.dumps({"id": "a", "turns": "not a list"}) + "\n")
    with pytest.raises(DataError, match="row 1, field 'turns'"):
        load_dialogues(f)
    g = tmp_path / "bad.csv"
    g.write_text("conv,utterance\n1,hi\n")
    with pytest.raises(DataError, match="missing column 'dialog_id'"):
        load_dialogues(g)
    # a turn without its dialogue's id is an error, not a KeyError nor a turn of a dialogue named "None" or ""
    h = tmp_path / "no_id.jsonl"
    rows = [{"dialog_id": "a", "text": "hi"}, {"dialog_id": "a", "text": "yo"}, {"text": "lost"}, {"text": "too"}]
    h.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    with pytest.raises(DataError, match="row 3, field 'dialog_id': missing value"):
        load_dialogues(h)
    for key in (None, ""):
        h.write_text("\n".join(json.dumps(r) for r in [*rows[:2], {"dialog_id": key, "text": "x"}]) + "\n")
        with pytest.raises(DataError, match="row 3, field 'dialog_id': missing value"):
            load_dialogues(h)
    g.write_text("dialog_id,text\na,hi\na,yo\n,x\n,y\n, \n")
    with pytest.raises(DataError, match="row 3, field 'dialog_id': missing value"):
        load_dialogues(g)
    g.write_text("dialog_id,text\na,hi\na,yo\n,\n")  # a blank row (no turn) needs no id
    assert [d.turns for d in load_dialogues(g)] == [("hi", "yo")]


def test_split_is_seeded(topic_dialogues):
    a = split_dialogues(topic_dialogues, 0.1, 0.1, seed=1)
    b = split_dialogues(topic_dialogues, 0.1, 0.1, seed=1)
    assert [[d.id for d in s] for s in a] == [[d.id for d in s] for s in b]
    assert np.isclose(len(a[1]) / len(topic_dialogues), 0.1)


def test_load_dialogues_from_a_datasets_object_and_folder(tmp_path):
    import datasets

    ds = datasets.Dataset.from_list(
        [{"id": "a", "turns": ["hi", "hello", "how are you?"]}, {"id": "b", "turns": ["one turn only"]}]
    )
    assert [d.turns for d in load_dialogues(ds)] == [("hi", "hello", "how are you?")]
    ds.save_to_disk(str(tmp_path / "ds"))
    assert [d.id for d in load_dialogues(tmp_path / "ds")] == ["a"]


def test_csv_fields_may_hold_unicode_line_separators(tmp_path):
    # str.splitlines() would cut these rows at \x85 / \u2028 and misread the file
    path = tmp_path / "pairs.csv"
    path.write_text(
        'dialog_key,context,response\nk1,"Will\x85Where is he?","Safe\u2028inside."\nk2,Hi,Hello\n', encoding="utf-8"
    )
    pairs = load_pairs(path)
    assert pairs.context_texts == ["Will\x85Where is he?", "Hi"]
    assert pairs.response_texts == ["Safe\u2028inside.", "Hello"]


def test_jsonl_records_may_hold_unicode_line_separators(tmp_path):
    path = tmp_path / "pairs.jsonl"
    rows = [{"context": "a\x85b", "response": "c\u2028d"}, {"context": "e", "response": "f"}]
    path.write_text("\r\n".join(json.dumps(r, ensure_ascii=False) for r in rows) + "\n", encoding="utf-8")
    pairs = load_pairs(path)
    assert pairs.context_texts == ["a\x85b", "e"] and pairs.response_texts == ["c\u2028d", "f"]


def test_pair_file_contexts_keep_their_last_turns_and_every_line_stays_a_candidate(tmp_path):
    path = tmp_path / "pairs.csv"
    path.write_text('context,response,dialog_key\n"a\nb\nc\nd",e,k1\n"x\ny",z,k2\n', encoding="utf-8")
    pairs = load_pairs(path, max_context_turns=2)
    assert pairs.context_texts == ["c\nd", "x\ny"] and pairs.context_turns == 2
    group = pairs.group[0]
    pool = {pairs.responses[r] for r in pairs.pool[pairs.pool_ptr[group] : pairs.pool_ptr[group + 1]]}
    assert {"a", "b", "c", "d", "e"} <= pool


def test_concat_keeps_dialogues_apart_and_pools_whole(topic_dialogues, tmp_path):
    from_dialogues = PairSet.from_dialogues(topic_dialogues[:3], max_context_turns=2)
    path = tmp_path / "pairs.csv"
    path.write_text('context,response,dialog_key\n"hi\nthere",hello,k1\n', encoding="utf-8")
    both = PairSet.concat([from_dialogues, load_pairs(path, max_context_turns=2)])
    assert len(both) == len(from_dialogues) + 1
    assert both.context_texts == from_dialogues.context_texts + ["hi\nthere"]
    assert both.response_texts == from_dialogues.response_texts + ["hello"]
    assert len(set(both.group.tolist())) == len(set(from_dialogues.group.tolist())) + 1

    def pool(p: PairSet, g: int) -> set[str]:
        return {p.responses[r] for r in p.pool[p.pool_ptr[g] : p.pool_ptr[g + 1]]}

    for g in range(len(set(from_dialogues.group.tolist()))):
        assert pool(both, g) == pool(from_dialogues, g)
    assert both.context_turns == 2


def test_train_data_adds_a_pair_file_to_dialogues_without_its_own_validation_file(tmp_path):
    from pmi_reward.training.job import TrainData, build_pairs

    dialogues = tmp_path / "d.jsonl"
    rows = [{"id": f"d{i}", "turns": [f"hello {i}", f"hi {i}", f"how are you {i}", f"fine {i}"]} for i in range(40)]
    dialogues.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    pairs = tmp_path / "p.csv"
    pairs.write_text("context,response\nwhat's up,not much\nany plans,a hike\n")
    train, val, _, source = build_pairs(TrainData(dialogues=str(dialogues), train_file=str(pairs)))
    alone, _, _, _ = build_pairs(TrainData(dialogues=str(dialogues)))
    assert len(train) == len(alone) + 2 and "a hike" in train.response_texts
    assert len(val) > 0 and "a hike" not in val.response_texts and source["val_file"] is None
    with pytest.raises(SystemExit, match="needs --val_file"):
        build_pairs(TrainData(train_file=str(pairs)))


def test_a_pair_file_may_number_its_dialogues(tmp_path):
    """JSON files often write dialogue ids as numbers: a pair file's numeric key was refused as 'expected text'."""
    path = tmp_path / "p.jsonl"
    rows = [{"dialog_key": k, "context": c, "response": r} for k, c, r in ((1, "a", "b"), (1, "b", "c"), (2, "x", "y"))]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    pairs = load_pairs(path)
    assert pairs.group[0] == pairs.group[1] != pairs.group[2]


def test_a_pair_file_whose_first_record_has_no_key_is_named_not_read_as_one_dialogue_per_row(tmp_path):
    """The key was looked for in the first record only: without it there, every row became its own dialogue."""
    path = tmp_path / "p.jsonl"
    rows = [{"context": "a", "response": "b"}, {"dialog_key": "k", "context": "b", "response": "c"}]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    with pytest.raises(DataError, match="row 1, field 'dialog_key': missing value"):
        load_pairs(path)


def test_dialogue_ids_that_repeat_are_named(tmp_path):
    path = tmp_path / "d.jsonl"
    rows = [{"id": "2", "turns": ["a", "b"]}, {"turns": ["c", "d"]}]  # the second takes its row number, 2
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    with pytest.raises(DataError, match="1 repeated, e.g. '2'.*row number"):
        load_dialogues(path)


def test_a_saved_dataset_dict_folder_is_named_with_the_split_to_give(tmp_path):
    import datasets

    split = datasets.Dataset.from_list([{"id": "a", "turns": ["hi", "hello"]}])
    datasets.DatasetDict({"train": split}).save_to_disk(str(tmp_path / "dd"))
    with pytest.raises(DataError, match=r"a DatasetDict folder \(splits \['train'\]\).*dd/train"):
        load_dialogues(tmp_path / "dd")
    datasets.DatasetDict({}).save_to_disk(str(tmp_path / "empty"))
    with pytest.raises(DataError, match="no splits"):
        load_dialogues(tmp_path / "empty")


def test_a_multi_line_reply_is_read_and_one_whose_lines_read_as_whole_rows_is_named(tmp_path, caplog):
    """A quoted reply over lines, with a comma on a later line, is a reply (fewer delimiters than a row holds); one
    whose later lines read as whole rows (a quote that ran on over rows, closing at the end of a later row) is read
    too, since a two-column file's multi-line reply with a comma reads the same way, but named in a warning (rows
    were swallowed silently); in a JSONL file no line is a row."""
    path = tmp_path / "p.csv"
    path.write_text('dialog_key,context,response\nk,hi,"Sure.\nWell, maybe."\n')
    assert load_pairs(path).response_texts == ["Sure. Well, maybe."] and not caplog.records
    path.write_bytes(b'context,response\nHi,"Hmm\nHow are you?,Fine\nBye,Say cheese"\nLast,row\n')
    assert len(load_pairs(path)) == 2
    assert "p.csv, row 1, field 'response' (and 0 more): a reply whose later lines read as whole rows" in caplog.text
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"context": "hi", "response": "Hmm\nHow are you?,Fine"}) + "\n")
    assert load_pairs(path).response_texts == ["Hmm How are you?,Fine"]


def test_consecutive_messages_of_one_speaker_are_one_turn(tmp_path):
    """Each message was a turn: "user, user, assistant" made a pair in which the user replies to the user."""
    roles = ("user", "system", "human", "assistant", "user", "model", "assistant", "bot")
    messages = [{"role": r, "content": " " if i == 6 else f"m{i}"} for i, r in enumerate(roles)]
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"id": "a", "messages": [*messages, "plain", "text"]}) + "\n")
    # system skipped, human = user, model/bot = assistant, an empty message is none; plain strings stay turns
    assert load_dialogues(path)[0].turns == ("m0 m2", "m3", "m4", "m5 m7", "plain", "text")


def test_the_chitchat_corpus_keeps_a_turn_per_message():
    """An empty message is dropped without joining its neighbours (documented; recorded figures rest on it)."""
    turns = next(d for d in chitchat_dialogues() if d.id == "6a4c7f41-c279-4f09-b899-aeb0c544edc9").turns
    assert len(turns) == 6 and turns[-1] == "Kewl" and turns[-2].startswith("Whoa we both have animal names")


def test_an_extra_column_the_first_record_omits_is_kept(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"context": "a", "response": "b"}\n{"context": "c", "response": "d", "rating": 3}\n')
    assert load_pairs(path, extra_columns=["rating"]).extras == {"rating": [None, 3.0]}
    with pytest.raises(DataError, match="missing column 'score'"):
        load_pairs(path, extra_columns=["score"])


def test_load_dialogues_names_sources_that_are_not_records_and_refuses_a_limit_below_one(tmp_path):
    import datasets

    split = datasets.Dataset.from_list([{"id": "a", "turns": ["hi", "hello"]}, {"id": "b", "turns": ["x", "y"]}])
    with pytest.raises(DataError, match=r"DatasetDict: a mapping.*pass one split, e.g. source\['train'\]"):
        load_dialogues(datasets.DatasetDict({"train": split}))
    with pytest.raises(DataError, match="list, row 1: expected a dict record"):
        load_dialogues([["hi there", "hello"], ["how are you", "fine"]])
    assert [d.id for d in load_dialogues(split, limit=1)] == ["a"]
    for limit in (0, -1):  # sliced with: 0 kept every dialogue, -1 dropped the last
        with pytest.raises(ValueError, match="limit must be >= 1"):
            load_dialogues(split, limit=limit)

"""``speaker_turns`` joins a run of one speaker's messages once, in time linear in the run, into the same strings
as the join it replaced (each message added onto the growing turn, which copied the turn again: quadratic)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from pmi_reward.data.conversation import prompt_to_context
from pmi_reward.data.dialogues import speaker_turns


def joined_one_by_one(messages: list[tuple[str | None, str]]) -> list[str]:
    """The former join, kept here as the reference: each message of the last turn's speaker added onto the turn."""
    turns: list[str] = []
    last = None
    for who, text in messages:
        if not text.strip():
            if who is None:
                last = None
            continue
        if who is not None and who == last:
            turns[-1] = f"{turns[-1].strip()} {text.strip()}"
        else:
            turns.append(text)
        last = who
    return turns


TEXTS = st.text(alphabet=st.sampled_from(["a", "b", " ", "\n", "\t", "\u00a0", "\u3000", "é"]), max_size=6)
MESSAGES = st.lists(st.tuples(st.sampled_from([None, "user", "assistant"]), TEXTS), max_size=12)


@settings(max_examples=400, deadline=None, derandomize=True, database=None)
@given(MESSAGES)
def test_turns_are_the_former_join_s(messages):
    """Blank messages, unicode spaces around texts, runs of one speaker, messages of no speaker: the same turns."""
    assert speaker_turns(messages) == joined_one_by_one(messages)


def test_a_small_chat_s_turns():
    messages = [
        ("user", "  hi there "),
        ("user", "\tanyone?\n"),
        ("user", "   "),
        ("user", "hello"),
        ("assistant", " yes "),
        (None, "a note"),
        (None, "another"),
        ("assistant", "ok"),
        ("assistant", " fine "),
    ]
    expected = ["hi there anyone? hello", " yes ", "a note", "another", "ok fine"]
    assert speaker_turns(messages) == joined_one_by_one(messages) == expected


def test_a_run_of_30000_messages_of_one_speaker_is_one_turn():
    """30,000 consecutive user messages of 500 characters (15 MB): joined one by one, each copied the turn so far
    (2.25e11 characters in all, about a minute); joined once, a fraction of a second. The turn holds every message,
    in order, each stripped, one space between two."""
    n, width = 30_000, 500
    texts = [f" {i:05d}" + "x" * (width - 7) + " " for i in range(n)]
    turns = speaker_turns([("user", t) for t in texts] + [("assistant", "bye")])
    assert turns == [" ".join(t.strip() for t in texts), "bye"]
    assert len(turns[0]) == n * (width - 2) + n - 1


def test_a_message_list_context_of_one_long_run():
    """The reward's reading of a chat prompt (``/rerank``'s context as messages): a run of 30,000 user messages is
    one turn, and ``max_turns`` keeps the turns after it."""
    prompt = [{"role": "user", "content": f"m{i}"} for i in range(30_000)]
    prompt += [{"role": "assistant", "content": "sure"}, {"role": "user", "content": "and then?"}]
    whole = prompt_to_context(prompt)
    assert whole == "\n".join([" ".join(f"m{i}" for i in range(30_000)), "sure", "and then?"])
    assert prompt_to_context(prompt, max_turns=2) == "sure\nand then?"

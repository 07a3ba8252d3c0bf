"""One chat read alike wherever it is read: training pairs (load_dialogues -> PairSet) and the reward's context
(prompt_to_context), from message lists, templated text and Dialogue objects built in Python."""

import pytest

from pmi_reward.data.conversation import (
    DEFAULT_SYSTEM_PROMPT,
    drop_assistant_think,
    prompt_to_context,
    split_query,
    turns_to_messages,
)
from pmi_reward.data.dialogues import Dialogue, load_dialogues
from pmi_reward.data.pairs import PairSet, join_turns

CHAT = [
    {"role": "system", "content": "Be nice."},
    {"role": "user", "content": "I just got back from Rome."},
    {"role": "assistant", "content": "Nice! How was it?"},
    {"role": "user", "content": "Amazing."},
    {"role": "system", "content": "Stay on topic."},
    {"role": "user", "content": "The food was\nthe best part."},
    {"role": "assistant", "content": "What did you eat?"},
    {"role": "user", "content": "Carbonara."},
]
ALIASES = {"user": "human", "assistant": "gpt"}


def _training_contexts(messages: list[dict], max_context_turns: int) -> dict[str, str]:
    """Each reply's context as training pairs read it: {reply: context}."""
    pairs = PairSet.from_dialogues(load_dialogues([{"id": "a", "messages": messages}]), max_context_turns)
    return dict(zip(pairs.response_texts, pairs.context_texts, strict=True))


@pytest.mark.parametrize("roles", [{}, ALIASES, {"assistant": "bot"}, {"user": "Human", "assistant": "Model"}])
@pytest.mark.parametrize("max_turns", [1, 2, 3])
def test_a_prompt_reads_as_training_read_the_chat(roles, max_turns):
    """The reward read each message as its own turn and dropped alias roles (human, gpt, bot, model), where training
    joins one speaker's consecutive messages into a turn and maps the aliases: the same chat gave the scorer another
    context at reward time than in training. Every reply's context now reads the same in both."""
    chat = [{**m, "role": roles.get(m["role"], m["role"])} for m in CHAT]
    trained = _training_contexts(chat, max_turns)
    # where each reply's turn starts in the chat (the user's two messages around the system one are one turn)
    starts = {2: "Nice! How was it?", 3: "Amazing. The food was the best part."}
    starts |= {6: "What did you eat?", 7: "Carbonara."}
    assert set(trained) == set(starts.values())
    for n, reply in starts.items():
        assert prompt_to_context(chat[:n], max_turns=max_turns) == trained[reply]
    assert prompt_to_context(chat[:-1], max_turns=2) == "Amazing. The food was the best part.\nWhat did you eat?"


def test_system_messages_are_turns_of_their_own_only_with_include_system():
    """Without include_system a system message is skipped (the user's messages around it are one turn, as in
    training); with it, it is its own turn where it stands, as before."""
    assert prompt_to_context(CHAT[:6], include_system=True) == (
        "Be nice.\nI just got back from Rome.\nNice! How was it?\nAmazing.\nStay on topic.\nThe food was the best part."
    )
    context = prompt_to_context(CHAT[:6])
    assert context == "I just got back from Rome.\nNice! How was it?\nAmazing. The food was the best part."


@pytest.mark.parametrize("system_prompt", [None, DEFAULT_SYSTEM_PROMPT])
def test_the_recipes_chat_prompts_read_as_before(system_prompt):
    """The recipes' prompts (policy.prompts: turns_to_messages, alternating speakers, the newest the user's) read turn
    for turn as the turns they were written from, with and without the system prompt: no recorded figure moves."""
    turns = ["Hi there.", "Hello!\nHow are you?", "  Fine, thanks. ", "What's new?", "Not much.", "Me neither."]
    for n in range(1, len(turns) + 1):
        messages = turns_to_messages(turns[:n], system_prompt)
        system = [system_prompt] if system_prompt else []
        for max_turns in (None, 1, 3):
            kept = turns[:n][-max_turns:] if max_turns else turns[:n]
            assert prompt_to_context(messages, max_turns=max_turns) == join_turns(kept)
            assert prompt_to_context(messages, include_system=True, max_turns=max_turns) == join_turns(
                (system + turns[:n])[-max_turns:] if max_turns else system + turns[:n]
            )
        assert prompt_to_context(drop_assistant_think(messages)) == join_turns(turns[:n])  # nothing to drop


def test_text_of_no_known_speaker_stays_one_turn_a_line():
    """Plain text's lines and the end of a cut-off turn have no known speaker: each stays a turn of its own (they are
    not joined with the user's turn after them), as before."""
    messages, reply = split_query("Hi.\nHello!\nHow are you?\nFine.")
    assert reply == "Fine." and prompt_to_context(messages) == "Hi.\nHello!\nHow are you?"
    old = "".join(f"Old line {i}.\n" for i in range(300))
    prompt = (
        f"<|im_start|>user\nHi.<|im_end|>\n<|im_start|>assistant\n{old}The end.<|im_end|>\n"
        "<|im_start|>user\nWho is your favourite?<|im_end|>\n<|im_start|>assistant\n"
    )
    messages, reply = split_query(prompt + "Coltrane.<|im_end|>", prompt, max_chars=100)  # cut in the long reply
    assert reply == "Coltrane." and prompt_to_context(messages).endswith("The end.\nWho is your favourite?")


def test_alias_assistant_messages_lose_their_reasoning_as_assistant_ones():
    """An alias role's message is now read as the assistant's: its reasoning is dropped as an assistant's is."""
    messages = [{"role": "human", "content": "Hi."}, {"role": "gpt", "content": "<think>greet</think>Hello!"}]
    assert prompt_to_context(drop_assistant_think(messages)) == "Hi.\nHello!"


def test_blank_turns_of_a_dialogue_built_in_python_are_no_turns():
    """PairSet.from_dialogues kept a blank turn of a Dialogue built in Python (an empty reply as a positive, a blank
    context line) where load_dialogues drops it: both now read the dialogue alike."""
    turns = ("Hi", "  ", "How are you?", "\n", "Fine")
    built = PairSet.from_dialogues([Dialogue("x", turns)], 3)
    loaded = PairSet.from_dialogues(load_dialogues([{"id": "x", "turns": list(turns)}]), 3)
    assert built.context_texts == loaded.context_texts == ["Hi", "Hi\nHow are you?"]
    assert built.response_texts == loaded.response_texts == ["How are you?", "Fine"]
    assert "" not in built.responses
    with pytest.raises(ValueError, match="no context-response pairs"):
        PairSet.from_dialogues([Dialogue("y", ("Hi", " ", ""))])

"""Edges of reading conversations as scorer text (review 29, oddtext findings 2, 4 and 6): a long reply cut inside
itself by ``max_chars``, completion roles spelled as prompts may spell them, and a user's literal think tags in a
context given as text."""

import pytest
from conftest import http
from test_conversation import PROMPTS

from pmi_reward.data.conversation import completion_to_text, drop_think_blocks, prompt_to_context, split_query
from pmi_reward.rewards.options import RewardOptions
from pmi_reward.rewards.path import RewardPath
from pmi_reward.rewards.reward import PMIReward

LONG_REPLY = "\n".join(f"Line {i}: we went hiking and saw a lake." for i in range(30))  # ~1.2k characters


@pytest.mark.parametrize("name", list(PROMPTS))
def test_a_long_reply_cut_inside_itself_is_no_pair(name):
    """Without a prompt, ``max_chars`` keeps the query's lines in its last ``4 * max_chars`` characters: with a reply
    longer than that, none of the template's headers survived, the rest read as plain text, and the reply's last line
    was scored against its own earlier lines as the context. Now no pair is read (None), as the docstring promises."""
    prompt, end = PROMPTS[name]
    query = prompt + " " + LONG_REPLY + end
    whole = split_query(query)
    assert whole is not None and whole[1].startswith("Line 0:") and prompt_to_context(whole[0]).endswith("favourite?")
    assert split_query(query, max_chars=200) is None


@pytest.mark.parametrize("words", ["Assistant: and then we went home.", "<|im_start|>assistant\nIt was a lovely lake."])
def test_a_cut_reply_whose_lines_look_like_turns_is_no_pair(words):
    """A Llama 3 reply whose kept lines hold a transcript's role line or ChatML's header (its words) read as that
    template's turns once the reply's own header was cut off (the reply became what follows them, its earlier lines
    the context): the cut text holds no Llama 3 header, so no pair."""
    prompt, end = PROMPTS["llama3"]
    query = prompt + LONG_REPLY + "\n" + words + "\nThe end." + end
    assert split_query(query)[1].startswith("Line 0:")
    assert split_query(query, max_chars=200) is None


def test_a_cut_keeps_reading_what_it_can():
    """The check stops only replies whose header was cut off: a long reply whose header is in the kept lines, a long
    transcript turn whose role line is kept, and plain text (its last line is the reply) read as before."""
    prompt, end = PROMPTS["chatml"]
    old = "".join(f"<|im_start|>user\nOld line {i}.<|im_end|>\n" for i in range(200))
    messages, reply = split_query(old + prompt + "Coltrane, for sure." + end, max_chars=200)
    assert reply == "Coltrane, for sure." and prompt_to_context(messages).endswith("Who is your favourite?")
    transcript = "".join(f"User: old {i}\nAssistant: yes {i}\n" for i in range(100)) + "User: Who?\nAssistant: Bird."
    messages, reply = split_query(transcript, max_chars=100)
    assert reply == "Bird." and prompt_to_context(messages).endswith("Who?")
    plain = "\n".join(f"plain line {i}" for i in range(300))
    messages, reply = split_query(plain, max_chars=100)
    assert reply == "plain line 299" and prompt_to_context(messages).endswith("plain line 298")


def test_get_reward_without_prompts_scores_no_pair_inside_a_long_reply(spread_scorer):
    """The server's ``/get_reward`` without ``prompts`` and a small ``--max_chars``: the long reply gets the reward of
    a query that cannot be split (``empty_score``), not a PMI of its last line given its earlier lines."""
    from pmi_reward.serving.server import RewardServer, ServerConfig

    prompt = "<|im_start|>user\nTell me about your weekend<|im_end|>\n<|im_start|>assistant\n"
    server = RewardServer(spread_scorer, ServerConfig(port=0), RewardOptions(max_chars=200)).start()
    try:
        status, answer = http(server.url, "POST", "/get_reward", {"query": [prompt + LONG_REPLY + "<|im_end|>"]})
    finally:
        server.close()
    assert status == 200 and answer["rewards"] == [RewardOptions().empty_score]


ASSISTANT_SPELLINGS = ["assistant", "Assistant", " ASSISTANT ", "model", "gpt", "bot", "ai", "GPT"]


@pytest.mark.parametrize("role", ASSISTANT_SPELLINGS)
def test_completion_roles_are_read_as_prompt_roles(role):
    """A completion's message counted only under the exact role "assistant"; a prompt reads any case and the speaker
    aliases (Gemma's ``model``, ShareGPT's ``gpt``), so the same reply was empty as a completion."""
    message = {"role": role, "content": "What did you name her?"}
    assert completion_to_text([message]) == "What did you name her?"
    assert prompt_to_context([message]) == "What did you name her?"


@pytest.mark.parametrize("role", ["user", "Human", "system", "tool"])
def test_completion_messages_of_other_roles_stay_out(role):
    """Other speakers' and roles' messages are still no part of a reply; a message with no role is the assistant's."""
    assert completion_to_text([{"role": role, "content": "Hi"}]) is None
    assert completion_to_text([{"role": role, "content": "Hi"}, {"content": "Yo"}]) == "Yo"


def test_reward_and_rerank_read_alias_completions_alike(spread_scorer, spread_server):
    """``PMIReward`` and ``/rerank`` gave ``empty_score`` and null to every spelling but "assistant"."""
    prompt = [{"role": "user", "content": "I just adopted a kitten."}]
    completions = [[{"role": r, "content": "What did you name her?"}] for r in ASSISTANT_SPELLINGS]
    rewards = PMIReward(spread_scorer)([prompt] * len(completions), completions)
    assert rewards == pytest.approx([rewards[0]] * len(completions), abs=1e-5)
    assert rewards[0] != RewardOptions().empty_score
    status, answer = http(spread_server.url, "POST", "/rerank", {"context": prompt, "candidates": completions})
    assert status == 200 and None not in answer["scores"]
    assert answer["scores"] == pytest.approx([rewards[0]] * len(completions), abs=1e-5)


TECH_TURNS = [
    "How do I use the <think> tag in Qwen3 prompts?",
    "You put the reasoning inside it.",
    "And what about it?",
]


def test_a_users_literal_think_tags_do_not_delete_the_turns_between():
    """A ``<think>`` inside one line and a literal ``</think>`` in a later line were read as one block, and every turn
    between them went: three turns became "How do I use the go?". A block spans lines only when it opens a line."""
    text = (
        "How do I use the <think> tag in Qwen3 prompts?\nYou put the reasoning inside it.\nAnd where does </think> go?"
    )
    assert drop_think_blocks(text) == "How do I use the \nYou put the reasoning inside it.\n go?"  # per line
    path = RewardPath(RewardOptions(max_context_turns=3))
    as_text = path.texts([text], ["Right after the reasoning."]).contexts[0]
    assert as_text.split("\n") == ["How do I use the", "You put the reasoning inside it.", "go?"]


def test_reasoning_traces_in_text_contexts_still_go_whole():
    """A block opened at the start of a line (a past turn's reasoning trace, indented or not) goes whole over its
    lines, also after a user's literal tag earlier in the text; an unclosed one ends with its line, as documented."""
    trace = "<think>\nThe user asks a sum.\n2+2 is 4.\n</think>\nIt is 4."
    assert drop_think_blocks("what is 2+2?\n" + trace + "\nthanks!") == "what is 2+2?\nIt is 4.\nthanks!"
    assert drop_think_blocks("what is 2+2?\n  " + trace) == "what is 2+2?\nIt is 4."
    literal = "What is the <think> tag for?\n" + trace
    assert drop_think_blocks(literal) == "What is the \nIt is 4."
    assert drop_think_blocks("<think>open\nWho?") == "Who?"
    assert drop_think_blocks("Hi <think>x</think> there\nYo") == "Hi there\nYo"
    messages = [{"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(TECH_TURNS)]
    path = RewardPath(RewardOptions(max_context_turns=3))
    assert path.texts([messages], ["Right."]).contexts[0] == "\n".join(TECH_TURNS)
    assert path.texts(["\n".join(TECH_TURNS)], ["Right."]).contexts[0].split("\n")[1:] == TECH_TURNS[1:]


def test_a_transcript_typed_with_full_width_colons_reads_as_one():
    """``User：...`` (a CJK input method's colon) was plain text: the reply kept its role label, the context its
    labels, on the server, OpenRLHF and verl paths."""
    from pmi_reward.data.conversation import parse_chat, split_query

    ascii_form = "User: 周末去哪儿了？\nAssistant: 去爬山了！"
    full_width = "User：周末去哪儿了？\nAssistant：去爬山了！"
    assert parse_chat(full_width) == parse_chat(ascii_form)
    assert split_query(full_width) == split_query(ascii_form)
    assert split_query(full_width)[1] == "去爬山了！"


# -- which prompt strings are chat-templated (review 32 second look, finding 1) --------------------------------------

QUOTING = {
    "phi-3": "I'm writing a chat parser.\nPhi-3 marks a user turn with <|user|> and a reply with <|assistant|>, right?",
    "chatml": "I'm reading Qwen's docs.\nWhy does every turn start with <|im_start|>user and end with <|im_end|>?",
    "gemma": "My prompt has <start_of_turn>user in it and the model gets confused.\nAny idea why?",
    "inst": "We talked about prompts yesterday.\nMistral writes [INST] question [/INST] answer.\nWhat does Llama 3 do?",
}


@pytest.mark.parametrize("name", list(QUOTING))
def test_a_plain_prompt_quoting_a_template_marker_reads_one_turn_per_line(name):
    """A string counted as templated when a template's marker stood anywhere in it: the words before the marker went
    and those between markers became turns ("and a reply with\\n, right?"), in ``PMIReward``, ``RemotePMIReward`` and
    ``pmi-reward score``, while ``pmi-reward evaluate`` read the same row line by line. Only a template whose markup
    opens the string makes it a templated one."""
    from pmi_reward.data.conversation import templated_prompt

    text = QUOTING[name]
    assert templated_prompt(text) is None
    path = RewardPath(RewardOptions(max_context_turns=3))
    assert path.texts([text], ["Good question."]).contexts == [prompt_to_context(text, max_turns=3)] == [text]
    # the same words in a turn of a prompt that Llama 3's markup opens are that turn's words
    user = text.replace("\n", " ")
    templated = (
        f"<|start_header_id|>user<|end_header_id|>\n\n{user}<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    assert path.texts([templated], ["Good question."]).contexts == [text.replace("\n", " ")]


def test_a_transcript_is_never_read_as_a_templated_prompt():
    """A ``User:``/``Assistant:`` transcript kept its prefixes (one turn per line) unless a template's marker stood in
    it somewhere: then its prefixes went. Now it reads alike either way."""
    from pmi_reward.data.conversation import templated_prompt

    plain = "User: What does the tag mean?\nAssistant: Which tag?\nUser: the one Mistral uses"
    marked = "User: What does [INST] mean?\nAssistant: Which tag?\nUser: the one Mistral uses"
    assert templated_prompt(plain) is None and templated_prompt(marked) is None
    path = RewardPath(RewardOptions(max_context_turns=3))
    assert path.texts([plain, marked], ["x", "x"]).contexts == [plain, marked]


SYSTEM, U1, A1, U2 = (
    "You are chatting with a friend.",
    "I just got back from a hiking trip.",
    "Oh nice, where did you go?",
    "Yosemite, the views were amazing.",
)
CHAT = [
    {"role": "system", "content": SYSTEM},
    {"role": "user", "content": U1},
    {"role": "assistant", "content": A1},
    {"role": "user", "content": U2},
]
# TRL 1.16's shipped chat templates that conversation.py knows (trl/chat_templates/*.jinja; not Gemma 4, gpt-oss,
# Cohere, Muse Glimmer or the vision ones), and whether their generation prompt opens <think>
TRL_TEMPLATES = {
    **dict.fromkeys(["deepseek_r1_distill", "deepseekv3", "qwen3_5_think", "qwen3_6", "qwen3_8"], True),
    **dict.fromkeys(["nemotron_3_5_lightning", "nemotron_3_nano", "nemotron_3_super", "nemotron_3_ultra"], True),
    **dict.fromkeys(["glm4moe", "lfm2", "lfm2_v2", "lfm2_2_5", "lfm2_2_5_v2", "lfm2_2_5_vl"], False),
    **dict.fromkeys(["llama3", "llama3_1", "llama3_2", "phi3", "phi3_5", "qwen2_5", "qwen2_5_vl"], False),
    **dict.fromkeys(["qwen3", "qwen3_5_nothink", "qwen3_instruct_2507", "qwen3_vl", "gemma3"], False),
}
DS_BOS, DS_USER, DS_ASSISTANT = (
    "<\uff5cbegin\u2581of\u2581sentence\uff5c>",
    "<\uff5cUser\uff5c>",
    "<\uff5cAssistant\uff5c>",
)
# templates written by hand as the models' own chat templates render CHAT (and whether they open <think>)
HAND_WRITTEN = {
    "llama4": (
        f"<|begin_of_text|><|header_start|>system<|header_end|>\n\n{SYSTEM}<|eot|><|header_start|>user<|header_end|>"
        f"\n\n{U1}<|eot|><|header_start|>assistant<|header_end|>\n\n{A1}<|eot|><|header_start|>user<|header_end|>\n\n"
        f"{U2}<|eot|><|header_start|>assistant<|header_end|>\n\n",
        False,
    ),
    "granite": (
        f"<|start_of_role|>system<|end_of_role|>{SYSTEM}<|end_of_text|>\n<|start_of_role|>user<|end_of_role|>{U1}"
        f"<|end_of_text|>\n<|start_of_role|>assistant<|end_of_role|>{A1}<|end_of_text|>\n<|start_of_role|>user"
        f"<|end_of_role|>{U2}<|end_of_text|>\n<|start_of_role|>assistant<|end_of_role|>",
        False,
    ),
    "glm4": (f"[gMASK]<sop><|system|>\n{SYSTEM}<|user|>\n{U1}<|assistant|>\n{A1}<|user|>\n{U2}<|assistant|>", False),
    "phi4": (
        f"<|im_start|>system<|im_sep|>{SYSTEM}<|im_end|><|im_start|>user<|im_sep|>{U1}<|im_end|><|im_start|>assistant"
        f"<|im_sep|>{A1}<|im_end|><|im_start|>user<|im_sep|>{U2}<|im_end|><|im_start|>assistant<|im_sep|>",
        False,
    ),
    "llama2": (f"<s>[INST] <<SYS>>\n{SYSTEM}\n<</SYS>>\n\n{U1} [/INST] {A1} </s><s>[INST] {U2} [/INST]", False),
    "mistral_v3": (f"<s>[INST] {U1}[/INST] {A1}</s>[INST] {SYSTEM}\n\n{U2}[/INST]", False),
    "mistral_v7": (
        f"<s>[SYSTEM_PROMPT]{SYSTEM}[/SYSTEM_PROMPT][INST]{U1}[/INST]{A1}</s>[INST]{U2}[/INST]",
        False,
    ),
    "r1 without bos": (f"{SYSTEM}{DS_USER}{U1}{DS_ASSISTANT}{A1}{DS_USER}{U2}{DS_ASSISTANT}<think>\n", True),
    "r1 with bos": (f"{DS_BOS}{SYSTEM}{DS_USER}{U1}{DS_ASSISTANT}{A1}{DS_USER}{U2}{DS_ASSISTANT}<think>\n", True),
    "qwen3.5 prefilled": (
        f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{U1}<|im_end|>\n<|im_start|>assistant\n{A1}"
        f"<|im_end|>\n<|im_start|>user\n{U2}<|im_end|>\n<|im_start|>assistant\n<think>\nThe user hiked",
        True,
    ),
}
# Gemma 3 and Mistral v3 write the system prompt into a user turn, joined by a blank line (documented: it stays there)
SYSTEM_IN_USER = {"gemma3": 1, "mistral_v3": 3}


def _rendered(tokenizer, name: str) -> str:
    """CHAT rendered with TRL's shipped chat template ``name``, with a generation prompt."""
    import pathlib

    import trl

    source = pathlib.Path(trl.__file__).parent / "chat_templates" / f"{name}.jinja"
    if not source.exists():
        pytest.skip(f"this TRL ships no {name}.jinja")
    return tokenizer.apply_chat_template(
        CHAT, chat_template=source.read_text(), tokenize=False, add_generation_prompt=True, bos_token="<s>"
    )


@pytest.mark.parametrize("name", [*TRL_TEMPLATES, *HAND_WRITTEN])
def test_every_known_template_reads_as_its_messages_and_as_split_query(name, tokenizer):
    """Each known template's prompt string, rendered by TRL's own templates or written as the model's: read as its
    messages (the context of CHAT as messages, whatever the template's system prompt or BOS), its generation prompt's
    ``<think>`` opening the reply; and the server's ``split_query`` of the prompt and a reply reads the same context,
    reply and unfinished reasoning."""
    from pmi_reward.rewards.path import read_prompt

    prompt, opened = HAND_WRITTEN[name] if name in HAND_WRITTEN else (_rendered(tokenizer, name), TRL_TEMPLATES[name])
    messages, read_opened = read_prompt(prompt)
    assert isinstance(messages, list) and read_opened == opened
    chat = [dict(m) for m in CHAT]
    if name in SYSTEM_IN_USER:
        at = SYSTEM_IN_USER[name]
        chat[at]["content"] = f"{SYSTEM}\n\n{chat[at]['content']}"
    replies = ["the user hiked, so I ask where", "the user hiked</think>\n\nDid you see Half Dome?"]
    path = RewardPath(RewardOptions(max_context_turns=3))
    as_messages = path.texts([chat] * 2, replies)
    as_string = path.texts([prompt] * 2, replies)
    assert as_string.contexts == as_messages.contexts
    assert as_string.replies == ["" if opened else replies[0], "Did you see Half Dome?"]
    assert as_string.unfinished_think == opened
    for max_chars in (None, 4000):
        split = [split_query(prompt + reply, prompt, max_chars) for reply in replies]
        served = path.texts([s[0] for s in split], [s[1] for s in split])
        assert (served.contexts, served.replies) == (as_string.contexts, as_string.replies), max_chars
        assert served.unfinished_think == as_string.unfinished_think


@pytest.mark.parametrize(
    "prompt",
    [
        "[gMASK]sop<|system|>\nBe nice.<|user|>\nHi there<|assistant|>",  # ChatGLM3: "sop" bare
        "<|startoftext|><|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",  # Yi's BOS
        "\ufeff<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",  # a UTF-8 BOM (a table's first cell)
    ],
)
def test_a_templated_prompt_opened_by_another_bos_still_reads_as_its_messages(prompt):
    """Only a template's markup may open a templated prompt string, after BOS and padding: ChatGLM3's ``[gMASK]sop``,
    Yi's ``<|startoftext|>`` and a BOM were read as plain text quoting a marker, the context the whole markup."""
    from pmi_reward.data.conversation import split_query, templated_prompt

    templated = templated_prompt(prompt)
    assert templated is not None and templated[0][-2] == {"role": "user", "content": "Hi there"}
    assert split_query(prompt + "Hello!", prompt)[0][-2] == {"role": "user", "content": "Hi there"}


def test_the_server_reads_a_prompt_quoting_a_marker_as_the_in_process_reward_does(tiny_scorer):
    """``split_query`` (the server's ``/get_reward``) parsed a prompt quoting a template marker as templated, dropping
    the words before it, where ``PMIReward`` reads it one turn per line: the same prompt got two contexts."""
    from pmi_reward.data.conversation import split_query
    from pmi_reward.rewards.reward import PMIReward

    prompt = "I'm writing a chat parser.\nPhi-3 marks a user turn with <|user|> and a reply with <|assistant|>, right?"
    messages, reply = split_query(prompt + " Yes.", prompt)
    reward = PMIReward(tiny_scorer)
    assert reply == " Yes." or reply.strip() == "Yes."
    assert reward.texts([messages], ["Yes."]).contexts == reward.texts([prompt], ["Yes."]).contexts

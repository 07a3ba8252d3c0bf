"""Templated strings back into messages and replies: every supported template, plain text, odd input."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pmi_reward.data.conversation import (
    clean_reply,
    opens_think,
    parse_chat,
    prompt_to_context,
    split_query,
    strip_think,
)

CONVERSATION = [
    {"role": "system", "content": "Be nice."},
    {"role": "user", "content": "I love jazz."},
    {"role": "assistant", "content": "Me too!"},
    {"role": "user", "content": "Who is your favourite?"},
]
CONTEXT = "I love jazz.\nMe too!\nWho is your favourite?"
DS_BOS, DS_EOS = "<\uff5cbegin\u2581of\u2581sentence\uff5c>", "<\uff5cend\u2581of\u2581sentence\uff5c>"
DS_USER, DS_ASSISTANT = "<\uff5cUser\uff5c>", "<\uff5cAssistant\uff5c>"

PROMPTS = {
    "chatml": (
        "<|im_start|>system\nBe nice.<|im_end|>\n<|im_start|>user\nI love jazz.<|im_end|>\n"
        "<|im_start|>assistant\nMe too!<|im_end|>\n<|im_start|>user\nWho is your favourite?<|im_end|>\n"
        "<|im_start|>assistant\n",
        "<|im_end|>\n<|endoftext|>",
    ),
    "llama3": (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe nice.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nI love jazz.<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\nMe too!"
        "<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nWho is your favourite?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n",
        "<|eot_id|>",
    ),
    "gemma": (
        "<bos><start_of_turn>user\nI love jazz.<end_of_turn>\n<start_of_turn>model\nMe too!<end_of_turn>\n"
        "<start_of_turn>user\nWho is your favourite?<end_of_turn>\n<start_of_turn>model\n",
        "<end_of_turn>\n",
    ),
    "phi3": (
        "<|system|>\nBe nice.<|end|>\n<|user|>\nI love jazz.<|end|>\n<|assistant|>\nMe too!<|end|>\n<|user|>\n"
        "Who is your favourite?<|end|>\n<|assistant|>\n",
        "<|end|>\n<|endoftext|>",
    ),
    "llama2": (
        "<s>[INST] <<SYS>>\nBe nice.\n<</SYS>>\n\nI love jazz. [/INST] Me too! </s><s>[INST] "
        "Who is your favourite? [/INST]",
        " </s>",
    ),
    "roles": ("System: Be nice.\nUser: I love jazz.\nAssistant: Me too!\nUser: Who is your favourite?\nAssistant:", ""),
    # the templates below as their tokenizer_config.json's chat_template renders the conversation; DeepSeek's tokens are
    # written with fullwidth bars (U+FF5C) and U+2581, its system prompt bare after the BOS token
    # (deepseek-ai/DeepSeek-V3, and the R1 distills but for their generation prompt: test_deepseek_r1_distill_think)
    "deepseek": (
        f"{DS_BOS}Be nice.{DS_USER}I love jazz.{DS_ASSISTANT}Me too!{DS_EOS}{DS_USER}Who is your favourite?"
        f"{DS_ASSISTANT}",
        DS_EOS,
    ),
    "phi4": (  # microsoft/phi-4: <|im_sep|> where ChatML has a newline, no newline between turns
        "<|im_start|>system<|im_sep|>Be nice.<|im_end|><|im_start|>user<|im_sep|>I love jazz.<|im_end|>"
        "<|im_start|>assistant<|im_sep|>Me too!<|im_end|><|im_start|>user<|im_sep|>Who is your favourite?<|im_end|>"
        "<|im_start|>assistant<|im_sep|>",
        "<|im_end|>",
    ),
    "llama4": (  # meta-llama/Llama-4-Scout-17B-16E-Instruct
        "<|begin_of_text|><|header_start|>system<|header_end|>\n\nBe nice.<|eot|>"
        "<|header_start|>user<|header_end|>\n\nI love jazz.<|eot|><|header_start|>assistant<|header_end|>\n\nMe too!"
        "<|eot|><|header_start|>user<|header_end|>\n\nWho is your favourite?<|eot|>"
        "<|header_start|>assistant<|header_end|>\n\n",
        "<|eot|>",
    ),
    "glm4": (  # THUDM/glm-4-9b-chat: no end-of-turn marker; a reply stops at a stop token, here <|user|>
        "[gMASK]<sop><|system|>\nBe nice.<|user|>\nI love jazz.<|assistant|>\nMe too!<|user|>\nWho is your favourite?"
        "<|assistant|>",
        "<|user|>",
    ),
    "granite": (  # ibm-granite/granite-3.0-2b-instruct
        "<|start_of_role|>system<|end_of_role|>Be nice.<|end_of_text|>\n"
        "<|start_of_role|>user<|end_of_role|>I love jazz.<|end_of_text|>\n"
        "<|start_of_role|>assistant<|end_of_role|>Me too!<|end_of_text|>\n"
        "<|start_of_role|>user<|end_of_role|>Who is your favourite?<|end_of_text|>\n"
        "<|start_of_role|>assistant<|end_of_role|>",
        "<|end_of_text|>",
    ),
}


@pytest.mark.parametrize("name", list(PROMPTS))
def test_every_template_gives_the_same_context_and_reply(name):
    prompt, end = PROMPTS[name]
    query = prompt + " Coltrane, for sure." + end
    for messages, reply in (split_query(query, prompt), split_query(query)):
        assert reply == "Coltrane, for sure."
        assert prompt_to_context(messages) == CONTEXT
        # the system prompt is a system message: a turn only with include_system (Gemma's template has none)
        assert prompt_to_context(messages, include_system=True) == (
            CONTEXT if name == "gemma" else "Be nice.\n" + CONTEXT
        )


def test_plain_text_is_one_turn_per_line():
    messages, reply = split_query("I love jazz.\nMe too!\nWho is your favourite?\nColtrane.")
    assert prompt_to_context(messages) == CONTEXT and reply == "Coltrane."
    messages, reply = split_query("I love jazz.\nColtrane.</s><pad><pad>", "I love jazz.\n")
    assert prompt_to_context(messages) == "I love jazz." and reply == "Coltrane."


def test_what_cannot_be_split():
    assert split_query("") is None
    assert split_query("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n") is None  # no reply yet
    assert split_query("<|im_start|>user\nhi<|im_end|>") is None  # no assistant turn
    assert parse_chat("just text") is None
    assert clean_reply("fine<|im_end|>junk") == "fine" and clean_reply("  plain  ") == "plain"


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(query=st.text(max_size=200), prompt=st.one_of(st.none(), st.text(max_size=50)))
def test_never_raises(query, prompt):
    result = split_query(query, prompt)
    assert result is None or (isinstance(result[1], str) and isinstance(result[0], list))


def test_think_blocks():
    from pmi_reward.data.conversation import drop_think_blocks, opens_think, strip_think

    assert strip_think("<think>\nThey like jazz.\n</think>\n\nColtrane!") == "\n\nColtrane!"
    assert strip_think("<think>a</think>b<think>c</think>d") == "d"  # the text after the LAST </think>
    assert strip_think("<think>still thinking") == ""  # unterminated: nothing to score
    assert strip_think("answer<think>more") == ""
    assert strip_think("plain reply") == "plain reply"
    assert strip_think("reasoning</think>answer", opened=True) == "answer"  # the prompt opened the block
    assert strip_think("reasoning cut at max tokens", opened=True) == ""
    assert drop_think_blocks("I love jazz.\n<think>hm</think>Me too!\nWho?") == "I love jazz.\nMe too!\nWho?"
    assert drop_think_blocks("a\nreasoning</think> b\n<think>open") == "a\n b"
    # an unterminated block ends with its own turn: the turns after it stay (it ran to the end of the context)
    assert drop_think_blocks("<think>open\nWho?") == "Who?"
    assert opens_think("<|im_start|>assistant\n<think>\n") and not opens_think("<think>x</think>\n")
    prompt = PROMPTS["chatml"][0] + "<think>\n"
    messages, reply = split_query(prompt + "hmm</think>\n\nColtrane!<|im_end|>", prompt)
    assert prompt_to_context(messages) == CONTEXT and reply == "<think>hmm</think>\n\nColtrane!"


@pytest.mark.parametrize("name", list(PROMPTS))
def test_a_cut_before_parsing_keeps_what_a_reward_reads(name):
    """With ``max_chars``, a long conversation is cut before it is parsed; the reply and the context's newest turns
    come out as from the whole text (with or without the prompt)."""
    prompt, end = PROMPTS[name]
    old = "".join(f"Old line {i}.\n" for i in range(2000))  # 26 kB of older turns, far over 4 x max_chars
    head = prompt.replace("I love jazz.", old + "I love jazz.")
    query = head + " Coltrane, for sure." + end
    for args in ((query, head), (query,)):
        whole, cut = split_query(*args), split_query(*args, max_chars=500)
        assert cut[1] == whole[1] == "Coltrane, for sure."
        assert prompt_to_context(cut[0]).endswith(CONTEXT) and prompt_to_context(whole[0]).endswith(CONTEXT)
        assert len(prompt_to_context(cut[0])) <= 2000 < len(prompt_to_context(whole[0]))


def test_pathological_templates_parse_to_what_they_hold():
    """Inputs that made the backtracking patterns quadratic (``"[INST]" * 32000`` took 58 s) parse correctly; the
    parser is linear (str.find and patterns that cannot backtrack across turns)."""
    assert split_query("[INST]" * 32000) == ([], "")  # no reply: scored as empty
    assert parse_chat("[INST]" * 32000) is None
    turns = parse_chat("[INST]<<SYS>>" * 16000 + "[INST] hi [/INST] hello")
    assert turns[-2:] == [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    assert parse_chat("<|im_start|>" * 32000) is None
    assert len(parse_chat("<|im_start|>user\n" * 12000)) == 12000
    transcript = parse_chat("user: hi\n" + "more\n" * 50000 + "assistant: yo")
    assert transcript[0]["content"] == "hi" + " more" * 50000 and transcript[1] == {
        "role": "assistant",
        "content": "yo",
    }


def test_a_closed_think_block_over_several_lines_goes_whole():
    """Reading turns line by line left the middle lines of a closed multi-line block in a string context."""
    from pmi_reward.data.conversation import drop_think_blocks

    text = "what is 2+2?\n<think>\nThe user asks a sum.\n2+2 is 4.\n</think>\nIt is 4.\nthanks!"
    assert drop_think_blocks(text) == "what is 2+2?\nIt is 4.\nthanks!"


def test_deepseek_r1_distill_think():
    """The R1 distills' generation prompt opens the reasoning (deepseek-ai/DeepSeek-R1-Distill-Llama-8B's
    chat_template: ``{{'<｜Assistant｜><think>\\n'}}``): the reply gets the tag back, the context reads as any other."""
    prompt = PROMPTS["deepseek"][0] + "<think>\n"
    query = prompt + "They like jazz.\n</think>\n\nColtrane, for sure." + DS_EOS
    messages, reply = split_query(query, prompt)
    assert prompt_to_context(messages) == CONTEXT and prompt_to_context(messages, include_system=True) == (
        "Be nice.\n" + CONTEXT
    )
    assert strip_think(reply, opened=True).strip() == "Coltrane, for sure."
    messages, reply = split_query(query)  # without the prompt: the last assistant turn, reasoning and all
    assert prompt_to_context(messages) == CONTEXT and strip_think(reply).strip() == "Coltrane, for sure."


def test_glm4_observation_turns_are_not_dialogue():
    """GLM-4's tool output (``<|observation|>``) is no turn of the conversation, and it is one of the stop tokens."""
    prompt = (
        '[gMASK]<sop><|user|>\nI love jazz.<|assistant|>\nMe too!<|observation|>\n{"tool": 1}<|user|>\n'
        "Who is your favourite?<|assistant|>"
    )
    for messages, reply in (
        split_query(prompt + "\nColtrane.<|observation|>", prompt),
        split_query(prompt + "\nColtrane."),
    ):
        assert prompt_to_context(messages) == CONTEXT and reply == "Coltrane."


def test_a_users_literal_think_tag_is_not_the_generation_prompts():
    """Only a ``<think>`` that ends the prompt is the open block of the generation prompt: a user's literal tag cut the
    context at it and made every reply unfinished reasoning (empty_score for all)."""
    prompt = "<|im_start|>user\nWhat is the <think> tag in Qwen3 for?<|im_end|>\n<|im_start|>assistant\n"
    messages, reply = split_query(prompt + "It marks the model's private reasoning.<|im_end|>", prompt)
    assert not opens_think(prompt)
    assert prompt_to_context(messages) == "What is the <think> tag in Qwen3 for?"
    assert reply == strip_think(reply) == "It marks the model's private reasoning."
    opened = prompt + "<think>\n"  # the generation prompt's tag after it still counts
    messages, reply = split_query(opened + "Easy.</think>\n\nIt marks reasoning.<|im_end|>", opened)
    assert opens_think(opened) and opens_think(prompt + "<think>") and opens_think(opened + " \n")
    assert prompt_to_context(messages) == "What is the <think> tag in Qwen3 for?"
    assert reply == "<think>Easy.</think>\n\nIt marks reasoning."
    prefilled = opened + "Okay,"  # reasoning prefilled after the tag: still open, and an unfinished reply reads empty
    messages, reply = split_query(prefilled + " the user asks about tags and I keep going", prefilled)
    assert opens_think(prefilled) and strip_think(reply) == ""
    assert prompt_to_context(messages) == "What is the <think> tag in Qwen3 for?"


@pytest.mark.parametrize(
    "query",
    [
        "<|im_start|>user\nA<|im_end|>\n<|im_start|>assistant\nB<|im_end|>\n<|im_start|>user\n<|im_end|>\n"
        "<|im_start|>assistant\n<|im_end|>",
        "User: A\nAssistant: B\nUser:\nAssistant:",
    ],
)
def test_an_empty_reply_is_never_an_earlier_assistant_turn(query):
    """Trailing empty turns are dropped for GLM-4's stop token (an empty user header after the reply); an empty
    reply after an empty user turn made the assistant turn before them the reply."""
    assert split_query(query) is None


def test_deepseek_left_padding_is_no_system_prompt():
    """DeepSeek's R1 distills pad with their end-of-sentence token: left pads before the first turn were read as a
    system prompt."""
    eos, bos = "<\uff5cend\u2581of\u2581sentence\uff5c>", "<\uff5cbegin\u2581of\u2581sentence\uff5c>"
    user, assistant = "<\uff5cUser\uff5c>", "<\uff5cAssistant\uff5c>"
    messages, reply = split_query(eos * 3 + bos + user + "I love jazz." + assistant + "Coltrane!" + eos)
    assert messages == [{"role": "user", "content": "I love jazz."}] and reply == "Coltrane!"


def test_mistral_v7_system_prompt_is_a_system_turn():
    """Mistral v7 / Tekken (mistralai/Mistral-Small-24B-Instruct-2501's chat_template) write a system message as its own
    ``[SYSTEM_PROMPT]...[/SYSTEM_PROMPT]`` block, before or between the ``[INST]`` turns: it was dropped, even with
    include_system, and a cut-off one read as an assistant turn."""
    prompt = (
        "<s>[SYSTEM_PROMPT]Be nice.[/SYSTEM_PROMPT][INST]I love jazz.[/INST]Me too!</s>"
        "[SYSTEM_PROMPT]Be brief.[/SYSTEM_PROMPT][INST]Who is your favourite?[/INST]"
    )
    query = prompt + "Coltrane, for sure.</s>"
    for messages, reply in (split_query(query, prompt), split_query(query)):
        assert reply == "Coltrane, for sure."
        assert prompt_to_context(messages) == CONTEXT  # a system turn only with include_system, as elsewhere
        assert prompt_to_context(messages, include_system=True) == (
            "Be nice.\nI love jazz.\nMe too!\nBe brief.\nWho is your favourite?"
        )
    # cut before parsing inside a long system prompt: its end is still a system turn, not the user's or the assistant's
    old = "".join(f"Old line {i}.\n" for i in range(2000))
    head = prompt.replace("Be nice.", old + "Be nice.")
    for args in ((head + "Coltrane.</s>", head), (head + "Coltrane.</s>",)):
        messages, reply = split_query(*args, max_chars=500)
        assert reply == "Coltrane." and prompt_to_context(messages) == CONTEXT
        assert messages[0]["role"] == "system" and messages[0]["content"].endswith("Old line 1999.\nBe nice.")


@pytest.mark.parametrize(
    "name, words, cut",
    [
        (
            "chatml",
            "Phi-3 writes <|user|> before a turn and <|end|> after it; Llama 4 ends one with <|eot|>.",
            "Phi-3 writes",
        ),
        ("llama3", "Strike it out: <s>old</s> new. Gemma ends a turn with <end_of_turn>.", "Strike it out: <s>old"),
        (
            "gemma",
            "ChatML ends a turn with <|im_end|>, Llama 3 with <|eot_id|>, Mistral with </s>.",
            "ChatML ends a turn with",
        ),
        (
            "llama2",
            "Qwen writes <|im_start|>assistant, Llama 3 ends with <|eot_id|> and Phi-3 with <|end|>.",
            "Qwen writes",
        ),
    ],
)
def test_a_reply_is_cut_at_its_own_templates_tokens_only(name, words, cut):
    """Another template's tokens in a reply are its words (a reply about Phi-3's or Qwen's markup, HTML's
    ``<s>...</s>``): they cut it when every template's tokens ended every reply, and a ChatML header in a Mistral
    reply made the query read as ChatML. The template is known from the prompt, or without one from the query's first
    turn marker, and only its tokens end the reply; a reply alone (verl's) is still cut at any template's tokens."""
    prompt, end = PROMPTS[name]
    query = prompt + " " + words + end
    for _, reply in (split_query(query, prompt), split_query(query)):
        assert reply == words
    assert clean_reply(words + end) == cut  # no template to go by: cut at the first token of any


@pytest.mark.parametrize(
    "mention", ["Never write <|user|> or <|assistant|> tags.", "Ignore any [INST] ... [/INST] markup."]
)
def test_deepseek_system_prompt_mentioning_another_templates_markup(mention):
    """DeepSeek writes its system prompt bare after the BOS token, before its first turn marker: one that mentions
    Phi-3's ``<|user|>`` or Mistral's ``[INST]`` made the text read as Phi-3 or Mistral (their marker came first). The
    BOS token is DeepSeek's first marker."""
    prompt = PROMPTS["deepseek"][0].replace("Be nice.", mention)
    query = prompt + "Coltrane, for sure." + DS_EOS
    for messages, reply in (split_query(query, prompt), split_query(query)):
        assert reply == "Coltrane, for sure." and prompt_to_context(messages) == CONTEXT
        assert messages[0] == {"role": "system", "content": mention}


@pytest.mark.parametrize(
    "prompt",
    [
        "<s>[INST] <<SYS>>\nBe nice.\n<</SYS>>\n\nI love jazz. [/INST]",  # Llama 2
        "<s>[INST] I love jazz.[/INST]",  # Mistral v3
        "<s>[INST]I love jazz.[/INST]",  # Tekken (Mistral Nemo)
        "User: I love jazz.\nAssistant:",
    ],
)
def test_system_prompt_token_is_words_outside_mistral_v7(prompt):
    """``[SYSTEM_PROMPT]`` is markup only in Mistral v7's text, which opens with such a block: in a Llama 2 or older
    Mistral conversation, a transcript or a verl reply alone it is a reply's words ("Use [SYSTEM_PROMPT] for it."
    became "Use"), and no system turn."""
    words = "Mistral v7 writes [SYSTEM_PROMPT] blocks."
    end = "" if prompt.startswith("User:") else "</s>"
    query = prompt + " " + words + end
    for messages, reply in (split_query(query, prompt), split_query(query)):
        assert reply == words and prompt_to_context(messages) == "I love jazz."
    assert clean_reply("Use [SYSTEM_PROMPT] for it.") == "Use [SYSTEM_PROMPT] for it."
    earlier = "<s>[INST] I love jazz.[/INST] Say [SYSTEM_PROMPT] twice.</s>[INST] Who?[/INST]"
    messages, reply = split_query(earlier + " Coltrane.</s>")
    assert reply == "Coltrane." and prompt_to_context(messages) == "I love jazz.\nSay [SYSTEM_PROMPT] twice.\nWho?"


@pytest.mark.parametrize(
    ("name", "mention"),
    [
        ("chatml", "Why does Phi-3 write <|user|> first?"),
        ("llama3", "What do [INST] and [/INST] mean?"),
        ("gemma", "Why does Qwen write <|im_start|>user and <|im_end|>?"),
        ("deepseek", "Why does Phi-3 write <|user|> first?"),
        ("llama2", "Why does Qwen write <|im_start|>user first?"),
    ],
)
def test_a_cut_text_is_read_as_the_template_with_the_most_markers(name, mention):
    """With ``max_chars`` the text is cut inside a turn, so its start is a turn's words, whatever they hold: another
    template's marker there came first and made the text read as that template (the turns and the reply kept their
    markup). The template with the most markers is the text's."""
    prompt, end = PROMPTS[name]
    old = "".join(f"Old line {i}.\n" for i in range(2000))
    head = prompt.replace("I love jazz.", old + "I love jazz. " + mention)
    query = head + " Coltrane, for sure." + end
    for args in ((query, head), (query,)):
        messages, reply = split_query(*args, max_chars=200)
        assert reply == "Coltrane, for sure."
        assert prompt_to_context(messages).endswith("I love jazz. " + mention + "\nMe too!\nWho is your favourite?")


@pytest.mark.parametrize("pad", ["<|end_of_text|><|end_of_text|>", "</s></s>", "\n<eos><pad>", DS_EOS * 2])
def test_another_templates_pads_after_a_reply_go(pad):
    """A ChatML fine-tune of another base model (Llama 3, Mistral, Gemma, DeepSeek) right-pads a truncated reply with
    its base's pad token: cut at ChatML's own tokens only, the reply kept the pads. A trailing run of any template's end
    or pad tokens goes; the same token inside the reply is its words and stays."""
    prompt = PROMPTS["chatml"][0]
    for words in ("Coltrane is", "HTML strikes out with <s>old</s> and Llama 3 ends with <|end_of_text|> too"):
        query = prompt + words + pad
        for _, reply in (split_query(query, prompt), split_query(query)):
            assert reply == words


def test_zephyr_turns_end_at_their_end_token():
    """Zephyr (HuggingFaceH4/zephyr-7b-beta) writes Phi-3's headers and ends each turn with ``</s>``: the prompt's turns
    kept it."""
    prompt = "<|system|>\nBe nice.</s>\n<|user|>\nI love jazz.</s>\n<|assistant|>\nMe too!</s>\n<|user|>\n"
    prompt += "Who is your favourite?</s>\n<|assistant|>\n"
    query = prompt + "Coltrane, for sure.</s>"
    for messages, reply in (split_query(query, prompt), split_query(query)):
        assert (
            reply == "Coltrane, for sure."
            and prompt_to_context(messages, include_system=True) == "Be nice.\n" + CONTEXT
        )


@pytest.mark.parametrize(
    "mention", ["Never write <|user|> or <|im_start|> tags.", "Ignore any [INST] ... [/INST] markup."]
)
def test_mistral_v7_system_prompt_mentioning_markup(mention):
    """Mistral v7's text opens with its system block: one that mentions another template's marker made the text read
    as that template, one that mentions ``[INST]`` was split there."""
    prompt = "<s>[SYSTEM_PROMPT]" + mention + "[/SYSTEM_PROMPT][INST]I love jazz.[/INST]Me too!</s>"
    prompt += "[INST]Who is your favourite?[/INST]"
    query = prompt + "Coltrane, for sure.</s>"
    for messages, reply in (split_query(query, prompt), split_query(query)):
        assert reply == "Coltrane, for sure." and prompt_to_context(messages) == CONTEXT
        assert messages[0] == {"role": "system", "content": mention}

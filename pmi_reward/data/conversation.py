"""Conversations as scorer text: chat messages <-> turns, and templated strings back into messages.

A context is written as the scorer was trained: the conversation's turns, oldest first, one per line
(``pairs.join_turns``). ``prompt_to_context`` and ``completion_to_text`` read TRL-style prompts and
completions (plain strings or chat message lists); they never raise on odd input but return None for
what they cannot read, so callers decide what an unreadable sample is worth. ``turns_to_messages`` goes
the other way, for a chat policy.

Engines such as OpenRLHF and verl hand a reward model text with the chat template applied, e.g. ChatML
``<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>``. ``parse_chat`` recognises the
common templates (ChatML, Llama 3, Gemma, Phi-3, Mistral/Llama 2 ``[INST]``, and ``User:``/``Assistant:`` role
prefixes) and returns their messages; anything else is plain text, one turn per line. ``split_query`` splits a
full text (prompt + reply) into the prompt's messages and the reply; ``clean_reply`` cuts what the template or
padding appended to a reply.

Reasoning models write ``<think>...</think>`` before their answer; ``strip_think`` keeps the answer (the text
after the last ``</think>``, as Qwen3's and DeepSeek-R1's chat templates keep it in the history), and an
unterminated block leaves nothing. Templates that open the block in the generation prompt (Qwen3.5,
DeepSeek-R1 distills) are recognised by ``split_query``, which hands the opening tag back to the reply.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from .pairs import join_turns

__all__ = [
    "message_text",
    "prompt_to_context",
    "completion_to_text",
    "turns_to_messages",
    "parse_chat",
    "clean_reply",
    "split_query",
    "strip_think",
    "drop_think_blocks",
    "opens_think",
]

_SPEAKERS = ("user", "assistant")
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
_THINK_BLOCK = re.compile(r"<think>.*?(?:</think>|\Z)\s*", re.S)


def message_text(content: Any) -> str | None:
    """The text of a message's content: a string, or the text parts of a multimodal parts list."""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence) and not isinstance(content, (bytes, bytearray)):
        texts = [p.get("text") for p in content if isinstance(p, dict) and p.get("type", "text") == "text"]
        parts = [t for t in texts if isinstance(t, str)]
        return " ".join(parts) if parts else None
    return None


def prompt_to_context(prompt: Any, include_system: bool = False, max_turns: int | None = None) -> str | None:
    """Context text of a prompt: a string as is, or the user/assistant turns of a message list."""
    if isinstance(prompt, str):
        turns = [line for line in prompt.split("\n") if line.strip()]
    elif isinstance(prompt, Sequence) and not isinstance(prompt, (bytes, bytearray)):
        roles = _SPEAKERS + (("system",) if include_system else ())
        turns = []
        for m in prompt:
            if not isinstance(m, dict) or m.get("role") not in roles:
                continue
            text = message_text(m.get("content"))
            if text is not None and text.strip():
                turns.append(" ".join(text.split("\n")))
    else:
        return None
    if max_turns:
        turns = turns[-max_turns:]
    return join_turns(turns)


def completion_to_text(completion: Any) -> str | None:
    """The reply text of a completion: a string, or the assistant messages of a message list."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, Sequence) and not isinstance(completion, (bytes, bytearray)):
        texts = [
            message_text(m.get("content"))
            for m in completion
            if isinstance(m, dict) and m.get("role", "assistant") == "assistant"
        ]
        readable = [t for t in texts if t is not None]
        return " ".join(readable) if readable else None
    return None


def turns_to_messages(turns: Sequence[str] | str, system_prompt: str | None = None) -> list[dict]:
    """Chat messages of a conversation (turns oldest first, or one string with a turn per line) in which
    the newest turn is the user's, so a chat model replies as the next speaker."""
    if isinstance(turns, str):
        turns = [line for line in turns.split("\n") if line.strip()]
    n = len(turns)
    messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
    return messages + [
        {"role": "user" if (n - 1 - i) % 2 == 0 else "assistant", "content": t} for i, t in enumerate(turns)
    ]


Messages = list[dict[str, str]]

# (pattern of one turn with groups role and content, role renames); content runs to the end marker or the end
_TURNS: list[tuple[re.Pattern, dict[str, str]]] = [
    (re.compile(r"<\|im_start\|>(\w+)\n?(.*?)(?:<\|im_end\|>|(?=<\|im_start\|>)|\Z)", re.S), {}),
    (
        re.compile(
            r"<\|start_header_id\|>(\w+)<\|end_header_id\|>\n*(.*?)(?:<\|eot_id\|>|(?=<\|start_header_id\|>)|\Z)", re.S
        ),
        {},
    ),
    (re.compile(r"<start_of_turn>(\w+)\n?(.*?)(?:<end_of_turn>|(?=<start_of_turn>)|\Z)", re.S), {"model": "assistant"}),
    (
        re.compile(r"<\|(system|user|assistant)\|>\n?(.*?)(?:<\|end\|>|(?=<\|(?:system|user|assistant)\|>)|\Z)", re.S),
        {},
    ),
]
_INST = re.compile(r"\[INST\](.*?)\[/INST\](.*?)(?=\[INST\]|\Z)", re.S)
_SYS = re.compile(r"<<SYS>>(.*?)<</SYS>>", re.S)
_ROLE_LINE = re.compile(r"^(system|user|human|assistant|bot|ai)\s*:\s?(.*)$", re.I)
_ROLES = {"human": "user", "bot": "assistant", "ai": "assistant"}
# tokens that end a reply or pad a sequence: everything from the first one on is not part of the reply
_END = re.compile(
    r"<\|im_end\|>|<\|eot_id\|>|<end_of_turn>|<\|end\|>|<\|endoftext\|>|<\|end_of_text\|>|</s>|<eos>"
    r"|<\|im_start\|>|<\|start_header_id\|>|<start_of_turn>|\[INST\]|<pad>|<\|pad\|>|\[PAD\]"
)
_SPECIAL = re.compile(r"<\|begin_of_text\|>|<bos>|<s>|<\|endoftext\|>|<pad>|<\|pad\|>|\[PAD\]")


def clean_reply(text: str) -> str:
    """A reply without what the template or padding appended: cut at the first end-of-turn or pad token."""
    match = _END.search(text)
    return (text[: match.start()] if match else text).strip()


def strip_think(text: str, opened: bool = False) -> str:
    """The answer of a reasoning model's reply: the text after the last ``</think>``. A think block still open at
    the end (a ``<think>`` after the last ``</think>``, or, with ``opened`` (the prompt opened the block), no
    ``</think>`` at all) is unfinished reasoning: the answer is empty."""
    close = text.rfind(THINK_CLOSE)
    answer = text[close + len(THINK_CLOSE) :] if close >= 0 else text
    if THINK_OPEN in answer or (opened and close < 0):
        return ""
    return answer


def drop_think_blocks(text: str) -> str:
    """``text`` (turns one per line) without reasoning: ``<think>...</think>`` blocks go (an unterminated one runs
    to the end), a turn whose block was opened elsewhere keeps what follows its ``</think>``, and turns left
    empty go: how a context reads past turns of a reasoning model."""
    if THINK_OPEN not in text and THINK_CLOSE not in text:
        return text
    lines = (line.rsplit(THINK_CLOSE, 1)[-1] for line in _THINK_BLOCK.sub("", text).split("\n"))
    return "\n".join(line for line in lines if line.strip())


def opens_think(prompt: str) -> bool:
    """Whether a templated prompt ends inside an open think block (its generation prompt opened one)."""
    return prompt.rfind(THINK_OPEN) > prompt.rfind(THINK_CLOSE)


def _message(role: str, content: str, renames: dict[str, str]) -> dict[str, str]:
    role = role.lower()
    return {"role": renames.get(role, _ROLES.get(role, role)), "content": _SPECIAL.sub("", content).strip()}


def parse_chat(text: str) -> Messages | None:
    """The messages of a chat-templated string (generation prompts become empty assistant messages), or None
    when no known template or role prefix is found."""
    for pattern, renames in _TURNS:
        turns = pattern.findall(text)
        if turns:
            return [_message(role, content, renames) for role, content in turns]
    pairs = _INST.findall(text)
    if pairs:
        out: Messages = []
        for user, assistant in pairs:
            system = _SYS.search(user)
            if system:
                out.append(_message("system", system.group(1), {}))
                user = _SYS.sub("", user)
            out += [_message("user", user, {}), _message("assistant", clean_reply(assistant), {})]
        return out
    return _parse_role_lines(text)


def _parse_role_lines(text: str) -> Messages | None:
    """``User: ...`` / ``Assistant: ...`` transcripts (continuation lines join the turn above)."""
    out: Messages = []
    for line in _SPECIAL.sub("", text).split("\n"):
        match = _ROLE_LINE.match(line.strip())
        if match:
            out.append(_message(match.group(1), match.group(2), {}))
        elif out and line.strip():
            out[-1]["content"] = f"{out[-1]['content']} {line.strip()}".strip()
        elif line.strip():
            return None  # text before the first role prefix: not a transcript
    return out or None


def _as_messages(text: str) -> Messages:
    """Messages of a templated string; plain text becomes one user turn per line."""
    parsed = parse_chat(text)
    if parsed is not None:
        return parsed
    return [{"role": "user", "content": line.strip()} for line in text.split("\n") if line.strip()]


def split_query(query: str, prompt: str | None = None) -> tuple[Messages, str] | None:
    """(prompt messages, reply) of a full text. With ``prompt``: the reply is what follows the prompt in the
    query. Without it (or when the query does not contain it): the last assistant turn of a templated query,
    or the last line of plain text. None when no reply can be found."""
    if prompt:
        at = query.find(prompt)
        if at >= 0:
            reply = clean_reply(query[at + len(prompt) :])
            if opens_think(prompt):  # the template opened the reasoning: it belongs to the reply, not the context
                opened = prompt.rfind(THINK_OPEN)
                return _as_messages(prompt[:opened]), THINK_OPEN + reply
            return _as_messages(prompt), reply
    messages = parse_chat(query)
    if messages is not None:
        while messages and messages[-1]["role"] == "assistant" and not messages[-1]["content"]:
            messages.pop()
        if not messages or messages[-1]["role"] != "assistant":
            return None
        return messages[:-1], clean_reply(messages[-1]["content"])
    lines = [line for line in query.split("\n") if line.strip()]
    if not lines:
        return None
    return _as_messages("\n".join(lines[:-1])), clean_reply(lines[-1])

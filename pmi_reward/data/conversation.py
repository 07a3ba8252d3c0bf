"""Conversations as scorer text: chat messages <-> turns, and templated strings back into messages.

A context is written as the scorer was trained: the conversation's turns, oldest first, one per line
(``pairs.join_turns``). ``prompt_to_context`` and ``completion_to_text`` read TRL-style prompts and
completions (plain strings or chat message lists); they never raise on odd input but return None for
what they cannot read, so callers decide what an unreadable sample is worth. ``turns_to_messages`` goes
the other way, for a chat policy.

Engines such as OpenRLHF and verl hand a reward model text with the chat template applied, e.g. ChatML
``<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>``. ``parse_chat`` recognises the
common templates (ChatML and Phi-4's variant of it, Llama 3 and 4, Gemma, Granite, DeepSeek-V3 and the R1 distills,
Phi-3, GLM-4, Mistral/Llama 2 ``[INST]``, and ``User:``/``Assistant:`` role prefixes) and returns their messages;
anything else is plain text, one turn per line. ``split_query`` splits a full text (prompt + reply) into the
prompt's messages and the reply; ``clean_reply`` cuts what the template or padding appended to a reply.

Reasoning models write ``<think>...</think>`` before their answer; ``strip_think`` keeps the answer (the text
after the last ``</think>``, as Qwen3's and DeepSeek-R1's chat templates keep it in the history), and an
unterminated block leaves nothing. Templates that open the block in the generation prompt (Qwen3.5,
DeepSeek-R1 distills: the prompt ends with ``<think>``) are recognised by ``split_query``, which hands the opening
tag back to the reply; a ``<think>`` earlier in the prompt is a user's words.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from .pairs import join_turns

__all__ = [
    "DEFAULT_SYSTEM_PROMPT",
    "message_text",
    "prompt_to_context",
    "completion_to_text",
    "turns_to_messages",
    "parse_chat",
    "clean_reply",
    "split_query",
    "strip_think",
    "think_unfinished",
    "drop_assistant_think",
    "drop_think_blocks",
    "opens_think",
]

# the system message of the chat policies' prompts (and of the chat LM's PMI, which reads replies as the policy does)
DEFAULT_SYSTEM_PROMPT = "You are chatting with a friend. Reply in one or two short sentences."
_SPEAKERS = ("user", "assistant")
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
_THINK_BLOCK = re.compile(r"<think>.*?(?:</think>|\Z)\s*", re.S)
_CLOSED_THINK = re.compile(r"<think>(?:(?!<think>).)*?</think>[ \t]*\n?", re.S)  # a whole block, over lines too


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

# Marked templates, each as (turn header with the role as group 1, the header's bare marker, the end-of-turn marker,
# role renames, the role of text before the first header or None to drop it). A turn's content runs from its header to
# the end marker, the next marker or the end of the text. The strings are those of the models' own chat templates
# (``chat_template`` in their tokenizer_config.json):
# - ChatML (Qwen, SmolLM2): ``<|im_start|>user\n...<|im_end|>``; Phi-4 puts ``<|im_sep|>`` where ChatML has the
#   newline (microsoft/phi-4: ``'<|im_start|>user<|im_sep|>' + message['content'] + '<|im_end|>'``);
# - Llama 3 ``<|start_header_id|>user<|end_header_id|>\n\n...<|eot_id|>``; Llama 4 (meta-llama/Llama-4-Scout-17B-16E-
#   Instruct) ``<|header_start|>user<|header_end|>\n\n...<|eot|>``; Gemma ``<start_of_turn>user\n...<end_of_turn>``;
#   Granite 3 ``<|start_of_role|>user<|end_of_role|>...<|end_of_text|>``;
# - DeepSeek-V3 and the DeepSeek-R1 distills (deepseek-ai/DeepSeek-R1-Distill-Llama-8B: ``{{bos_token}}{{ns.system_
#   prompt}}``, ``'<｜User｜>' + message['content']``, ``'<｜Assistant｜>' + content + '<｜end▁of▁sentence｜>'``, the
#   generation prompt ``'<｜Assistant｜><think>\n'``): the system prompt bare between the BOS token and the first turn;
# - Phi-3 ``<|user|>\n...<|end|>``, and GLM-4 (THUDM/glm-4-9b-chat: ``[gMASK]<sop>``, then
#   ``<|{{ item['role'] }}|>{{ item['metadata'] }}\n{{ item['content'] }}`` with no end marker; a reply stops at its
#   stop tokens ``<|user|>``, ``<|observation|>`` or ``<|endoftext|>``; ``observation`` turns are tool output).
# DeepSeek's tokens are written with fullwidth vertical bars (U+FF5C) and lower one-eighth blocks (U+2581), not ASCII
_DS_BOS, _DS_EOS = "<\uff5cbegin\u2581of\u2581sentence\uff5c>", "<\uff5cend\u2581of\u2581sentence\uff5c>"
_DS_USER = "<\uff5cUser\uff5c>"
_MARKED: list[tuple[re.Pattern, str | None, str, dict[str, str], str | None]] = [
    (re.compile(r"<\|im_start\|>(\w+)(?:<\|im_sep\|>|\n)?"), "<|im_start|>", "<|im_end|>", {}, None),
    (re.compile(r"<\|start_header_id\|>(\w+)<\|end_header_id\|>\n*"), "<|start_header_id|>", "<|eot_id|>", {}, None),
    (re.compile(r"<\|header_start\|>(\w+)<\|header_end\|>\n*"), "<|header_start|>", "<|eot|>", {}, None),
    (re.compile(r"<start_of_turn>(\w+)\n?"), "<start_of_turn>", "<end_of_turn>", {"model": "assistant"}, None),
    (re.compile(r"<\|start_of_role\|>(\w+)<\|end_of_role\|>"), "<|start_of_role|>", "<|end_of_text|>", {}, None),
    (re.compile("<\uff5c(User|Assistant)\uff5c>"), None, _DS_EOS, {}, "system"),
    (re.compile(r"<\|(system|user|assistant|observation)\|>\n?"), None, "<|end|>", {}, None),
]
_ROLE_LINE = re.compile(r"^(system|user|human|assistant|bot|ai)\s*:\s?(.*)$", re.I)
_ROLES = {"human": "user", "bot": "assistant", "ai": "assistant"}
# tokens that end a reply or pad a sequence: everything from the first one on is not part of the reply (turn headers
# included: a reply ends where the next turn starts, and GLM-4's stop tokens are its user and observation headers)
_END = re.compile(
    r"<\|im_end\|>|<\|eot_id\|>|<\|eot\|>|<end_of_turn>|<\|end\|>|<\|endoftext\|>|<\|end_of_text\|>|</s>|<eos>"
    f"|{re.escape(_DS_EOS)}|{re.escape(_DS_USER)}"
    r"|<\|im_start\|>|<\|start_header_id\|>|<\|header_start\|>|<start_of_turn>|<\|start_of_role\|>|\[INST\]"
    r"|<\|user\|>|<\|observation\|>|<pad>|<\|pad\|>|\[PAD\]"
)
_SPECIAL = re.compile(
    r"<\|begin_of_text\|>|<bos>|<s>|<\|endoftext\|>|<pad>|<\|pad\|>|\[PAD\]|\[gMASK\]|<sop>"
    f"|{re.escape(_DS_BOS)}|{re.escape(_DS_EOS)}"  # DeepSeek pads with its end token: left padding before the turns
)


def clean_reply(text: str) -> str:
    """A reply without what the template or padding appended: cut at the first end-of-turn or pad token."""
    match = _END.search(text)
    return (text[: match.start()] if match else text).strip()


def think_unfinished(text: str, opened: bool = False) -> bool:
    """Whether a reasoning model's reply ends inside a think block: a ``<think>`` after the last ``</think>``, or,
    with ``opened`` (the prompt opened the block), no ``</think>`` at all."""
    close = text.rfind(THINK_CLOSE)
    return THINK_OPEN in text[close + len(THINK_CLOSE) :] if close >= 0 else THINK_OPEN in text or opened


def strip_think(text: str, opened: bool = False) -> str:
    """The answer of a reasoning model's reply: the text after the last ``</think>``; empty when the reply ends
    inside a think block (``think_unfinished``: unfinished reasoning)."""
    if think_unfinished(text, opened):
        return ""
    close = text.rfind(THINK_CLOSE)
    return text[close + len(THINK_CLOSE) :] if close >= 0 else text


def drop_think_blocks(text: str) -> str:
    """``text`` (turns one per line) without reasoning: ``<think>...</think>`` blocks go (an unterminated one runs
    to the end of its own turn, never into the next), a turn whose block was opened elsewhere keeps what follows its
    ``</think>``, and turns left empty go: how a context reads past turns of a reasoning model."""
    if THINK_OPEN not in text and THINK_CLOSE not in text:
        return text
    text = _CLOSED_THINK.sub("", text)  # closed blocks first, whatever lines they span
    lines = (_THINK_BLOCK.sub("", line).rsplit(THINK_CLOSE, 1)[-1] for line in text.split("\n"))
    return "\n".join(line for line in lines if line.strip())


def drop_assistant_think(prompt: Any) -> Any:
    """A message list whose assistant messages lost their reasoning (``drop_think_blocks``); users' words, a
    literal ``<think>`` in a question included, stay. Anything else (a string: no roles to tell) as it is."""
    if isinstance(prompt, (str, bytes, bytearray)) or not isinstance(prompt, Sequence):
        return prompt
    out = []
    for m in prompt:
        text = message_text(m.get("content")) if isinstance(m, dict) and m.get("role") == "assistant" else None
        out.append({**m, "content": drop_think_blocks(" ".join(text.split("\n")))} if text is not None else m)
    return out


def opens_think(prompt: str) -> bool:
    """Whether a templated prompt's generation prompt opened a think block: its last ``<think>`` is not closed and no
    end-of-turn or turn marker follows it (the templates that open one append it after the assistant's header, maybe
    with reasoning prefilled after it). A ``<think>`` in an earlier turn is a user's words ("What is the <think> tag
    for?"): taking it for the open block cut the context there and emptied every reply."""
    opened = prompt.rfind(THINK_OPEN)
    return opened > prompt.rfind(THINK_CLOSE) and _END.search(prompt, opened) is None


def _message(role: str, content: str, renames: dict[str, str]) -> dict[str, str]:
    role = role.lower()
    return {"role": renames.get(role, _ROLES.get(role, role)), "content": _SPECIAL.sub("", content).strip()}


def parse_chat(text: str, partial: bool = False) -> Messages | None:
    """The messages of a chat-templated string (generation prompts become empty assistant messages), or None
    when no known template or role prefix is found. ``partial``: ``text`` is the end of a longer one, so what
    comes before its first turn marker is the end of a turn whose start was cut off (a user turn, when its role is
    not known).

    Linear in the length of ``text``: markers are found with ``str.find`` and regexes that cannot backtrack
    across turns (a backtracking pattern took minutes on ``"[INST]" * 32000``)."""
    for header, bare, end, renames, lead in _MARKED:
        turns = _marked_turns(text, header, bare, end, renames, partial, lead)
        if turns:
            return turns
    return _inst_turns(text, partial) or _parse_role_lines(text, partial)


def _marked_turns(
    text: str,
    header: re.Pattern,
    bare: str | None,
    end: str,
    renames: dict[str, str],
    partial: bool = False,
    lead_role: str | None = None,
) -> Messages:
    """The turns of one marked template: each header's content, up to the end marker or the next marker. Text before
    the first header is the end of a cut-off turn with ``partial``; else a ``lead_role`` message (DeepSeek's bare
    system prompt) or nothing."""
    heads = list(header.finditer(text))
    out = []
    if partial and heads and text[: heads[0].start()].strip():
        lead = text[: heads[0].start()]
        if (at := lead.find(end)) >= 0:
            lead = lead[:at]
        out.append(_message("user", lead, renames))
    elif lead_role and heads and (first := _message(lead_role, text[: heads[0].start()], renames))["content"]:
        out.append(first)
    for i, head in enumerate(heads):
        stop = heads[i + 1].start() if i + 1 < len(heads) else len(text)
        if bare is not None and (at := text.find(bare, head.end(), stop)) >= 0:
            stop = at
        if (at := text.find(end, head.end(), stop)) >= 0:
            stop = at
        out.append(_message(head.group(1), text[head.end() : stop], renames))
    return out


def _inst_turns(text: str, partial: bool = False) -> Messages | None:
    """Mistral / Llama 2: ``[INST] user [/INST] assistant`` pairs, the system prompt in ``<<SYS>>`` ... ``<</SYS>>``."""
    out: Messages = []
    parts = text.split("[INST]")
    if partial and len(parts) > 1 and parts[0].strip():  # the end of a user turn and its reply, or of a reply
        head, _, tail = parts[0].rpartition("[/INST]")
        if head.strip():
            out.append(_message("user", head, {}))
        out.append(_message("assistant", clean_reply(tail), {}))
    for part in parts[1:]:
        close = part.find("[/INST]")
        if close < 0:
            continue
        user, assistant = part[:close], part[close + len("[/INST]") :]
        start = user.find("<<SYS>>")
        stop = user.find("<</SYS>>", start + len("<<SYS>>")) if start >= 0 else -1
        if stop >= 0:
            out.append(_message("system", user[start + len("<<SYS>>") : stop], {}))
            user = user[:start] + user[stop + len("<</SYS>>") :]
        out += [_message("user", user, {}), _message("assistant", clean_reply(assistant), {})]
    return out or None


def _parse_role_lines(text: str, partial: bool = False) -> Messages | None:
    """``User: ...`` / ``Assistant: ...`` transcripts (continuation lines join the turn above). Linear: a turn's
    lines are collected and joined once. Text before the first role prefix means plain text (None), unless
    ``partial``: then it is the end of a turn."""
    turns: list[tuple[str, list[str]]] = [("user", [])] if partial else []
    for line in _SPECIAL.sub("", text).split("\n"):
        line = line.strip()
        match = _ROLE_LINE.match(line)
        if match:
            turns.append((match.group(1), [match.group(2)]))
        elif turns and line:
            turns[-1][1].append(line)
        elif line:
            return None  # text before the first role prefix: not a transcript
    if partial:  # a transcript only if some line has a role prefix
        lead, turns = turns[0], turns[1:]
        if turns and lead[1]:
            turns.insert(0, lead)
    return [_message(role, " ".join(parts), {}) for role, parts in turns] or None


def _as_messages(text: str, partial: bool = False) -> Messages:
    """Messages of a templated string; plain text becomes one user turn per line."""
    parsed = parse_chat(text, partial)
    if parsed is not None:
        return parsed
    return [{"role": "user", "content": line.strip()} for line in text.split("\n") if line.strip()]


def split_query(query: str, prompt: str | None = None, max_chars: int | None = None) -> tuple[Messages, str] | None:
    """(prompt messages, reply) of a full text. With ``prompt``: the reply is what follows the prompt in the
    query. Without it (or when the query does not contain it): the last assistant turn of a templated query,
    or the last line of plain text. None when no reply can be found.

    ``max_chars`` (a reward's ``max_chars``: it reads a context's last and a reply's first ``max_chars``) cuts the
    text before it is parsed, leaving room for the template's markers: with a prompt, the prompt's last and the
    reply's first ``2 * max_chars`` characters; without one, the query's lines that start in its last
    ``4 * max_chars`` characters (None when there are none: the reply's start is out of reach). A longer query
    can then read differently from the whole one only in its oldest turns."""
    window, full = (None if max_chars is None else 2 * max_chars), len(query)
    if prompt:
        at = query.find(prompt)
        if at >= 0:
            reply = query[at + len(prompt) :]
            reply = clean_reply(reply if window is None else reply[:window])
            head, partial = (prompt, False) if window is None or len(prompt) <= window else (prompt[-window:], True)
            if opens_think(prompt):  # the template opened the reasoning: it belongs to the reply, not the context
                opened = head.rfind(THINK_OPEN)
                return _as_messages(head[:opened] if opened >= 0 else head, partial=partial), THINK_OPEN + reply
            return _as_messages(head, partial=partial), reply
    if window is not None and len(query) > 2 * window:
        cut = query.find("\n", len(query) - 2 * window)
        if cut < 0:
            return None
        query = query[cut + 1 :]
    messages = parse_chat(query, partial=window is not None and len(query) < full)
    if messages is not None:
        # empty turns at the end: a stop token that is a turn header (GLM-4's <|user|>) after the reply, then a
        # generation prompt (an empty reply: never the assistant turn before it)
        while messages and not messages[-1]["content"] and messages[-1]["role"] != "assistant":
            messages.pop()
        while messages and messages[-1]["role"] == "assistant" and not messages[-1]["content"]:
            messages.pop()
        if not messages or messages[-1]["role"] != "assistant":
            return None
        return messages[:-1], clean_reply(messages[-1]["content"])
    lines = [line for line in query.split("\n") if line.strip()]
    if not lines:
        return None
    return _as_messages("\n".join(lines[:-1])), clean_reply(lines[-1])

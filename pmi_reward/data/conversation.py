"""Conversations as scorer text: chat messages <-> turns, and templated strings back into messages.

A context is written as the scorer was trained: the conversation's turns, oldest first, one per line
(``pairs.join_turns``). ``prompt_to_context`` and ``completion_to_text`` read TRL-style prompts and
completions (plain strings or chat message lists); they never raise on odd input but return None for
what they cannot read, so callers decide what an unreadable sample is worth. ``turns_to_messages`` goes
the other way, for a chat policy.

Engines such as OpenRLHF and verl hand a reward model text with the chat template applied, e.g. ChatML
``<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>``. ``parse_chat`` recognises the
common templates (ChatML and Phi-4's variant of it, Llama 3 and 4, Gemma, Granite, DeepSeek-V3 and the R1 distills,
Phi-3, GLM-4, Mistral/Llama 2 ``[INST]`` with Mistral v7's ``[SYSTEM_PROMPT]`` blocks, and ``User:``/``Assistant:``
role prefixes) and returns their messages; anything else is plain text, one turn per line. The template is the one
whose turn marker comes first (in a text cut at its start, inside a turn of any words: the one with the most markers);
``[SYSTEM_PROMPT]`` is markup only in text that opens with such a block. ``split_query`` splits a full text (prompt +
reply) into the prompt's messages and the reply, cut at the first end-of-turn, turn-header or padding token of that
template (another template's token in a reply is its words), less a trailing run of any template's end or padding
tokens (a fine-tune padding with its base model's token); ``clean_reply`` cuts a reply alone at any template's tokens.
Gemma 3 and Mistral's templates before v7 write the system prompt into a user turn (joined by a blank line, which a
user's message may hold too): it stays there.

Reasoning models write ``<think>...</think>`` before their answer; ``strip_think`` keeps the answer (the text
after the last ``</think>``, as Qwen3's and DeepSeek-R1's chat templates keep it in the history), and an
unterminated block leaves nothing. Templates that open the block in the generation prompt (Qwen3.5,
DeepSeek-R1 distills: the prompt ends with ``<think>``), and a plain prompt that ends with one (R1-Zero's "... User: q
Assistant: <think>"), are recognised by ``split_query``, which hands the opening tag back to the reply, and by
``templated_prompt`` and ``rewards.path.read_prompt``, which read a reward's prompt string, alike
(``prompt_opens_think``); a ``<think>`` earlier in the prompt is a user's words. ``templated_prompt`` reads a string as
its template's messages only when that template's markup opens it: a plain text that quotes a marker further on
(a question about ChatML's ``<|im_start|>``) is one turn per line.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any, NamedTuple

from .dialogues import speaker, speaker_turns
from .pairs import join_turns

__all__ = [
    "CHAT_TEMPLATE_KWARGS",
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
    "prompt_opens_think",
    "templated_prompt",
]

# Keywords every chat prompt this package renders is given (sampling, PPO's rollouts, the KL, the checks of
# fit_prompts, the cut replies' prompts; TRL's GRPO/RLOO/SFT/DPO through their chat_template_kwargs). The Llama
# 3.1-3.3 templates write "Today Date: <strftime_now>" into the system header: unpinned, the same seed and settings
# sampled other replies on another day (and a run past midnight measured its KL on other prompts than it sampled).
# The date is those templates' own fallback; templates that write no date (SmolLM2, Qwen, ChatML) ignore it.
CHAT_TEMPLATE_KWARGS: Mapping[str, Any] = MappingProxyType({"date_string": "26 Jul 2024"})

# the system message of the chat policies' prompts (and of the chat LM's PMI, which reads replies as the policy does)
DEFAULT_SYSTEM_PROMPT = "You are chatting with a friend. Reply in one or two short sentences."
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
_THINK_BLOCK = re.compile(r"<think>.*?(?:</think>|\Z)\s*", re.S)
# a whole block over lines too, but only one opened at the start of a line, where a reasoning turn starts: a <think>
# inside a line is a user's words ("How do I use the <think> tag?"), and read as a block it ran to a later turn's
# literal </think>, deleting the turns between
_CLOSED_THINK = re.compile(r"^[ \t]*<think>(?:(?!\n[ \t]*<think>).)*?</think>[ \t]*\n?", re.S | re.M)


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
    """Context text of a prompt: a string as is, or the turns of a message list as training reads a chat
    (``dialogues.speaker_turns``: consecutive messages of one speaker are one turn, the speakers' alias roles
    are theirs; a plain string is a turn of no known speaker). System messages are turns of their own with
    ``include_system``, else skipped; other roles are skipped."""
    if isinstance(prompt, str):
        turns = [line for line in prompt.split("\n") if line.strip()]
    elif isinstance(prompt, Sequence) and not isinstance(prompt, (bytes, bytearray)):
        said: list[tuple[str | None, str]] = []
        for m in prompt:
            if isinstance(m, str):
                said.append((None, m))
            elif isinstance(m, dict) and (text := message_text(m.get("content"))) is not None:
                role = str(m.get("role", "user")).strip().lower()
                if (who := speaker(role)) is not None or (include_system and role in ("system", "developer")):
                    said.append((who, text))
        turns = speaker_turns(said)
    else:
        return None
    if max_turns:
        turns = turns[-max_turns:]
    return join_turns(turns)


def completion_to_text(completion: Any) -> str | None:
    """The reply text of a completion: a string, or the assistant messages of a message list (a message with no
    role is the assistant's; the roles are read as in a prompt, ``dialogues.speaker``: any case and the aliases
    ``model``, ``gpt``, ``bot``, ``ai``, so a Gemma- or ShareGPT-style completion is not read as an empty one)."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, Sequence) and not isinstance(completion, (bytes, bytearray)):
        texts = [
            message_text(m.get("content"))
            for m in completion
            if isinstance(m, dict) and speaker(m.get("role", "assistant")) == "assistant"
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


# chat messages; a plain string is a turn of no known speaker, as in a messages file (plain text's lines, the end of
# a cut-off turn): read as a turn of its own (``prompt_to_context``), never joined with a speaker's turn beside it
Messages = list[dict[str, str] | str]

# The templates' markup, as the models' own chat templates (``chat_template`` in their tokenizer_config.json) write it:
# - ChatML (Qwen, SmolLM2): ``<|im_start|>user\n...<|im_end|>``; Phi-4 puts ``<|im_sep|>`` where ChatML has the
#   newline (microsoft/phi-4: ``'<|im_start|>user<|im_sep|>' + message['content'] + '<|im_end|>'``);
# - Llama 3 ``<|start_header_id|>user<|end_header_id|>\n\n...<|eot_id|>``; Llama 4 (meta-llama/Llama-4-Scout-17B-16E-
#   Instruct) ``<|header_start|>user<|header_end|>\n\n...<|eot|>``; Gemma ``<start_of_turn>user\n...<end_of_turn>``;
#   Granite 3 ``<|start_of_role|>user<|end_of_role|>...<|end_of_text|>``;
# - DeepSeek-V3 and the DeepSeek-R1 distills (deepseek-ai/DeepSeek-R1-Distill-Llama-8B: ``{{bos_token}}{{ns.system_
#   prompt}}``, ``'<｜User｜>' + message['content']``, ``'<｜Assistant｜>' + content + '<｜end▁of▁sentence｜>'``, the
#   generation prompt ``'<｜Assistant｜><think>\n'``): the system prompt bare between the BOS token and the first turn;
# - Phi-3 ``<|user|>\n...<|end|>``, Zephyr ``<|user|>\n...</s>``, and GLM-4 (THUDM/glm-4-9b-chat: ``[gMASK]<sop>``,
#   then ``<|{{ item['role'] }}|>{{ item['metadata'] }}\n{{ item['content'] }}`` with no end marker; a reply stops at
#   its stop tokens ``<|user|>``, ``<|observation|>`` or ``<|endoftext|>``; ``observation`` turns are tool output);
# - Mistral / Llama 2 ``[INST] user [/INST] assistant</s>``, Llama 2's system prompt in ``<<SYS>>`` ... ``<</SYS>>``;
#   Mistral's v7 / Tekken templates (mistralai/Mistral-Small-24B-Instruct-2501, Mistral Small 3.1) write a system
#   message as its own block before or between the turns, ``'[SYSTEM_PROMPT]' + content + '[/SYSTEM_PROMPT]'``. The
#   older Mistral templates prepend it to a user message with a blank line, as Gemma 3 does: that is not split
#   (nothing marks where it ends, and a user's message may hold a blank line too).
# DeepSeek's tokens are written with fullwidth vertical bars (U+FF5C) and lower one-eighth blocks (U+2581), not ASCII
_DS_BOS, _DS_EOS = "<\uff5cbegin\u2581of\u2581sentence\uff5c>", "<\uff5cend\u2581of\u2581sentence\uff5c>"
_DS_USER = "<\uff5cUser\uff5c>"
_INST, _INST_CLOSE = "[INST]", "[/INST]"
_SYS_OPEN, _SYS_CLOSE = "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]"
_PADS = ("<pad>", "<|pad|>", "[PAD]")  # padding whatever the template: cut and dropped everywhere
# each template's (end-of-turn and end-of-text tokens, turn-header tokens that end a reply, tokens dropped from a
# turn's text); "mistral_v7" is Mistral's [INST] template in text that opens with a [SYSTEM_PROMPT] block (_v7_start)
_TEMPLATE_TOKENS: dict[str, tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]] = {
    "chatml": (("<|im_end|>", "<|endoftext|>"), ("<|im_start|>",), ("<|endoftext|>",)),  # Qwen pads with <|endoftext|>
    # Llama 3.1 and 4 right-pad fine-tuning batches with <|finetune_right_pad_id|> / <|finetune_right_pad|>
    "llama3": (
        ("<|eot_id|>", "<|end_of_text|>", "<|finetune_right_pad_id|>"),
        ("<|start_header_id|>",),
        ("<|begin_of_text|>",),
    ),
    "llama4": (("<|eot|>", "<|end_of_text|>", "<|finetune_right_pad|>"), ("<|header_start|>",), ("<|begin_of_text|>",)),
    "gemma": (("<end_of_turn>", "<eos>"), ("<start_of_turn>",), ("<bos>",)),
    "granite": (("<|end_of_text|>",), ("<|start_of_role|>",), ()),
    "deepseek": ((_DS_EOS,), (_DS_USER,), (_DS_BOS, _DS_EOS)),  # DeepSeek pads with its end token
    # Phi-3, Zephyr and GLM-4 share the headers (GLM-4's stop tokens are its user and observation headers)
    "phi3": (
        ("<|end|>", "</s>", "<|endoftext|>"),
        ("<|user|>", "<|observation|>"),
        ("<s>", "<|endoftext|>", "[gMASK]", "<sop>"),
    ),
    "inst": (("</s>",), (_INST,), ("<s>",)),
    "mistral_v7": (("</s>",), (_INST, _SYS_OPEN), ("<s>",)),
}


class _Tokens(NamedTuple):
    """A template's tokens. ``cut``: what ends a reply, everything from the first one on being no part of it (the
    end-of-turn, end-of-text and padding tokens, and the turn headers: a reply ends where the next turn starts).
    ``special``: what is dropped from a turn's text (BOS, padding). ``ends``: where a turn's content stops. A template's
    own tokens only: a reply under one template may hold another's literally ("Phi-3 writes <|user|> before a turn",
    HTML's ``<s>...</s>``); only text of no known template is cut at every template's tokens."""

    cut: re.Pattern
    special: re.Pattern
    ends: tuple[str, ...]


def _tokens(ends: Sequence[str], headers: Sequence[str], special: Sequence[str]) -> _Tokens:
    def pattern(tokens: Sequence[str]) -> re.Pattern:
        return re.compile("|".join(re.escape(t) for t in dict.fromkeys((*tokens, *_PADS))))

    return _Tokens(pattern((*ends, *headers)), pattern(special), tuple(ends))


_TOKENS = {name: _tokens(*tokens) for name, tokens in _TEMPLATE_TOKENS.items()}
# text of no known template (plain text, ``User:`` transcripts, a verl completion on its own): every template's end,
# header and special tokens, but for v7's [SYSTEM_PROMPT], markup only in v7's text (elsewhere a reply's words about it)
_KNOWN = [tokens for name, tokens in _TEMPLATE_TOKENS.items() if name != "mistral_v7"]
_ANY = _tokens(*(tuple(t for tokens in same_kind for t in tokens) for same_kind in zip(*_KNOWN, strict=True)))
# what a right-padded reply may end with, whatever its template (a ChatML fine-tune of Llama 3 pads with Llama's
# <|end_of_text|>, of Mistral with </s>): stripped from the end of a reply once it is cut at its template's tokens
_TRAILING = tuple(dict.fromkeys((*(t for ends, _, _ in _TEMPLATE_TOKENS.values() for t in ends), *_PADS)))
# what may come before a text's first turn: BOS, and left padding (end tokens, where the pad token is the EOS)
_FILLER = re.compile("|".join(map(re.escape, (*_TRAILING, *(t for _, _, sp in _TEMPLATE_TOKENS.values() for t in sp)))))


class _Marked(NamedTuple):
    """A template whose every turn opens with a header naming the role (group 1 of ``header``). A turn's content runs
    from its header to the template's first end token, the next header, the header's ``bare`` marker (a header whose
    role is garbled) or the end of the text. ``lead_role``: the role of text before the first header (DeepSeek's bare
    system prompt), or None to drop it."""

    header: re.Pattern
    bare: str | None
    renames: dict[str, str]
    lead_role: str | None


_MARKED = {
    "chatml": _Marked(re.compile(r"<\|im_start\|>(\w+)(?:<\|im_sep\|>|\n)?"), "<|im_start|>", {}, None),
    "llama3": _Marked(re.compile(r"<\|start_header_id\|>(\w+)<\|end_header_id\|>\n*"), "<|start_header_id|>", {}, None),
    "llama4": _Marked(re.compile(r"<\|header_start\|>(\w+)<\|header_end\|>\n*"), "<|header_start|>", {}, None),
    "gemma": _Marked(re.compile(r"<start_of_turn>(\w+)\n?"), "<start_of_turn>", {"model": "assistant"}, None),
    "granite": _Marked(re.compile(r"<\|start_of_role\|>(\w+)<\|end_of_role\|>"), "<|start_of_role|>", {}, None),
    "deepseek": _Marked(re.compile("<\uff5c(User|Assistant)\uff5c>"), None, {}, "system"),
    "phi3": _Marked(re.compile(r"<\|(system|user|assistant|observation)\|>\n?"), None, {}, None),
}
# a role prefix, its colon ASCII or full-width (a CJK input method's default: ``User：...``)
_ROLE_LINE = re.compile(r"^(system|user|human|assistant|bot|ai)\s*[:\uff1a]\s?(.*)$", re.I)
_ROLES = {"human": "user", "bot": "assistant", "ai": "assistant"}


def clean_reply(text: str) -> str:
    """A reply without what the template or padding appended: cut at the first end-of-turn or pad token of any
    template (the template is not known from a reply alone; ``split_query`` cuts at its template's own tokens)."""
    return _cut(text, _ANY)


def _cut(text: str, tokens: _Tokens) -> str:
    """``text`` up to the first of ``tokens.cut``, less a trailing run of any template's end or padding tokens (a
    fine-tune padding with its base's token); such a token inside the reply is its words and stays."""
    match = tokens.cut.search(text)
    stop = match.start() if match else len(text)
    while True:  # by index: linear in a long run of pads
        while stop and text[stop - 1].isspace():
            stop -= 1
        end = next((t for t in _TRAILING if text.endswith(t, 0, stop)), None)
        if end is None:
            return text[:stop].strip()
        stop -= len(end)


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
    """``text`` (turns one per line) without reasoning: ``<think>...</think>`` blocks go, and turns left empty go: how
    a context reads past turns of a reasoning model. A block opened at the start of a line (a reasoning trace) goes
    whole to its ``</think>``, over lines too; one opened inside a line (a user's literal tag) ends with its line at
    most, as does an unterminated one (never running into the next turn); a turn whose block was opened elsewhere
    keeps what follows its ``</think>``."""
    if THINK_OPEN not in text and THINK_CLOSE not in text:
        return text
    text = _CLOSED_THINK.sub("", text)  # reasoning traces first, whatever lines they span
    lines = (_THINK_BLOCK.sub("", line).rsplit(THINK_CLOSE, 1)[-1] for line in text.split("\n"))
    return "\n".join(line for line in lines if line.strip())


def drop_assistant_think(prompt: Any) -> Any:
    """A message list whose assistant messages lost their reasoning (``drop_think_blocks``); users' words, a
    literal ``<think>`` in a question included, stay. Anything else (a string: no roles to tell) as it is."""
    if isinstance(prompt, (str, bytes, bytearray)) or not isinstance(prompt, Sequence):
        return prompt
    out = []
    for m in prompt:
        mine = isinstance(m, dict) and speaker(m.get("role", "user")) == "assistant"  # alias roles too, as read
        text = message_text(m.get("content")) if mine else None
        out.append({**m, "content": drop_think_blocks(" ".join(text.split("\n")))} if text is not None else m)
    return out


def opens_think(prompt: str) -> bool:
    """Whether a templated prompt's generation prompt opened a think block: its last ``<think>`` is not closed and no
    end-of-turn or turn marker follows it (the templates that open one append it after the assistant's header, maybe
    with reasoning prefilled after it). A ``<think>`` in an earlier turn is a user's words ("What is the <think> tag
    for?"): taking it for the open block cut the context there and emptied every reply."""
    opened = prompt.rfind(THINK_OPEN)
    return opened > prompt.rfind(THINK_CLOSE) and _ANY.cut.search(prompt, opened) is None


def prompt_opens_think(prompt: str) -> bool:
    """Whether a prompt string opened its reply's think block, the one rule of every reward path (``templated_prompt``,
    ``rewards.path.read_prompt``, ``split_query``): its last ``<think>`` is open (``opens_think``) and either ends the
    prompt (an R1-Zero style plain prompt, "... User: q Assistant: <think>", as much as a chat template's generation
    prompt) or is in a string a chat template opens (``_opening_template``: reasoning may be prefilled after it). In a
    plain string, a ``<think>`` with words after it is a user's ("How do I use the <think> tag?")."""
    if not opens_think(prompt):
        return False
    return prompt.rstrip().endswith(THINK_OPEN) or _opening_template(prompt) is not None


def templated_prompt(prompt: str) -> tuple[Messages, bool] | None:
    """A prompt string written with a known chat template (``apply_chat_template(..., tokenize=False,
    add_generation_prompt=True)``, as R1-style "standard" GRPO datasets build their ``prompt`` column) as its
    messages (``parse_chat``: the context the same conversation given as messages reads as), and whether its generation
    prompt opened a think block (``prompt_opens_think``): that block belongs to the reply, so the text from its
    ``<think>`` on is left out, as ``split_query`` leaves it. The template's markup must open the string (after BOS or
    padding: ``_opening_template``) and read as that template's turns. None for any other string: plain text (one turn
    per line, a ``User:``/``Assistant:`` transcript included, whose prefixes may be a text's own words, and a text
    that quotes a template's marker after words of its own, which read as a template lost those words) is read as it
    always was."""
    name = _opening_template(prompt)
    if name is None:
        return None
    opened = prompt_opens_think(prompt)
    parsed = _parse_chat(prompt[: prompt.rfind(THINK_OPEN)] if opened else prompt)
    return (parsed[0], opened) if parsed is not None and parsed[1] is _TOKENS[name] else None


def _message(role: str, content: str, renames: dict[str, str], tokens: _Tokens = _ANY) -> dict[str, str]:
    role = role.lower()
    return {"role": renames.get(role, _ROLES.get(role, role)), "content": tokens.special.sub("", content).strip()}


def _unknown(content: str, tokens: _Tokens = _ANY) -> str:
    """A turn of no known speaker (the end of a cut-off turn): a plain string, as a messages file writes one."""
    return tokens.special.sub("", content).strip()


def parse_chat(text: str, partial: bool = False) -> Messages | None:
    """The messages of a chat-templated string (generation prompts become empty assistant messages), or None
    when no known template or role prefix is found. ``partial``: ``text`` is the end of a longer one, so what
    comes before its first turn marker is the end of a turn whose start was cut off (a plain string: its speaker is
    not known).

    Linear in the length of ``text``: markers are found with ``str.find`` and regexes that cannot backtrack
    across turns (a backtracking pattern took minutes on ``"[INST]" * 32000``)."""
    parsed = _parse_chat(text, partial)
    return parsed[0] if parsed is not None else None


def _parse_chat(text: str, partial: bool = False) -> tuple[Messages, _Tokens] | None:
    """``parse_chat``'s messages and the tokens of the template they were read with (``_ANY`` for transcripts)."""
    for name in _templates(text, partial):
        if name in _MARKED:  # a header found: at least one turn
            return _marked_turns(text, _MARKED[name], _TOKENS[name], partial), _TOKENS[name]
        if turns := _inst_turns(text, partial, v7=name == "mistral_v7"):
            return turns, _TOKENS[name]
    turns = _parse_role_lines(text, partial)
    return (turns, _ANY) if turns else None


def _templates(text: str, partial: bool) -> list[str]:
    """The templates whose markers ``text`` holds, most likely first. A whole text opens with its template's markup
    (after a BOS token or padding; DeepSeek's BOS before its bare system prompt): the template whose first marker comes
    first, another's further on being a turn's words (a reply about ChatML's ``<|im_start|>`` in a Llama 3 or Mistral
    conversation, a system prompt about Phi-3's ``<|user|>``). A ``partial`` text opens inside a turn whose words may be
    anything: the template with the most markers (turn headers and end tokens), ties to the first."""
    return [name for name, _ in _ranked_templates(text, partial)]


def _ranked_templates(text: str, partial: bool) -> list[tuple[str, int]]:
    """``_templates``' names, each with where its markup starts in ``text`` (its first marker; DeepSeek's BOS token
    before it; Mistral v7's opening ``[SYSTEM_PROMPT]``)."""
    found: list[tuple[int, int, str]] = []  # (-markers counted, first marker, name)
    for name, marked in _MARKED.items():
        if (first := marked.header.search(text)) is None:
            continue
        at = first.start()
        if name == "deepseek" and (bos := text.find(_DS_BOS, 0, at)) >= 0:
            at = bos
        found.append((-_markers(text, name, len(marked.header.findall(text))) if partial else 0, at, name))
    if (inst := text.find(_INST)) >= 0:
        v7 = _v7_start(text, partial, inst)
        name, at, markers = (
            ("mistral_v7", v7, (_INST, _INST_CLOSE, _SYS_OPEN)) if v7 >= 0 else ("inst", inst, (_INST, _INST_CLOSE))
        )
        found.append((-_markers(text, name, sum(map(text.count, markers))) if partial else 0, at, name))
    return [(name, at) for _, at, name in sorted(found)]


# what else may open a templated text before its first marker: a UTF-8 BOM (a table's first cell), Yi's BOS, and
# ChatGLM3's "[gMASK]sop" (its "sop" bare, where GLM-4 writes "<sop>")
_PREAMBLE = re.compile(r"\ufeff|<\|startoftext\|>|\[gMASK\]sop")


def _opening_template(text: str) -> str | None:
    """The template whose markup opens a whole ``text`` (BOS and padding before it at most: ``_FILLER``), or None. A
    text whose first marker comes after other words is plain text that quotes one ("Phi-3 marks a user turn with
    <|user|>"). DeepSeek's is the exception: its bare system prompt comes before its first ``<｜User｜>`` (its BOS token
    may be left out), and its fullwidth-barred tokens are no text's words."""
    ranked = _ranked_templates(text, False)
    if not ranked:
        return None
    name, at = ranked[0]
    before = _FILLER.sub("", _PREAMBLE.sub("", text[:at]))
    return name if name == "deepseek" or not before.strip() else None


def _markers(text: str, name: str, headers: int) -> int:
    """``headers`` and the number of template ``name``'s end tokens in ``text``: its markers in a cut text."""
    return headers + sum(map(text.count, _TOKENS[name].ends))


def _v7_start(text: str, partial: bool, inst: int) -> int:
    """Where Mistral v7's markup starts in ``text`` whose first ``[INST]`` is at ``inst``, or -1: at a
    ``[SYSTEM_PROMPT]`` that opens the text (BOS and padding before it at most; a system prompt may mention
    ``[INST]``), or, ``partial``, at 0 when the text's first v7 token is a ``[/SYSTEM_PROMPT]`` before any ``[INST]``
    or ``[/INST]`` (a cut-off system prompt). Elsewhere ``[SYSTEM_PROMPT]`` is a turn's words (a Llama 2 or Mistral
    v3 reply about v7's markup), and no token to cut a reply at."""
    opened = text.find(_SYS_OPEN, 0, inst)
    if opened >= 0 and not _FILLER.sub("", text[:opened]).strip():
        return opened
    close = text.find(_SYS_CLOSE, 0, inst)
    if partial and close >= 0 and not 0 <= opened < close and text.find(_INST_CLOSE, 0, close) < 0:
        return 0
    return -1


def _first(text: str, tokens: Sequence[str], start: int, stop: int) -> int:
    """Where the first of ``tokens`` is in ``text[start:stop]``, or ``stop``."""
    return min((at for t in tokens if (at := text.find(t, start, stop)) >= 0), default=stop)


def _marked_turns(text: str, marked: _Marked, tokens: _Tokens, partial: bool) -> Messages:
    """The turns of one marked template: each header's content, up to the end token or the next marker. Text before
    the first header is the end of a cut-off turn with ``partial``; else a ``lead_role`` message (DeepSeek's bare
    system prompt) or nothing."""
    renames = marked.renames
    heads = list(marked.header.finditer(text))
    out: Messages = []
    if partial and heads and text[: heads[0].start()].strip():
        lead = text[: _first(text, tokens.ends, 0, heads[0].start())]
        out.append(_unknown(lead, tokens))
    elif (
        marked.lead_role
        and heads
        and (lead_turn := _message(marked.lead_role, text[: heads[0].start()], renames, tokens))["content"]
    ):
        out.append(lead_turn)
    for i, head in enumerate(heads):
        stop = heads[i + 1].start() if i + 1 < len(heads) else len(text)
        if marked.bare is not None and (at := text.find(marked.bare, head.end(), stop)) >= 0:
            stop = at
        stop = _first(text, tokens.ends, head.end(), stop)
        out.append(_message(head.group(1), text[head.end() : stop], renames, tokens))
    return out


def _inst_turns(text: str, partial: bool, v7: bool) -> Messages | None:
    """Mistral / Llama 2: ``[INST] user [/INST] assistant`` pairs, the system prompt in ``<<SYS>>`` ... ``<</SYS>>``
    (Llama 2) or, ``v7``, in ``[SYSTEM_PROMPT]`` ... ``[/SYSTEM_PROMPT]`` blocks before or between the pairs."""
    tokens = _TOKENS["mistral_v7" if v7 else "inst"]
    begin, out = _leading_systems(text, partial, tokens) if v7 else (0, [])
    parts = text[begin:].split(_INST)
    if partial and len(parts) > 1 and tokens.special.sub("", parts[0]).strip():  # the end of a cut-off turn
        head, sep, tail = parts[0].rpartition(_INST_CLOSE)  # a user's, and maybe its reply; or a reply's
        if (cut_turn := _message("user", head, {}, tokens))["content"]:
            out.append(cut_turn)
        if sep or tail.strip():
            out.append(_message("assistant", _cut(tail, tokens), {}, tokens))
    for part in parts[1:]:
        close = part.find(_INST_CLOSE)
        if close < 0:
            continue
        user, reply = part[:close], part[close + len(_INST_CLOSE) :]
        reply, systems = _system_blocks(reply, tokens) if v7 else (reply, [])
        start = user.find("<<SYS>>")
        stop = user.find("<</SYS>>", start + len("<<SYS>>")) if start >= 0 else -1
        if stop >= 0:
            out.append(_message("system", user[start + len("<<SYS>>") : stop], {}, tokens))
            user = user[:start] + user[stop + len("<</SYS>>") :]
        out += [_message("user", user, {}, tokens), _message("assistant", _cut(reply, tokens), {}, tokens)]
        out += systems
    return out or None


def _leading_systems(text: str, partial: bool, tokens: _Tokens) -> tuple[int, Messages]:
    """Mistral v7's system blocks before the first turn (read before the text is split at ``[INST]``: a system prompt
    may mention it), and where the turns start: the end of a cut-off one with ``partial``, then each block that only
    BOS or padding precedes (an unclosed one runs to the next ``[INST]``)."""
    out: Messages = []
    at, opened, close = 0, text.find(_SYS_OPEN), text.find(_SYS_CLOSE)
    if partial and close >= 0 and not 0 <= opened < close:  # the end of a cut-off system prompt
        out.append(_message("system", text[:close], {}, tokens))
        at = close + len(_SYS_CLOSE)
        opened = text.find(_SYS_OPEN, at)
    while opened >= 0 and not _FILLER.sub("", text[at:opened]).strip():
        start = opened + len(_SYS_OPEN)
        if (close := text.find(_SYS_CLOSE, start)) >= 0:
            at = close + len(_SYS_CLOSE)
        else:
            at = close = len(text) if (inst := text.find(_INST, start)) < 0 else inst
        if (message := _message("system", text[start:close], {}, tokens))["content"]:
            out.append(message)
        opened = text.find(_SYS_OPEN, at)
    return at, out


def _system_blocks(text: str, tokens: _Tokens) -> tuple[str, Messages]:
    """Mistral v7's system prompts after a reply, between two ``[INST]`` turns: the reply (the text before the first
    ``[SYSTEM_PROMPT]``), and a system message for each block (an unclosed one runs to the end)."""
    at = text.find(_SYS_OPEN)
    if at < 0:
        return text, []
    before = text[:at]
    systems: Messages = []
    while at >= 0:
        start = at + len(_SYS_OPEN)
        stop = text.find(_SYS_CLOSE, start)
        stop = len(text) if stop < 0 else stop
        if (message := _message("system", text[start:stop], {}, tokens))["content"]:
            systems.append(message)
        at = text.find(_SYS_OPEN, stop)
    return before, systems


def _parse_role_lines(text: str, partial: bool = False) -> Messages | None:
    """``User: ...`` / ``Assistant: ...`` transcripts (continuation lines join the turn above). Linear: a turn's
    lines are collected and joined once. Text before the first role prefix means plain text (None), unless
    ``partial``: then it is the end of a turn (of no known speaker: a plain string)."""
    turns: list[tuple[str | None, list[str]]] = [(None, [])] if partial else []
    for line in _ANY.special.sub("", text).split("\n"):
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
    return [_message(role, " ".join(parts), {}) if role else _unknown(" ".join(parts)) for role, parts in turns] or None


def _as_messages(text: str, partial: bool = False, quoted: bool = False) -> tuple[Messages, _Tokens]:
    """Messages of a templated string and its template's tokens; plain text becomes one turn per line, each a plain
    string (a turn of no known speaker), and a reply to it is cut at any template's tokens. ``quoted``: a whole text
    whose template markup does not open it is plain text that quotes a marker (``_opening_template``), read as
    ``templated_prompt`` reads it for the in-process reward."""
    quotes = quoted and _ranked_templates(text, False) and _opening_template(text) is None
    parsed = None if quotes else _parse_chat(text, partial)
    if parsed is not None:
        return parsed
    return [line.strip() for line in text.split("\n") if line.strip()], _ANY


def _role(message: dict[str, str] | str) -> str | None:
    """A parsed message's role; None for a turn of no known speaker (a plain string)."""
    return None if isinstance(message, str) else message["role"]


def _content(message: dict[str, str] | str) -> str:
    """A parsed message's text."""
    return message if isinstance(message, str) else message["content"]


def _lost_reply_header(head: str, kept: str) -> bool:
    """Whether a query cut into ``head`` and the ``kept`` end lost the header of its reply's turn: the whole text is
    in a template whose turns open with a header (its first marker in ``head``, as ``_templates`` picks a whole
    text's), or is a ``User:``/``Assistant:`` transcript, and ``kept`` holds no header of it (a Mistral ``[/INST]``,
    a role line). Linear: one search per template over ``head``, and a pass over ``kept``."""
    names = _templates(head, False)
    if names:
        name = names[0]
        return _INST_CLOSE not in kept if name not in _MARKED else _MARKED[name].header.search(kept) is None
    first = _ANY.special.sub("", head).lstrip().split("\n", 1)[0]
    if _ROLE_LINE.match(first.strip()) is None:  # plain text: a turn per line, and the reply is the last
        return False
    return not any(_ROLE_LINE.match(line.strip()) for line in _ANY.special.sub("", kept).split("\n"))


def split_query(query: str, prompt: str | None = None, max_chars: int | None = None) -> tuple[Messages, str] | None:
    """(prompt messages, reply) of a full text. With ``prompt``: the reply is what follows the prompt in the
    query. Without it (or when the query does not contain it): the last assistant turn of a templated query,
    or the last line of plain text. None when no reply can be found.

    ``max_chars`` (a reward's ``max_chars``: it reads a context's last and a reply's first ``max_chars``) cuts the
    text before it is parsed, leaving room for the template's markers: with a prompt, the prompt's last and the
    reply's first ``2 * max_chars`` characters; without one, the query's lines that start in its last
    ``4 * max_chars`` characters (None when there are none, or when the whole query's template or transcript marks
    its turns and those lines hold no turn header: the reply's start is out of reach, and read as plain text its own
    earlier lines became the context of its last). A longer query can then read differently from the whole one
    only in its oldest turns."""
    window, full = (None if max_chars is None else 2 * max_chars), len(query)
    if prompt:
        at = query.find(prompt)
        if at >= 0:
            reply = query[at + len(prompt) :]
            reply = reply if window is None else reply[:window]
            head, partial = (prompt, False) if window is None or len(prompt) <= window else (prompt[-window:], True)
            # the prompt's template tells where its reply ends: at that template's tokens only
            if prompt_opens_think(prompt):  # the prompt opened the reasoning: it belongs to the reply, not the context
                opened = head.rfind(THINK_OPEN)
                kept = head[:opened] if opened >= 0 else head
                messages, tokens = _as_messages(kept, partial=partial, quoted=not partial)
                return messages, THINK_OPEN + _cut(reply, tokens)
            messages, tokens = _as_messages(head, partial=partial, quoted=not partial)
            return messages, _cut(reply, tokens)
    if window is not None and len(query) > 2 * window:
        cut = query.find("\n", len(query) - 2 * window)
        if cut < 0 or _lost_reply_header(query[: cut + 1], query[cut + 1 :]):
            return None
        query = query[cut + 1 :]
    parsed = _parse_chat(query, partial=window is not None and len(query) < full)
    if parsed is not None:
        messages, tokens = parsed
        # empty turns at the end: a stop token that is a turn header (GLM-4's <|user|>) after the reply, then a
        # generation prompt (an empty reply: never the assistant turn before it)
        while messages and not _content(messages[-1]) and _role(messages[-1]) != "assistant":
            messages.pop()
        while messages and _role(messages[-1]) == "assistant" and not _content(messages[-1]):
            messages.pop()
        if not messages or _role(messages[-1]) != "assistant":
            return None
        return messages[:-1], _cut(_content(messages[-1]), tokens)
    lines = [line for line in query.split("\n") if line.strip()]
    if not lines:
        return None
    return _as_messages("\n".join(lines[:-1]))[0], clean_reply(lines[-1])

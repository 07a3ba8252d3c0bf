"""Turning TRL-style prompts and completions (plain strings or chat message lists) into scorer text.

A context is written as the scorer was trained: the conversation's turns, oldest first, one per line
(``pairs.join_turns``). These helpers never raise on odd input; they return None for what they cannot
read, so callers decide what an unreadable sample is worth.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .pairs import join_turns

__all__ = ["message_text", "prompt_to_context", "completion_to_text", "turns_to_messages"]

_SPEAKERS = ("user", "assistant")


def message_text(content: Any) -> str | None:
    """The text of a message's content: a string, or the text parts of a multimodal parts list."""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence) and not isinstance(content, (bytes, bytearray)):
        parts = [p.get("text") for p in content if isinstance(p, dict) and p.get("type", "text") == "text"]
        parts = [p for p in parts if isinstance(p, str)]
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
        texts = [message_text(m.get("content")) for m in completion
                 if isinstance(m, dict) and m.get("role", "assistant") == "assistant"]
        texts = [t for t in texts if t is not None]
        return " ".join(texts) if texts else None
    return None


def turns_to_messages(turns: Sequence[str] | str, system_prompt: str | None = None) -> list[dict]:
    """Chat messages of a conversation (turns oldest first, or one string with a turn per line) in which
    the newest turn is the user's, so a chat model replies as the next speaker."""
    if isinstance(turns, str):
        turns = [line for line in turns.split("\n") if line.strip()]
    n = len(turns)
    messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
    return messages + [{"role": "user" if (n - 1 - i) % 2 == 0 else "assistant", "content": t}
                       for i, t in enumerate(turns)]

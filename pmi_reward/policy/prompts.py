"""Chat prompts for policy training and evaluation, cut from dialogues.

A prompt is the conversation before one turn of a dialogue, written as chat messages with the newest
turn as the user's, so the policy answers in the place of the speaker who really replied next (that
human reply is kept as ``reference``). Dialogue ranges (``first_dialogue``, ``max_dialogues``) keep
the contexts that train the policy, tune it and evaluate it apart from each other and from the
dialogues the scorers were trained on.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from datasets import Dataset

from ..data.conversation import DEFAULT_SYSTEM_PROMPT, message_text, prompt_to_context, turns_to_messages
from ..data.dialogues import Dialogue, load_dialogues
from ..data.records import DataError, read_records
from .sampling import CHAT_TEMPLATE_KWARGS

__all__ = [
    "PromptArguments",
    "dialogue_prompts",
    "build_prompts",
    "fit_prompts",
    "fit_prompt_column",
    "DEFAULT_SYSTEM_PROMPT",
]

logger = logging.getLogger(__name__)


@dataclass
class PromptArguments:
    """Where prompts come from: dialogues (a range of them) or a ready JSONL of ``{"prompt": ...}`` rows."""

    dialogues: str = field(default="chitchat", metadata={"help": "chitchat | dialogue file | datasets folder"})
    prompt_file: str | None = field(
        default=None,
        metadata={"help": "JSONL/JSON with a 'prompt' field (a string or chat messages); replaces --dialogues"},
    )
    first_dialogue: int = field(default=2000, metadata={"help": "skip the dialogues before this index"})
    max_dialogues: int | None = field(
        default=1400, metadata={"help": "use at most N dialogues from first_dialogue (0: all)"}
    )
    prompts_per_dialogue: int = field(default=1, metadata={"help": "contexts cut from each dialogue"})
    prompt_turns: int = field(default=3, metadata={"help": "turns of conversation in each prompt"})
    max_context_chars: int = field(default=400, metadata={"help": "skip contexts longer than this (CPU budget)"})
    system_prompt: str | None = field(default=DEFAULT_SYSTEM_PROMPT, metadata={"help": "system message ('' for none)"})
    prompt_seed: int = field(default=0, metadata={"help": "seed for picking positions in dialogues"})
    max_prompts: int | None = field(default=None, metadata={"help": "keep at most N prompts (0: all)"})

    def __post_init__(self) -> None:
        """Refuse counts that would cut the range silently (a negative index counts from the end) or leave prompts
        with no conversation in them, when the options are read, before any model loads."""
        for name in ("first_dialogue", "max_dialogues", "max_prompts"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"{name} must be >= 0, got {value}")
        for name in ("prompts_per_dialogue", "prompt_turns"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")


def dialogue_prompts(
    dialogues: Sequence[Dialogue],
    max_context_turns: int = 3,
    per_dialogue: int = 1,
    max_context_chars: int | None = 400,
    system_prompt: str | None = DEFAULT_SYSTEM_PROMPT,
    seed: int = 0,
) -> list[dict]:
    """Rows ``{"prompt", "reference", "dialogue_id"}``: up to ``per_dialogue`` seeded positions per dialogue."""
    rng = np.random.default_rng(seed)
    rows = []
    for d in dialogues:
        positions = [
            t
            for t in range(1, len(d.turns))
            if not max_context_chars or len(" ".join(d.turns[max(0, t - max_context_turns) : t])) <= max_context_chars
        ]
        for t in sorted(rng.permutation(positions)[:per_dialogue].tolist()):
            context = d.turns[max(0, t - max_context_turns) : t]
            rows.append(
                {"prompt": turns_to_messages(context, system_prompt), "reference": d.turns[t], "dialogue_id": d.id}
            )
    return rows


def _prompt_problem(prompt: object) -> str | None:
    """What is wrong with a prompt file's prompt, or None for a string or chat messages with a turn to reply to."""
    if isinstance(prompt, list):
        if not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and message_text(m.get("content")) is not None
            for m in prompt
        ):
            return "expected chat messages ({role, content} objects)"
    elif not isinstance(prompt, str):
        return "expected a string or chat messages"
    if not prompt_to_context(prompt):
        return "no conversation to reply to (empty, or no user or assistant turn with text)"
    return None


def _check_prompt_file(path: str, rows: list[dict]) -> None:
    """Every row holds a prompt to reply to, and all in one form: a dataset column cannot mix strings and lists."""
    for n, row in enumerate(rows, 1):
        problem = _prompt_problem(row.get("prompt"))
        if problem is not None:
            raise DataError(f"{path}, row {n}, field 'prompt': {problem}")
    text = isinstance(rows[0]["prompt"], str) if rows else True
    mixed = next((n for n, r in enumerate(rows, 1) if isinstance(r["prompt"], str) != text), None)
    if mixed is not None:
        forms = ("chat messages", "a string") if text else ("a string", "chat messages")
        raise DataError(
            f"{path}, row {mixed}, field 'prompt': {forms[0]} where row 1 has {forms[1]}: give every prompt in one form"
        )


def build_prompts(args: PromptArguments) -> Dataset:
    """The prompt dataset the arguments describe (a ``prompt`` column, plus ``reference`` for dialogues)."""
    if args.prompt_file:
        rows = read_records(args.prompt_file)
        _check_prompt_file(args.prompt_file, rows)
    else:
        dialogues = load_dialogues(args.dialogues)[args.first_dialogue :]
        dialogues = dialogues[: args.max_dialogues] if args.max_dialogues else dialogues
        if not dialogues:
            raise DataError(f"{args.dialogues}: no dialogues from index {args.first_dialogue}")
        rows = dialogue_prompts(
            dialogues,
            args.prompt_turns,
            args.prompts_per_dialogue,
            args.max_context_chars,
            args.system_prompt or None,
            args.prompt_seed,
        )
    rows = rows[: args.max_prompts] if args.max_prompts else rows
    if not rows:
        raise DataError("no prompts: every context is longer than --max_context_chars or the range is empty")
    return Dataset.from_list(rows)


def _render(tokenizer: Any, prompt: list[dict]) -> Exception | None:
    """The error the tokenizer's chat template raises on ``prompt``, or None when it renders (as the sampler renders
    it: with ``CHAT_TEMPLATE_KWARGS``)."""
    try:
        tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False, **CHAT_TEMPLATE_KWARGS)
    except Exception as err:  # a template's raise_exception (jinja2's TemplateError), whatever the template
        return err
    return None


def fit_prompts(prompts: Sequence[Any], tokenizer: Any) -> list[Any]:
    """Chat prompts as the policy's chat template accepts them.

    A context cut from a dialogue opens with an assistant turn when it holds an even number of turns (the newest is
    the user's). Templates that require user/assistant alternation from a user turn (Gemma 1/2, Mistral v0.1-0.3,
    Llama 2) refuse it, which ended a run at the first batch holding one. Such a prompt starts at its next turn here
    (its oldest turn is dropped, with a warning that counts them); templates that accept it (ChatML: SmolLM2, Qwen)
    get every prompt as it is. A prompt the template refuses otherwise (a system message where it has no system
    role) is an error naming it; so is any chat prompt where the policy has no chat template (a base
    model), which no --system_prompt can fix. Text prompts are kept as they are."""
    fitted, cut = [], 0
    for n, prompt in enumerate(prompts, 1):
        if isinstance(prompt, str) or _render(tokenizer, prompt) is None:
            fitted.append(prompt)
            continue
        start = next((i for i, m in enumerate(prompt) if m.get("role") != "system"), len(prompt))
        shorter = list(prompt[:start]) + list(prompt[start + 1 :])
        opens_with_assistant = start < len(prompt) and prompt[start].get("role") == "assistant"
        if (
            opens_with_assistant
            and any(m.get("role") == "user" for m in shorter)
            and _render(tokenizer, shorter) is None
        ):
            fitted.append(shorter)
            cut += 1
            continue
        if not getattr(tokenizer, "chat_template", None):  # --system_prompt '' cannot help: nothing renders a chat
            raise DataError(
                f"prompt {n}: the policy has no chat template (a base model?) to render chat messages with: give a "
                "chat model, or a --prompt_file of text prompts"
            )
        hint = " (no system role in this template? give --system_prompt '')" if start > 0 else ""
        raise DataError(f"prompt {n}: the policy's chat template refuses it: {_render(tokenizer, prompt)}{hint}")
    if cut:
        logger.warning(
            "%d of %d prompts opened with an assistant turn, which the policy's chat template refuses: they start at "
            "their next turn",
            cut,
            len(fitted),
        )
    return fitted


def fit_prompt_column(dataset: Dataset, tokenizer: Any) -> Dataset:
    """``dataset`` with its ``prompt`` column fitted to the policy's chat template (``fit_prompts``)."""
    prompts = list(dataset["prompt"])
    fitted = fit_prompts(prompts, tokenizer)
    if fitted == prompts:
        return dataset
    return dataset.remove_columns("prompt").add_column("prompt", fitted)

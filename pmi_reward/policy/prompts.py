"""Chat prompts for policy training and evaluation, cut from dialogues.

A prompt is the conversation before one turn of a dialogue, written as chat messages with the newest
turn as the user's, so the policy answers in the place of the speaker who really replied next (that
human reply is kept as ``reference``). Dialogue ranges (``first_dialogue``, ``max_dialogues``) keep
the contexts that train the policy, tune it and evaluate it apart from each other and from the
dialogues the scorers were trained on.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from datasets import Dataset

from ..data.conversation import turns_to_messages
from ..data.dialogues import Dialogue, load_dialogues
from ..data.records import DataError, read_records

__all__ = ["PromptArguments", "dialogue_prompts", "build_prompts", "DEFAULT_SYSTEM_PROMPT"]

DEFAULT_SYSTEM_PROMPT = "You are chatting with a friend. Reply in one or two short sentences."


@dataclass
class PromptArguments:
    """Where prompts come from: dialogues (a range of them) or a ready JSONL of ``{"prompt": ...}`` rows."""

    dialogues: str = field(default="chitchat", metadata={"help": "chitchat | dialogue file | datasets folder"})
    prompt_file: str | None = field(
        default=None,
        metadata={"help": "JSONL/JSON with a 'prompt' field (a string or chat messages); replaces --dialogues"},
    )
    first_dialogue: int = field(default=2000, metadata={"help": "skip the dialogues before this index"})
    max_dialogues: int | None = field(default=1400, metadata={"help": "use at most N dialogues from first_dialogue"})
    prompts_per_dialogue: int = field(default=1, metadata={"help": "contexts cut from each dialogue"})
    prompt_turns: int = field(default=3, metadata={"help": "turns of conversation in each prompt"})
    max_context_chars: int = field(default=400, metadata={"help": "skip contexts longer than this (CPU budget)"})
    system_prompt: str | None = field(default=DEFAULT_SYSTEM_PROMPT, metadata={"help": "system message ('' for none)"})
    prompt_seed: int = field(default=0, metadata={"help": "seed for picking positions in dialogues"})
    max_prompts: int | None = field(default=None, metadata={"help": "keep at most N prompts"})


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


def build_prompts(args: PromptArguments) -> Dataset:
    """The prompt dataset the arguments describe (a ``prompt`` column, plus ``reference`` for dialogues)."""
    if args.prompt_file:
        rows = read_records(args.prompt_file)
        bad = next((n for n, r in enumerate(rows, 1) if not isinstance(r.get("prompt"), (str, list))), None)
        if bad is not None:
            raise DataError(f"{args.prompt_file}, row {bad}, field 'prompt': expected a string or chat messages")
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

"""Dialogues from any source as one record type, and dialogue-level splits.

A dialogue is an id plus its turns (one string per speaker turn, oldest first). Sources: the embedded
``chitchat`` corpus (PyPI ``chitchat-dataset``), JSONL/JSON files (``{"id", "turns": [...]}`` or chat
``{"messages": [{"role", "content"}]}``, a content as text or OpenAI's list of parts), CSV/TSV files with one row
per turn (``dialog_id``, ``text``), and Hugging Face ``datasets`` objects or ``save_to_disk`` folders with either
JSON layout as columns.
"""

from __future__ import annotations

import importlib.util
import json
import numbers
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .records import DataError, read_records

__all__ = [
    "Dialogue",
    "load_dialogues",
    "chitchat_dialogues",
    "dialogues_from_records",
    "split_dialogues",
    "speaker",
    "speaker_turns",
    "CHAT_ROLES",
]

CHAT_ROLES = ("user", "assistant")
SPEAKER_ALIASES = ("human", "bot", "ai", "model", "gpt")  # other datasets' names of the two speakers
# not a speaker's turn ("developer": OpenAI's successor of "system"; the reward skips every role but a speaker's)
SKIPPED_ROLES = ("system", "developer", "tool", "function", "ipython")
_ASSISTANT_ALIASES = tuple(a for a in SPEAKER_ALIASES if a != "human")  # "human" names the user; the rest the assistant


@dataclass(frozen=True)
class Dialogue:
    """One conversation: an id unique within its corpus and its turns, oldest first."""

    id: str
    turns: tuple[str, ...]


def chitchat_dialogues() -> list[Dialogue]:
    """The 7k English chats of the Chit-Chat Challenge (PyPI ``chitchat-dataset``, MIT).

    A turn is one message of the corpus (its utterances joined with spaces). A message with no text (12 of them) is
    dropped without joining the same speaker's messages on either side of it, unlike a ``messages`` file's: 9 turns,
    in 7 dialogues, follow a turn of their own speaker (9 pairs of ``PairSet.from_dialogues`` at every position
    whose reply answers its own speaker). Kept so that recorded figures reproduce: joined, those turns would move
    every pair after them, and so every seeded negative draw.
    """
    spec = importlib.util.find_spec("chitchat_dataset")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("the chitchat corpus needs: pip install chitchat-dataset")
    path = Path(list(spec.submodule_search_locations)[0]) / "dataset.json"
    raw = json.loads(path.read_text(encoding="utf-8"))
    dialogues = []
    for key, convo in raw.items():
        turns = tuple(
            " ".join(u["text"].strip() for u in message if u.get("text", "").strip()) for message in convo["messages"]
        )
        dialogues.append(Dialogue(str(key), tuple(t for t in turns if t)))
    return dialogues


def speaker(role: object) -> str | None:
    """The speaker a chat message's role names, "user" or "assistant" (``CHAT_ROLES`` and their
    ``SPEAKER_ALIASES``, in any case), or None for any other role (system, tool, unknown)."""
    role = str(role).strip().lower()
    if role not in CHAT_ROLES and role not in SPEAKER_ALIASES:
        return None
    return "assistant" if role in ("assistant", *_ASSISTANT_ALIASES) else "user"


def speaker_turns(messages: Iterable[tuple[str | None, str]]) -> list[str]:
    """The turns of (speaker, text) messages, oldest first: how a chat is read for training (``load_dialogues``)
    and by the reward (``conversation.prompt_to_context``), so that both read one chat alike. Consecutive messages
    of one speaker are one turn, joined with a space (as separate turns they made "user replies to user" pairs); a
    message with no text is none. A message of speaker None (a plain string in a messages list, a system turn the
    reward keeps) is a turn of its own, never joined.

    A turn's messages are collected, then joined once: joined onto the growing turn one by one, a long run took
    time quadratic in its length (each copied the turn so far; ``tests/test_dialogues_join.py``), before any turn
    limit cut the context."""
    turns: list[list[str]] = []  # each turn's messages, its first as written and the rest stripped
    last = None  # the speaker of the last turn (None after a message of no known speaker)
    for who, text in messages:
        if not text.strip():
            if who is None:  # a blank string still parts the turns around it (a messages file kept, then dropped it)
                last = None
            continue
        if who is not None and who == last:
            turns[-1].append(text.strip())
        else:
            turns.append([text])
        last = who
    return [parts[0] if len(parts) == 1 else " ".join([parts[0].strip(), *parts[1:]]) for parts in turns]


def _turns_of(record: dict, where: str) -> tuple[str, ...]:
    """The turns of a JSON-layout record, read as the reward reads a chat prompt (``conversation.prompt_to_context``:
    the same speakers, a content's text parts as its text), or a DataError naming ``where`` and the field."""
    from .conversation import message_text  # here: conversation imports this module (speaker, speaker_turns)

    if "turns" in record:
        turns = record["turns"]
        if not isinstance(turns, list) or not all(isinstance(t, str) for t in turns):
            raise DataError(f"{where}, field 'turns': expected a list of strings")
        return tuple(turns)
    if "messages" in record:
        messages = record["messages"]
        if not isinstance(messages, list):
            raise DataError(f"{where}, field 'messages': expected a list of {{role, content}} objects")
        said: list[tuple[str | None, str]] = []
        for i, m in enumerate(messages, 1):
            if isinstance(m, str):
                said.append((None, m))
            elif isinstance(m, dict) and (text := message_text(m.get("content"))) is not None:
                if "role" not in m:  # read as the user's, a chat of role-less messages was one turn, then dropped
                    raise DataError(
                        f"{where}, field 'messages': message {i} has no 'role' (give each message its speaker's "
                        "role, or the turns as a 'turns' list of strings)"
                    )
                role = str(m["role"]).strip().lower()
                if (who := speaker(role)) is not None:
                    said.append((who, text))
                elif role not in SKIPPED_ROLES:  # a whole speaker dropped made "user replies to user" pairs
                    raise DataError(
                        f"{where}, field 'messages': unknown role {m.get('role')!r} (speakers: "
                        f"{sorted({*CHAT_ROLES, *SPEAKER_ALIASES})}; left out: {sorted(SKIPPED_ROLES)})"
                    )
            elif isinstance(m, dict) and m.get("content") is None and (m.get("tool_calls") or m.get("function_call")):
                continue  # an assistant's tool call: no words said, as the reward reads it (a tool's answer is skipped)
            else:
                raise DataError(f"{where}, field 'messages': expected {{role, content}} objects with text content")
        return tuple(speaker_turns(said))
    raise DataError(f"{where}: needs a 'turns' or 'messages' field (has {sorted(record)})")


def dialogues_from_records(records: Sequence[dict], source: str = "<records>") -> list[Dialogue]:
    """Dialogues from dict records: JSON layouts (``turns``/``messages``) or one turn per row (``dialog_id``,
    ``text``)."""
    if not records:
        raise DataError(f"{source}: no dialogues")
    bad = next((n for n, record in enumerate(records, 1) if not isinstance(record, dict)), None)
    if bad is not None:  # a list of turns was read as a record whose column names were its turns
        raise DataError(
            f"{source}, row {bad}: expected a dict record ({{'id', 'turns': [...]}}, {{'messages': [...]}} or "
            f"{{'dialog_id', 'text'}}), got {type(records[bad - 1]).__name__}"
        )
    first = records[0]
    if "turns" in first or "messages" in first:
        out = []
        for n, record in enumerate(records, 1):
            turns = tuple(t.strip() for t in _turns_of(record, f"{source}, row {n}") if t.strip())
            out.append(Dialogue(str(record.get("id", record.get("dialog_id", n))), turns))
        return out
    for field in ("dialog_id", "text"):
        if field not in first:
            raise DataError(
                f"{source}: missing column {field!r}; a turn-per-row file needs 'dialog_id' and 'text' "
                f"(columns: {sorted(first)})"
            )
    grouped: dict[str, list[str]] = {}
    for n, record in enumerate(records, 1):
        text = record.get("text")
        if not isinstance(text, str):
            raise DataError(f"{source}, row {n}, field 'text': missing or not text")
        if text.strip():
            key = record.get("dialog_id")
            if key is None or (isinstance(key, str) and not key.strip()):  # not a dialogue named "None" or ""
                raise DataError(f"{source}, row {n}, field 'dialog_id': missing value")
            # a whole number names a dialogue, 1.0 too (an int column with gaps, as pandas writes it)
            whole = isinstance(key, numbers.Integral) and not isinstance(key, bool)
            if whole or (isinstance(key, float) and key.is_integer()):
                key = str(int(key))
            if not isinstance(key, str):  # text or a whole number: 1.5 or True names no dialogue
                raise DataError(
                    f"{source}, row {n}, field 'dialog_id': expected text or a whole number, got "
                    f"{type(key).__name__} {key!r}"
                )
            grouped.setdefault(key, []).append(text.strip())
    return [Dialogue(key, tuple(turns)) for key, turns in grouped.items()]


def load_dialogues(source: str | Path | Iterable[dict], limit: int | None = None) -> list[Dialogue]:
    """Dialogues from ``"chitchat"``, a file, a ``datasets`` folder or ``Dataset`` (one split, not a
    ``DatasetDict``), or an iterable of dict records (``dialogues_from_records``).

    Dialogues with fewer than two turns are dropped (they hold no context-response pair); ``limit`` (>= 1, or None
    for all) keeps the first ``limit`` of the rest.
    """
    if limit is not None and limit < 1:  # sliced with, 0 kept every dialogue and -1 dropped the last
        raise ValueError(f"limit must be >= 1 or None (all dialogues), got {limit}")
    if isinstance(source, (str, Path)) and str(source) == "chitchat":
        dialogues = chitchat_dialogues()
    elif isinstance(source, (str, Path)) and Path(source).is_dir():
        import datasets

        saved = datasets.load_from_disk(str(source))
        if isinstance(saved, datasets.DatasetDict) and not saved:
            raise DataError(f"{source}: a DatasetDict folder with no splits: no dialogues")
        if isinstance(saved, datasets.DatasetDict):
            raise DataError(
                f"{source}: a DatasetDict folder (splits {sorted(saved)}); give one split's folder, "
                f"e.g. {Path(source) / next(iter(saved))}"
            )
        dialogues = dialogues_from_records(list(saved), str(source))
    elif isinstance(source, (str, Path)):
        dialogues = dialogues_from_records(read_records(source), str(source))
    elif isinstance(source, Mapping):  # a DatasetDict or one record: iterating it gives its keys, not records
        raise DataError(
            f"{type(source).__name__}: a mapping (keys {sorted(map(str, source))}), not an iterable of dict records; "
            f"a DatasetDict: pass one split, e.g. source[{next(iter(source), 'train')!r}]; one record: pass [record]"
        )
    else:
        dialogues = dialogues_from_records(list(source), type(source).__name__)
    dialogues = [d for d in dialogues if len(d.turns) >= 2]
    if not dialogues:
        raise DataError(f"{source}: no dialogue has two or more turns")
    ids = Counter(d.id for d in dialogues)
    if len(ids) != len(dialogues):
        twice = [i for i, n in ids.items() if n > 1]
        raise DataError(
            f"{source}: dialogue ids are not unique ({len(twice)} repeated, e.g. {twice[0]!r}; a record without "
            "an 'id' or 'dialog_id' takes its row number as id)"
        )
    return dialogues[:limit] if limit is not None else dialogues


def split_dialogues(
    dialogues: Sequence[Dialogue], val_fraction: float = 0.1, test_fraction: float = 0.1, seed: int = 0
) -> tuple[list[Dialogue], list[Dialogue], list[Dialogue]]:
    """Split by dialogue (train, val, test) so no dialogue's turns land in two splits."""
    if not 0 <= val_fraction < 1 or not 0 <= test_fraction < 1 or val_fraction + test_fraction >= 1:
        raise ValueError("val_fraction and test_fraction must be in [0, 1) and sum to less than 1")
    order = np.random.default_rng(seed).permutation(len(dialogues))
    n_val = int(round(val_fraction * len(dialogues)))
    n_test = int(round(test_fraction * len(dialogues)))
    pick = lambda idx: [dialogues[i] for i in sorted(idx)]  # noqa: E731
    return pick(order[n_val + n_test :]), pick(order[:n_val]), pick(order[n_val : n_val + n_test])

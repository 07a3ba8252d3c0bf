"""``RewardOptions``: how raw PMI becomes a reward, the one options dataclass of every PMI reward.

``PMIReward``, ``RemotePMIReward``, the reward server, the verl adapter and the policy trainers all take these
options (in Python, from YAML or as ``--flags``), and nothing writes into a caller's instance: a reward that
resolves ``max_context_turns`` keeps a copy (``resolved``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from typing_extensions import TypedDict

__all__ = ["RewardOptions", "RewardOptionsKwargs"]


@dataclass(frozen=True)
class RewardOptions:
    """How raw PMI becomes a reward: raw -> minus the expected PMI at the reply's length (``length_baseline``)
    -> minus baseline (``center``) -> times ``scale`` -> clipped.

    ``center``: "none" keeps raw PMI; "group" subtracts the mean over completions that share a prompt (as given,
    not as the scorer reads it) in the same call (a GRPO/RLOO group); a call in which a prompt has only one
    completion is refused (``GroupError``): its reward would be 0.0 whatever the reply. ``empty_score`` is
    returned for empty, whitespace-only or unreadable completions (None hands TRL an unscorable sample, which gets
    zero advantage); it is not centred. ``strip_think`` scores a reasoning model's answer, not its reasoning.
    """

    center: str = field(default="none", metadata={"help": "none | group (subtract the mean of a prompt's group)"})
    scale: float = field(default=1.0, metadata={"help": "multiply the (centred) PMI by this"})
    clip: float | None = field(
        default=None, metadata={"help": "symmetric bound after scaling (default: the scorer's softcap bounds it)"}
    )
    empty_score: float | None = field(
        default=-5.0,
        metadata={"help": "reward of an empty or unreadable completion (None: unscorable, zero advantage)"},
    )
    strip_think: bool = field(
        default=True,
        metadata={
            "help": "score the text after the last </think> (reasoning models); an unterminated <think> block "
            "leaves an empty reply (empty_score)"
        },
    )
    think_opened: bool = field(
        default=False,
        metadata={
            "help": "the chat template opens <think> in the generation prompt (Qwen3.5, DeepSeek-R1 distills), so "
            "a reply without </think> is unfinished reasoning (empty); detected per sample where the prompt is a "
            "chat-templated string (and by the server from OpenRLHF's prompts). In a call whose completions TRL "
            "parsed (any with reasoning_content, thinking or tool_calls) each is its content either way"
        },
    )
    include_system: bool = field(
        default=False,
        metadata={
            "help": "read the system prompt as a context turn: the oldest, so the first that max_context_turns cuts "
            "(a prompt of that many turns besides it reads without it). A prompt given as chat-templated text (the "
            "server's /get_reward queries) holds the template's own default system prompt where the messages had "
            "none (SmolLM2, Qwen2.5, Llama 3.1's date header), read as a turn too: with such templates keep this "
            "false, or always send a system message"
        },
    )
    max_context_turns: int | None = field(
        default=None,
        metadata={"help": "context turns the reward reads (default: as many as the scorer was trained with)"},
    )
    batch_size: int = field(default=256, metadata={"help": "pairs per scorer call"})
    max_chars: int = field(
        default=100_000,
        metadata={"help": "longer contexts keep their end, longer replies their start (bounds tokenizing time)"},
    )
    length_baseline: str | None = field(
        default=None,
        metadata={
            "help": "length-neutral PMI: a length-baseline JSON file (rewards.length); its expected PMI at the "
            "reply's length is subtracted from raw PMI"
        },
    )
    name: str = field(default="pmi_reward", metadata={"help": "the reward's name in TRL's logs"})

    def __post_init__(self) -> None:
        if self.center not in ("none", "group"):
            raise ValueError(f"center must be 'none' or 'group', got {self.center!r}")
        if not math.isfinite(self.scale):
            raise ValueError("scale must be finite")
        if self.clip is not None and not (self.clip > 0 and math.isfinite(self.clip)):
            raise ValueError(f"clip must be positive and finite (None: no clip), got {self.clip}")
        if self.empty_score is not None and not math.isfinite(self.empty_score):
            raise ValueError("empty_score must be finite or None")
        if self.batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        if self.max_chars < 1:
            raise ValueError("max_chars must be >= 1")
        if self.max_context_turns is not None and self.max_context_turns < 1:
            raise ValueError(
                f"max_context_turns must be >= 1 (None: as many as the scorer was trained with), got "
                f"{self.max_context_turns}"
            )

    def resolved(self, trained_context_turns: int | None) -> RewardOptions:
        """These options with ``max_context_turns`` set to the scorer's when unset (a copy; self is unchanged)."""
        if self.max_context_turns is not None:
            return self
        return replace(self, max_context_turns=trained_context_turns)


class RewardOptionsKwargs(TypedDict, total=False):
    """``RewardOptions``' fields as keyword options (``PMIReward(scorer, empty_score=-5.0)``): typed with PEP 692's
    ``Unpack`` so that a type checker catches a misspelt or mistyped option, which would otherwise fail only at run
    time. Its keys are ``RewardOptions``' fields (a test holds them equal)."""

    center: str
    scale: float
    clip: float | None
    empty_score: float | None
    strip_think: bool
    think_opened: bool
    include_system: bool
    max_context_turns: int | None
    batch_size: int
    max_chars: int
    length_baseline: str | None
    name: str

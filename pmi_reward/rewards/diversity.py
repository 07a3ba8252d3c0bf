"""A diversity reward to sit beside PMI in TRL (``--extra_reward_funcs pmi_reward.rewards.diversity:diversity_reward``).

It penalises the two kinds of sameness a PMI-trained policy drifts into: repeating itself inside a reply (the
share of its word n-grams that repeat an earlier one) and answering every sample of a prompt alike (the share
of the other completions of the same prompt in the call, a GRPO/RLOO group, that open with the same words).
Reward = -(repetition_weight x repeated share + opening_weight x same-opening share), in [-(w1 + w2), 0]; an
unreadable completion gets None (unscorable), an empty one 0 (PMI's ``empty_score`` deals with it). A reasoning
model's reply is read as PMI reads it, its answer after ``</think>`` (``path.think_answers``: a completion TRL already
parsed into ``reasoning_content`` or ``thinking`` and ``content`` is its content, as every completion of such a call is;
a prompt string that opens ``<think>``, a template's generation prompt or a plain one ending in it, opens its reply's
block), not the reasoning every sample opens alike. The opening term needs a group's completions in one call: under
several processes (each scoring a slice of the batch, a group possibly split) it is refused; the repetition term
needs no group.
A plain callable with TRL's signature and a ``__name__``; picklable.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from ..data.conversation import completion_to_text, prompt_to_context
from ..data.words import split_words
from .path import prompts_open_think, reasoning_parsed, think_answers, world_size

__all__ = ["DiversityReward", "diversity_reward", "repeated_ngram_share", "opening"]


def _words(text: str) -> list[str]:
    """Lower-case words, a punctuation mark between two parts of one ("e-mail": two), each letter of a script written
    without spaces its own word (``data.words.split_words``): a Chinese reply was one word, its repeats unseen."""
    return split_words(text, punctuation_parts=True)


def repeated_ngram_share(text: str, n: int = 3) -> float:
    """Share of the reply's word n-grams that already occurred earlier in it (0 for fewer than 2 n-grams)."""
    w = _words(text)
    grams = [tuple(w[i : i + n]) for i in range(len(w) - n + 1)]
    return 1.0 - len(set(grams)) / len(grams) if len(grams) > 1 else 0.0


def opening(text: str, n_words: int = 3) -> str:
    """The reply's first ``n_words`` normalised words."""
    return " ".join(_words(text)[:n_words])


def _plain(values: Any) -> list:
    """A list from a list, tuple or numpy array (TRL passes lists; other callers may pass arrays)."""
    return values.tolist() if hasattr(values, "tolist") else list(values)


def _group_key(prompt: Any) -> str | None:
    if hasattr(prompt, "tolist"):
        prompt = prompt.tolist()
    context = prompt_to_context(prompt, include_system=True)
    return context if context is not None else None


class DiversityReward:
    """``reward(prompts, completions, **kwargs) -> list[float | None]``: minus repetition and same openings."""

    def __init__(
        self,
        ngram: int = 3,
        opening_words: int = 3,
        repetition_weight: float = 1.0,
        opening_weight: float = 1.0,
        name: str = "diversity_reward",
        strip_think: bool = True,
        think_opened: bool = False,
    ) -> None:
        if ngram < 1 or opening_words < 1:
            raise ValueError("ngram and opening_words must be >= 1")
        self.ngram, self.opening_words = ngram, opening_words
        self.repetition_weight, self.opening_weight = repetition_weight, opening_weight
        self.strip_think, self.think_opened = strip_think, think_opened
        self.__name__ = name

    def __call__(
        self, prompts: Sequence[Any] | None = None, completions: Sequence[Any] | None = None, **kwargs: Any
    ) -> list[float | None]:
        completions = _plain(completions if completions is not None else [])
        prompts = _plain(prompts) if prompts is not None else [None] * len(completions)
        if len(prompts) != len(completions):
            raise ValueError(f"got {len(prompts)} prompts but {len(completions)} completions")
        if self.opening_weight and (processes := world_size()) > 1:
            raise ValueError(
                f"diversity_reward's opening term compares the completions of a prompt within one call, but "
                f"{processes} processes each score a slice of the batch (a group can be split); use opening_weight=0"
            )
        completions = [c.tolist() if hasattr(c, "tolist") else c for c in completions]
        if self.strip_think:  # as PMI reads them: think_opened applies to no completion of a parsed call
            opened = [self.think_opened or o for o in prompts_open_think(prompts)]
            texts, _ = think_answers(completions, opened)
        else:
            texts = [completion_to_text(c) for c in completions]
        # a parsed completion without content is reasoning that never closed: an empty answer, as a string's is
        texts = ["" if t is None and reasoning_parsed(c) else t for t, c in zip(texts, completions, strict=True)]
        keys = [_group_key(p) if p is not None else None for p in prompts]
        starts = [opening(t, self.opening_words) if t else "" for t in texts]
        groups = Counter((k, s) for k, s in zip(keys, starts, strict=True) if k is not None and s)
        sizes = Counter(k for k, t in zip(keys, texts, strict=True) if k is not None and t is not None)
        out: list[float | None] = []
        for key, start, text in zip(keys, starts, texts, strict=True):
            if text is None:
                out.append(None)
                continue
            others = sizes[key] - 1 if key is not None else 0
            alike = (groups[(key, start)] - 1) / others if key is not None and others > 0 and start else 0.0
            out.append(-(self.repetition_weight * repeated_ngram_share(text, self.ngram) + self.opening_weight * alike))
        return out


diversity_reward = DiversityReward()

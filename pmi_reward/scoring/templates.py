"""Encoder input templates: how a (context, response) pair, or each side alone, is written before it is embedded.

Not chat templates (those are ``pmi_reward.data.conversation``'s business) and not the prompts a policy answers
(``pmi_reward.policy.prompts``). ``pair_template`` is the paper's single pair prompt (used by the ``prompt``
input mode); ``context_template`` and ``response_template`` wrap each side when they are embedded separately
(the ``pair`` input mode) and by default pass the text through unchanged.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field

__all__ = ["PromptTemplate", "BUILTIN_PAIR_TEMPLATES", "TEMPLATES", "get_template", "fill"]

_EN = (
    "You are an assistant skilled at evaluating the relevance of a response to a given context.\n"
    "Task: Evaluate the relevance of the following response to the context.\n"
    "Context: {context}\nResponse: {response}\nResult:"
)
_ZH = (
    "你是一个擅长评估回复与给定上下文相关性的助手。\n"
    "任务：评估以下回复与上下文的相关性。\n"
    "上下文：{context}\n回复：{response}\n结果："
)
BUILTIN_PAIR_TEMPLATES = {"en": _EN, "zh": _ZH, "plain": "{context}\n{response}"}
_FIELD = re.compile(r"\{(context|response)\}")


def fill(template: str, **values: str) -> str:
    """Substitute ``{context}``/``{response}`` in one pass (user text may itself contain braces)."""
    return _FIELD.sub(lambda m: values[m.group(1)], template)


@dataclass(frozen=True)
class PromptTemplate:
    """How pairs and single sides are written before encoding; saved with a scorer (the full texts, so that a
    saved scorer never changes with the built-ins)."""

    pair_template: str = field(
        default="en",
        metadata={"help": "the pair prompt: en | zh | plain, or custom text with {context} and {response}"},
    )
    context_template: str = field(default="{context}", metadata={"help": "wrapper for contexts (pair input mode)"})
    response_template: str = field(default="{response}", metadata={"help": "wrapper for responses (pair input mode)"})

    def __post_init__(self) -> None:
        for name in ("pair_template", "context_template", "response_template"):  # a list passed the placeholder test
            value = getattr(self, name)
            if not isinstance(value, str):
                raise ValueError(f"{name} must be text, got {value!r}")
        pair = BUILTIN_PAIR_TEMPLATES.get(self.pair_template, self.pair_template)
        if pair == self.pair_template and "{context}" not in pair and "{response}" not in pair:
            raise ValueError(
                f"unknown template {self.pair_template!r}; built-ins: {sorted(BUILTIN_PAIR_TEMPLATES)}, "
                "or pass text with {context} and {response}"
            )
        object.__setattr__(self, "pair_template", pair)
        for name, text, needed in (
            ("pair_template", self.pair_template, ("{context}", "{response}")),
            ("context_template", self.context_template, ("{context}",)),
            ("response_template", self.response_template, ("{response}",)),
        ):
            missing = [n for n in needed if n not in text]
            if missing:
                raise ValueError(f"template {self.name!r}: {name} lacks placeholder(s) {missing}")

    @property
    def name(self) -> str:
        """The built-in pair prompt's name, or ``custom``."""
        return next((n for n, text in BUILTIN_PAIR_TEMPLATES.items() if text == self.pair_template), "custom")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> PromptTemplate:
        """From ``to_dict`` (or a version-1 scorer's ``{"name", "pair", "context", "response"}``). Every field is
        required: each format's ``to_dict`` has written all of them, and one missing took today's default, so a
        damaged scorer scored its contexts or replies written in another way than it was trained on, silently."""
        old = "pair" in data
        names = {"pair": "pair_template", "context": "context_template", "response": "response_template"}
        missing = [key for key in (names if old else names.values()) if key not in data]
        if missing:
            raise ValueError(f"missing field(s) {missing}")
        if old:
            data = {new: data[key] for key, new in names.items()}
        return cls(**data)


TEMPLATES: dict[str, PromptTemplate] = {name: PromptTemplate(name) for name in BUILTIN_PAIR_TEMPLATES}


def get_template(name_or_text: str) -> PromptTemplate:
    """A built-in template by name, or a custom pair template given as text with both placeholders."""
    return PromptTemplate(name_or_text)

"""Prompt templates that turn a (context, response) pair, or each side alone, into encoder input.

``pair`` is the paper's single pair prompt (used by the ``prompt`` input mode). ``context`` and
``response`` wrap each side when they are embedded separately (the ``pair`` input mode); by default they
pass the text through unchanged.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

__all__ = ["PromptTemplate", "TEMPLATES", "get_template", "fill"]

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
_FIELD = re.compile(r"\{(context|response)\}")


def fill(template: str, **values: str) -> str:
    """Substitute ``{context}``/``{response}`` in one pass (user text may itself contain braces)."""
    return _FIELD.sub(lambda m: values[m.group(1)], template)


@dataclass(frozen=True)
class PromptTemplate:
    """How pairs and single sides are written before encoding."""

    name: str = "en"
    pair: str = _EN
    context: str = "{context}"
    response: str = "{response}"

    def __post_init__(self) -> None:
        for field, text, needed in (
            ("pair", self.pair, ("{context}", "{response}")),
            ("context", self.context, ("{context}",)),
            ("response", self.response, ("{response}",)),
        ):
            missing = [n for n in needed if n not in text]
            if missing:
                raise ValueError(f"template {self.name!r}: field {field!r} lacks placeholder(s) {missing}")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "PromptTemplate":
        return cls(**data)


TEMPLATES: dict[str, PromptTemplate] = {
    "en": PromptTemplate("en", _EN),
    "zh": PromptTemplate("zh", _ZH),
    "plain": PromptTemplate("plain", "{context}\n{response}"),
}


def get_template(name_or_text: str) -> PromptTemplate:
    """A built-in template by name, or a custom pair template given as text with both placeholders."""
    if name_or_text in TEMPLATES:
        return TEMPLATES[name_or_text]
    if "{context}" in name_or_text or "{response}" in name_or_text:
        return PromptTemplate("custom", name_or_text)
    raise ValueError(f"unknown template {name_or_text!r}; built-ins: {sorted(TEMPLATES)}, or pass text with "
                     "{context} and {response}")

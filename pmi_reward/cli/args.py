"""Argument dataclasses shared by subcommands (parsed from YAML via ``--config`` and CLI flags)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..scoring.encoder import EncoderSpec
from ..scoring.templates import PromptTemplate, get_template


@dataclass
class ModelArguments:
    """The frozen encoder, the prompt template and the head's shape."""

    model: str = field(default="minilm", metadata={"help": "minilm | smollm2-135m-instruct | any HF model id/path"})
    pooling: str | None = field(default=None, metadata={"help": "mean | last (default: by model type)"})
    normalize: bool = field(default=True, metadata={"help": "L2-normalize embeddings"})
    max_length: int = field(default=256, metadata={"help": "encoder token budget per input"})
    dtype: str = field(default="float32", metadata={"help": "float32 | bfloat16"})
    layer: int = field(default=-1, metadata={"help": "hidden layer to pool (-1: last)"})
    encode_batch_size: int = field(default=64, metadata={"help": "texts per encoder forward"})
    template: str = field(default="en", metadata={"help": "en | zh | plain | custom text with {context} {response}"})
    context_template: str = field(default="{context}", metadata={"help": "wrapper for contexts (pair mode)"})
    response_template: str = field(default="{response}", metadata={"help": "wrapper for responses (pair mode)"})
    input_mode: str = field(default="pair", metadata={"help": "pair: [u, v, u*v] of separate embeddings; "
                                                               "prompt: one pair-prompt embedding (the paper's)"})
    pair_product: bool = field(default=True, metadata={"help": "add u*v to the pair features"})
    hidden: list[int] = field(default_factory=lambda: [256, 128], metadata={"help": "head hidden widths"})
    cap: float = field(default=20.0, metadata={"help": "softcap bound of the score"})

    def encoder_spec(self) -> EncoderSpec:
        return EncoderSpec(self.model, self.pooling, self.normalize, self.max_length, self.dtype, self.layer,
                           self.encode_batch_size)

    def prompt_template(self) -> PromptTemplate:
        base = get_template(self.template)
        return PromptTemplate(base.name, base.pair, self.context_template, self.response_template)

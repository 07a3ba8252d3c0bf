"""Sampling replies from a chat model: N per prompt, batched, seeded, with progress; and best-of-n.

Best-of-n reranking and policy evaluation both need "N sampled replies to each of these conversations
under fixed sampling settings"; this is that, once.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ..data.conversation import CHAT_TEMPLATE_KWARGS, turns_to_messages
from ..progress import progress_bar
from ..rewards.rerank import Ranked, rerank
from ..rewards.reward import PMIReward
from ..scoring.scorer import PMIScorer

__all__ = [
    "CHAT_TEMPLATE_KWARGS",
    "SamplingSettings",
    "Replies",
    "plain_sampling",
    "prompt_texts",
    "render_prompts",
    "stop_ids",
    "split_generated",
    "generate_replies",
    "sample_replies",
    "best_of_n",
]


# generate() settings whose values leave the tempered softmax as it is; a model's generation_config may set others
# (Qwen2.5-Instruct: repetition_penalty 1.05), which generate() applies unless they are overridden
_NEUTRAL = {
    "repetition_penalty": 1.0,
    "encoder_repetition_penalty": 1.0,
    "no_repeat_ngram_size": 0,
    "min_p": 0.0,
    "typical_p": 1.0,
    "epsilon_cutoff": 0.0,
    "eta_cutoff": 0.0,
    "min_length": 0,
    "min_new_tokens": 0,
}


def prompt_texts(tokenizer: Any, prompts: Sequence[Any]) -> list[str]:
    """What a chat model is given to reply to: chat messages in its template (with ``CHAT_TEMPLATE_KWARGS``: the
    same prompt every day), plain text as it is."""
    return [
        p
        if isinstance(p, str)
        else tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=False, **CHAT_TEMPLATE_KWARGS)
        for p in prompts
    ]


def render_prompts(tokenizer: Any, prompts: Sequence[Any], device: Any) -> dict[str, torch.Tensor]:
    """Prompts as one left-padded batch on ``device``: a reply follows its prompt, not pad tokens, whatever side the
    tokenizer pads on otherwise."""
    texts = prompt_texts(tokenizer, prompts)
    side, tokenizer.padding_side = tokenizer.padding_side, "left"
    try:
        return tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(device)
    finally:
        tokenizer.padding_side = side


def plain_sampling(model: Any) -> dict[str, Any]:
    """``generate()`` overrides that switch off the warpers a model's ``generation_config`` adds (repetition penalty,
    min-p, typical-p, n-gram blocking, a minimum length): the replies then come from the tempered (top-p) softmax
    that PPO's ratios and the evaluation's KL compute, not from another distribution."""
    config = getattr(model, "generation_config", None)
    return {k: v for k, v in _NEUTRAL.items() if getattr(config, k, None) not in (None, v)}


@dataclass
class SamplingSettings:
    """How replies are sampled (the same settings for every policy that is compared)."""

    max_new_tokens: int = field(default=48, metadata={"help": "longest reply sampled, in tokens"})
    temperature: float = field(default=0.8, metadata={"help": "sampling temperature (0: greedy)"})
    top_p: float = field(
        default=0.95,
        metadata={"help": "nucleus sampling: draw from the likeliest tokens of this much mass (0: greedy)"},
    )
    batch_size: int = field(
        default=32,
        metadata={
            "help": "sequences per generate call; one seed per call, so a prompt's samples depend on it and on the "
            "prompts beside it (reproducible with the same settings and prompts, not across batch sizes)"
        },
    )
    seed: int = field(
        default=0, metadata={"help": "sampling seed: each generate call is seeded from it and the call's position"}
    )

    def __post_init__(self) -> None:
        """Refuse settings that generate cannot use when they are read, not after the models have loaded."""
        for name in ("max_new_tokens", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not self.temperature >= 0:
            raise ValueError(f"temperature must be >= 0 (0: greedy), got {self.temperature}")
        if not 0 <= self.top_p <= 1:  # generate() fails on a negative top_p and reads one above 1 as 1
            raise ValueError(f"top_p must be in [0, 1] (0: greedy), got {self.top_p}")


@dataclass
class Replies:
    """Sampled replies, rows are prompts and columns their ``n`` samples: the text, the generated token ids (up to
    and including the first end-of-sequence token) and whether generation was cut at ``max_new_tokens``. Replies
    read back from a ``samples.jsonl`` keep only their token ``counts`` (no ids: nothing to measure KL on)."""

    texts: list[list[str]]
    tokens: list[list[list[int]]]
    truncated: list[list[bool]]
    counts: list[list[int]] | None = None

    def token_counts(self) -> list[list[int]]:
        """Generated tokens per reply (rows: prompts)."""
        return self.counts if self.counts is not None else [[len(t) for t in row] for row in self.tokens]

    def flat(self) -> list[str]:
        return [t for row in self.texts for t in row]

    def truncated_share(self) -> float:
        """Share of replies that did not end with an end-of-sequence token (cut at the token limit)."""
        flags = [f for row in self.truncated for f in row]
        return sum(flags) / len(flags) if flags else 0.0


def stop_ids(model, tokenizer) -> set[int]:
    """Token ids that end a generation: the model's and the tokenizer's EOS, and the pad token (which only
    follows an EOS in a batch), as TRL counts a completion as not truncated."""
    eos = model.generation_config.eos_token_id
    ids = set(eos if isinstance(eos, list) else [eos]) | {tokenizer.eos_token_id, tokenizer.pad_token_id}
    return {int(i) for i in ids if i is not None}


def _forked_rng(device: torch.device | None) -> contextlib.AbstractContextManager:
    """A scope whose end restores the torch RNG states that ``torch.manual_seed`` reseeds: the CPU's, and those of
    every device of the model's accelerator type (for a model on the CPU, of the machine's accelerator when it is
    initialized). The sampler seeds each batch itself; without the scope every later draw of its caller (a shuffled
    DataLoader's epoch seed, dropout, randperm) came out the same whatever the caller had seeded."""
    kind: str | None = "cpu" if device is None else device.type
    if kind == "cpu":
        accelerator = torch.accelerator.current_accelerator()
        module = torch.get_device_module(accelerator.type) if accelerator is not None else None
        started = accelerator is not None and getattr(module, "is_initialized", lambda: False)()
        kind = accelerator.type if accelerator is not None and started else None
    if kind is None:
        return torch.random.fork_rng(devices=[])
    return torch.random.fork_rng(devices=range(torch.get_device_module(kind).device_count()), device_type=kind)


def split_generated(row: list[int], stops: set[int]) -> tuple[list[int], bool]:
    """A generated row as (its tokens up to and including the first stop token, whether it was cut: no stop)."""
    for i, token in enumerate(row):
        if token in stops:
            return row[: i + 1], False
    return row, True


@torch.no_grad()
def generate_replies(
    model,
    tokenizer,
    prompts: Sequence[list[dict] | str],
    n: int = 1,
    settings: SamplingSettings | None = None,
    progress: bool | str = False,
) -> Replies:
    """``n`` sampled replies for each prompt (chat messages, or plain text used as is), with their tokens and
    truncation flags.

    Prompts are rendered with the tokenizer's chat template and left-padded; each batch is seeded from
    ``settings.seed`` and its position, so a run is reproducible and two models see the same seeds. The seeding is
    done in a forked RNG scope: the caller's torch RNG states are as they were when this returns.
    """
    settings = settings or SamplingSettings()
    if n < 1:
        raise ValueError("n must be >= 1")
    flat = [t for t in prompt_texts(tokenizer, prompts) for _ in range(n)]
    side, tokenizer.padding_side = tokenizer.padding_side, "left"
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    stops = stop_ids(model, tokenizer)
    out: list[tuple[list[int], bool]] = []
    starts = range(0, len(flat), settings.batch_size)
    desc = progress if isinstance(progress, str) else "sampling"
    try:
        with _forked_rng(device):
            for b, s in enumerate(progress_bar(starts, desc=desc, disable=not progress, unit="batch")):
                batch = tokenizer(
                    flat[s : s + settings.batch_size], return_tensors="pt", padding=True, add_special_tokens=False
                ).to(device)
                torch.manual_seed(settings.seed * 1_000_003 + b)
                sample = settings.temperature > 0
                ids = model.generate(
                    **batch,
                    max_new_tokens=settings.max_new_tokens,
                    do_sample=sample,
                    temperature=settings.temperature if sample else None,
                    top_p=settings.top_p if sample else None,
                    top_k=None,
                    pad_token_id=tokenizer.pad_token_id,
                    **plain_sampling(model),
                )
                out += [split_generated(row, stops) for row in ids[:, batch["input_ids"].shape[1] :].tolist()]
    finally:
        tokenizer.padding_side = side
        model.train(was_training)
    decoded = [t.strip() for t in tokenizer.batch_decode([tokens for tokens, _ in out], skip_special_tokens=True)]
    rows = range(len(prompts))
    return Replies(
        texts=[decoded[i * n : (i + 1) * n] for i in rows],
        tokens=[[tokens for tokens, _ in out[i * n : (i + 1) * n]] for i in rows],
        truncated=[[cut for _, cut in out[i * n : (i + 1) * n]] for i in rows],
    )


def sample_replies(
    model,
    tokenizer,
    prompts: Sequence[list[dict] | str],
    n: int = 1,
    settings: SamplingSettings | None = None,
    progress: bool | str = False,
) -> list[list[str]]:
    """``n`` sampled replies for each prompt, as text (``generate_replies`` also gives tokens and truncation)."""
    return generate_replies(model, tokenizer, prompts, n, settings, progress).texts


def best_of_n(
    scorer: PMIScorer | PMIReward,
    model,
    tokenizer,
    context: Any,
    n: int = 8,
    settings: SamplingSettings | None = None,
    system_prompt: str | None = None,
) -> Ranked:
    """Sample ``n`` replies to ``context`` from a chat model and return them ranked (best first)."""
    messages = context if isinstance(context, list) else turns_to_messages(context, system_prompt)
    replies = sample_replies(model, tokenizer, [messages], n, settings)[0]
    return rerank(scorer, messages, replies)

"""MEEP baseline: ask a chat LM how engaging a response is (0-100) and average a few sampled answers.

MEEP (Ferron et al., 2023) prompts an LLM with a definition of engagingness and asks for a score; it
needs no training and no negatives, which makes it the zero-shot reference point of the study. Small
models answer loosely ("Score: 85/100", "I'd say 70."), so ``parse_score`` reads the first usable
number and a row where no sample parses gets ``fallback`` (the scale's midpoint by default), never NaN.
Sampling prefills each prompt once and draws all samples from the shared cache, which matters on CPU.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from ...data.conversation import CHAT_TEMPLATE_KWARGS
from ...progress import progress_bar
from ...scoring.models import load_causal_lm, load_tokenizer
from .jsonl_cache import JsonlCache
from .lm_pmi import end_of_turn

__all__ = ["MEEP_PROMPT", "MEEPConfig", "MEEPScorer", "parse_score"]

MEEP_PROMPT = (
    "Rate how engaging the response is as the next turn of the dialogue, on a scale from 0 (not engaging at "
    "all) to 100 (extremely engaging). An engaging response fits the context, is specific and interesting, "
    "varies with what was said, invites the other person to reply and to reply well, and makes them feel "
    "heard and included.\n\nDialogue context:\n{context}\n\nResponse:\n{response}\n\n"
    "Answer with the score only, a number from 0 to 100."
)

# A number glued to a Latin word ("SmolLM2", "v3") is no score; one right after a Chinese or Japanese letter is
# ("打85分", "参与度为85%"): those scripts put no space before a number, so ``\w`` here missed most zh answers.
_GLUED = r"\dA-Za-z_"
_NUMBER = re.compile(rf"(?<![{_GLUED}./])(-?\d+(?:\.\d+)?)\s*(%|(?:/|out\s+of)\s*(\d+(?:\.\d+)?))?")
_SCALE = re.compile(
    rf"(?<![{_GLUED}.])[01]\s*(?:-|–|~|～|to|到|至)\s*(?:5|10|100)(?![{_GLUED}.])"
)  # "0-100", "1 to 10", "0到100分": the scale, not a score
_CUT_FRACTION = re.compile(r"\s*(?:/|out(?:\s+of)?)\s*$")  # a fraction cut at the end of the answer


def parse_score(text: str, low: float = 0.0, high: float = 100.0) -> float | None:
    """The first number in ``text`` that reads as a score in [low, high], or None.

    "85", "Score: 85/100", "I'd say 70." and "85%" give 85/85/70/85; "8/10", "8 out of 10" and "4.5/5"
    are rescaled to the 0-100 scale; a mention of the scale ("0-100") is skipped, as are numbers outside
    [low, high] and fractions cut before their denominator ("3.8 / ", at the token limit); text without a usable
    number gives None.
    """
    if not isinstance(text, str):
        return None
    text = _SCALE.sub(" ", text)
    for match in _NUMBER.finditer(text):
        value = float(match.group(1))
        if not match.group(2) and _CUT_FRACTION.match(text, match.end()):
            continue  # "3.8 / " or "7 out of": an answer cut before its denominator, whose scale is unknown
        if match.group(3):  # a fraction: rescale x / d to the [low, high] scale
            denominator = float(match.group(3))
            if denominator <= 0 or value > denominator or value < 0:
                continue
            value = low + value / denominator * (high - low)
        if low <= value <= high:
            return value
    return None


@dataclass
class MEEPConfig:
    """Which chat LM answers, how many samples are averaged, and how long they may be."""

    model: str = "smollm2-135m-instruct"
    dtype: str = "bfloat16"
    n_samples: int = 3
    temperature: float = 0.7  # 0: greedy (then one sample is enough)
    max_new_tokens: int = 8
    batch_size: int = 8
    max_context_chars: int = 1200  # long contexts keep their most recent part
    fallback: float = 50.0
    prompt: str = MEEP_PROMPT
    answer_prefix: str = "Score:"  # the answer starts here, so that small models go straight to a number
    seed: int = 0


class MEEPScorer:
    """Scores (context, response) pairs with the mean parsed MEEP answer; optional on-disk answer cache."""

    def __init__(
        self, config: MEEPConfig | None = None, model=None, tokenizer=None, cache_file: str | Path | None = None
    ) -> None:
        self.config = config or MEEPConfig()
        self.tokenizer = tokenizer if tokenizer is not None else load_tokenizer(self.config.model)
        self.tokenizer.padding_side = "left"
        self.model = model if model is not None else load_causal_lm(self.config.model, self.config.dtype)
        self.model.eval()
        # an answer stops at the template's end of turn or at eos (they differ for Gemma's, Qwen base tokenizers)
        ends = {self.tokenizer.eos_token_id, self.tokenizer.convert_tokens_to_ids(end_of_turn(self.tokenizer))}
        self._stops = sorted(ends - {None})
        if not self._stops:
            raise ValueError(f"{self.config.model}: the tokenizer has no end-of-turn or eos token to stop an answer")
        self._answers = JsonlCache(cache_file, field="answers")
        self.parse_rate = float("nan")

    def prompts(self, contexts: Sequence[str], responses: Sequence[str]) -> list[str]:
        """The chat-formatted prompts, one per pair."""
        out = []
        for context, response in zip(contexts, responses, strict=True):
            context = context[-self.config.max_context_chars :] if context else "(no context)"
            text = self.config.prompt.replace("{context}", context).replace("{response}", response)
            chat = self.tokenizer.apply_chat_template(
                [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False, **CHAT_TEMPLATE_KWARGS
            )
            out.append(chat + self.config.answer_prefix)
        return out

    def _key(self, prompt: str) -> str:
        c = self.config
        setting = [c.model, c.dtype, c.n_samples, c.temperature, c.max_new_tokens, c.seed]
        if self._stops != [self.tokenizer.eos_token_id]:  # answers from before the end of turn stopped them too
            setting.append(self._stops)
        return hashlib.sha1((json.dumps(setting) + prompt).encode("utf-8")).hexdigest()

    def answers(self, prompts: Sequence[str], progress: bool = False) -> list[list[str]]:
        """``n_samples`` generated answers per prompt (cached by prompt and setting)."""
        keys = [self._key(p) for p in prompts]
        missing = {k: p for k, p in zip(keys, prompts, strict=True) if k not in self._answers}
        todo = sorted(missing.items(), key=lambda kv: len(kv[1]))  # similar lengths share a batch
        bs = self.config.batch_size
        for s in progress_bar(range(0, len(todo), bs), desc="MEEP", disable=not progress, unit="batch"):
            batch = todo[s : s + bs]
            generator = torch.Generator().manual_seed(self.config.seed + s)
            texts = self._sample([p for _, p in batch], generator)
            self._answers.add({k: t for (k, _), t in zip(batch, texts, strict=True)})
        return [self._answers[k] for k in keys]

    def score(self, contexts: Sequence[str], responses: Sequence[str], progress: bool = False) -> np.ndarray:
        """float32 mean parsed score per pair; ``fallback`` where no sample parses (see ``parse_rate``)."""
        answers = self.answers(self.prompts(contexts, responses), progress)
        parsed = [[v for v in map(parse_score, texts) if v is not None] for texts in answers]
        n_samples = sum(len(texts) for texts in answers)
        self.parse_rate = sum(map(len, parsed)) / n_samples if n_samples else float("nan")
        return np.array([np.mean(p) if p else self.config.fallback for p in parsed], dtype=np.float32)

    @torch.inference_mode()
    def _sample(self, prompts: list[str], generator: torch.Generator) -> list[list[str]]:
        """Prefill the batch once, then draw ``n_samples`` continuations per prompt from the shared cache."""
        n, c = self.config.n_samples, self.config
        enc = self.tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        mask = enc["attention_mask"]
        device = next(self.model.parameters()).device
        out = self.model(
            input_ids=enc["input_ids"].to(device),
            attention_mask=mask.to(device),
            position_ids=(mask.cumsum(-1) - 1).clamp(min=0).to(device),
            use_cache=True,
        )
        cache = out.past_key_values
        cache.batch_repeat_interleave(n)
        logits = out.logits[:, -1].float().repeat_interleave(n, 0).cpu()
        mask = mask.repeat_interleave(n, 0)
        stops = torch.tensor(self._stops)
        tokens = torch.zeros(len(mask), 0, dtype=torch.long)
        done = torch.zeros(len(mask), dtype=torch.bool)
        for _ in range(c.max_new_tokens):
            if c.temperature > 0:
                probs = torch.softmax(logits / c.temperature, dim=-1)
                step = torch.multinomial(probs, 1, generator=generator).squeeze(1)
            else:
                step = logits.argmax(-1)
            step = torch.where(done, stops[0], step)
            tokens = torch.cat([tokens, step[:, None]], dim=1)
            done |= torch.isin(step, stops)
            if done.all():
                break
            mask = torch.cat([mask, torch.ones(len(mask), 1, dtype=mask.dtype)], dim=1)
            out = self.model(
                input_ids=step[:, None].to(device),
                attention_mask=mask.to(device),
                position_ids=(mask.sum(-1, keepdim=True) - 1).to(device),
                past_key_values=cache,
                use_cache=True,
            )
            cache, logits = out.past_key_values, out.logits[:, -1].float().cpu()
        texts = self.tokenizer.batch_decode(tokens, skip_special_tokens=True)
        return [texts[i * n : (i + 1) * n] for i in range(len(prompts))]

    def describe(self) -> dict:
        return {**asdict(self.config), "parse_rate": self.parse_rate}

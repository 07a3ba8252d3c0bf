"""Zero-shot PMI read off a chat LM: log p(r | c) - log p(r), both from the same causal LM, no training at all.

This is the maximum-mutual-information score of Li et al. (2016): the LM's likelihood of the reply after the
conversation, minus its likelihood as the assistant's opening line with no conversation (the LM's own estimate
of how likely the reply is anywhere). A generic reply ("ok", "that's interesting") is likely with or without the
context, so it scores near 0; a reply that answers this context gains from it. Unlike a trained head it learns
nothing from a corpus, so it cannot lose the LM's general sense of relevance to one; it is the reference point
for what a trained scorer adds. The reply is scored with its end-of-turn token, the one the chat template closes an
assistant turn with (Gemma's ``<end_of_turn>``, not its ``<eos>``; see ``end_of_turn``), so a reply cut short is
judged as the LM would judge a reply that stops there.

Each context is encoded once and its replies are scored from the shared KV cache, which matters on a CPU: a
context is ~3x as long as a reply. A pass holds at most ``max_batch_tokens`` padded reply tokens (the logits are
that many times a 49k vocabulary) and a reply is read up to ``max_reply_tokens``, so one pasted essay among the
replies cannot exhaust the memory. ``context_turns`` lets ``PMIReward`` wrap it, e.g. as a policy judge
(``evaluate-policy --judges name=lm:MODEL``). Log-likelihoods are cached by setting, context and reply (optionally
in a JSONL file), so the per-token variant and repeated evaluations cost nothing more.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from ...data.conversation import CHAT_TEMPLATE_KWARGS, DEFAULT_SYSTEM_PROMPT, turns_to_messages
from ...progress import progress_bar
from ...scoring.encoder import default_device
from ...scoring.models import load_causal_lm, load_tokenizer, pad_token_ids
from .jsonl_cache import JsonlCache

__all__ = ["LMPMIConfig", "LMPMIScorer", "end_of_turn"]

_MARKER = "\u2063"  # an invisible separator: no template writes one, so it marks where the probe's reply ends


def end_of_turn(tokenizer) -> str | None:
    """The token the tokenizer's chat template closes an assistant turn with: the first special (or added) token
    it writes after the reply of a one-user, one-assistant chat. It is not always ``eos_token``: Gemma ends turns
    with ``<end_of_turn>`` (eos ``<eos>``), Qwen's base tokenizers with ``<|im_end|>`` (eos ``<|endoftext|>``).
    A tokenizer without a template, a template that refuses that chat or writes no such token after the reply:
    ``eos_token`` (None where there is none)."""
    chat = [{"role": "user", "content": "x"}, {"role": "assistant", "content": _MARKER}]
    try:
        text = tokenizer.apply_chat_template(chat, tokenize=False, **CHAT_TEMPLATE_KWARGS)
    except Exception:  # no template (ValueError), or one that refuses this chat: a raise_exception, whatever else
        return tokenizer.eos_token
    if not isinstance(text, str) or _MARKER not in text:
        return tokenizer.eos_token
    ids = tokenizer(text.split(_MARKER, 1)[1], add_special_tokens=False)["input_ids"]
    special = set(tokenizer.all_special_ids) | set(tokenizer.added_tokens_decoder)
    return next((tokenizer.convert_ids_to_tokens(i) for i in ids if i in special), tokenizer.eos_token)


@dataclass
class LMPMIConfig:
    """Which chat LM reads the replies, and how its log-likelihoods become a score."""

    model: str = "smollm2-135m-instruct"
    dtype: str = "float32"
    system_prompt: str | None = DEFAULT_SYSTEM_PROMPT  # the policy's; '' or None for none (see _opening)
    per_token: bool = False  # mean log-ratio per reply token instead of the sum (the PMI in nats)
    batch_size: int = 32  # replies scored together from one context's cache
    max_batch_tokens: int = 4096  # replies x padded length per pass: bounds the logits' memory (x 49k vocabulary)
    max_reply_tokens: int = 256  # a longer reply is judged on its first tokens, as the encoders truncate
    max_context_chars: int = 1200  # long contexts keep their most recent part
    context_turns: int | None = 3  # turns a reward or judge passes on (``PMIReward`` reads it), as the scorers'


class LMPMIScorer:
    """Scores (context, response) pairs with log p_LM(r | c) - log p_LM(r); contexts are turns, one per line.

    Log-likelihoods are cached by setting, context and reply: in ``cache_file`` too where given (evaluations read
    the same pairs again), and at most ``cache_entries`` of them in memory where given, the oldest dropped first
    (an RL reward reads new replies every step, so an unbounded cache would only grow; values are the same)."""

    def __init__(
        self,
        config: LMPMIConfig | None = None,
        model=None,
        tokenizer=None,
        cache_file: str | Path | None = None,
        cache_entries: int | None = None,
    ) -> None:
        self.config = config or LMPMIConfig()
        self.tokenizer = tokenizer if tokenizer is not None else load_tokenizer(self.config.model)
        if model is None:  # on the GPU where there is one, as the policies and the trained scorers
            model = load_causal_lm(self.config.model, self.config.dtype).to(default_device())
        self.model = model
        self.model.eval()
        end = end_of_turn(self.tokenizer)
        if end is None:
            raise ValueError(f"{self.config.model}: the tokenizer has no end-of-turn (or eos) token to close a reply")
        self._end = end
        self._cache = JsonlCache(cache_file, max_entries=cache_entries)  # key -> [log-likelihood, reply tokens]

    @property
    def context_turns(self) -> int | None:
        """The context turns ``PMIReward`` passes on, so the LM can stand where a trained scorer does."""
        return self.config.context_turns

    def prefix(self, context: str | None) -> list[int]:
        """Token ids of the chat up to the assistant's reply: the conversation's turns, or none (the marginal)."""
        text = context[-self.config.max_context_chars :] if context else ""
        messages = turns_to_messages(text, self.config.system_prompt or None)
        if not messages:  # no system prompt and no conversation: templates refuse to render an empty chat
            return self._opening()
        chat = self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=False, **CHAT_TEMPLATE_KWARGS
        )
        return self.tokenizer(chat, add_special_tokens=False)["input_ids"]

    def _opening(self) -> list[int]:
        """The assistant's header after an empty conversation (the start-of-text token where the template writes
        one): what the template adds for a generation prompt, read off a one-message chat. A template that writes
        its own default system prompt when given none (SmolLM2's) writes it into p(r | c) only; set
        ``system_prompt`` to keep both terms alike."""
        probe = [{"role": "user", "content": "x"}]
        bare = self.tokenizer.apply_chat_template(probe, tokenize=False, **CHAT_TEMPLATE_KWARGS)
        full = self.tokenizer.apply_chat_template(
            probe, add_generation_prompt=True, tokenize=False, **CHAT_TEMPLATE_KWARGS
        )
        if not full.startswith(bare) or full == bare:
            raise ValueError(
                f"{self.config.model}: its chat template has no separate generation prompt, so p(r) with no system "
                "prompt and no conversation is undefined; set LMPMIConfig.system_prompt"
            )
        header, bos = full[len(bare) :], self.tokenizer.bos_token
        start = bos if bos and bare.startswith(bos) and not header.startswith(bos) else ""  # SmolLM2's bos opens turns
        return self.tokenizer(start + header, add_special_tokens=False)["input_ids"]

    def reply_ids(self, response: str) -> list[int]:
        """The reply's token ids with the end-of-turn token that closes it; a reply longer than
        ``max_reply_tokens`` keeps its first tokens and no end (judged as a reply cut there)."""
        ids = self.tokenizer(response + self._end, add_special_tokens=False)["input_ids"]
        return ids[: self.config.max_reply_tokens]

    def _batches(self, replies: list[list[int]]) -> list[list[int]]:
        """Indices of ``replies`` in batches of like lengths, each within ``batch_size`` replies and
        ``max_batch_tokens`` padded tokens (a reply longer than that budget goes alone)."""
        batches: list[list[int]] = []
        for i in sorted(range(len(replies)), key=lambda i: len(replies[i])):
            last = batches[-1] if batches else None
            if (
                last
                and len(last) < self.config.batch_size
                and (len(last) + 1) * len(replies[i]) <= self.config.max_batch_tokens
            ):
                last.append(i)
            else:
                batches.append([i])
        return batches

    @torch.inference_mode()
    def _log_likelihoods(self, prefix: list[int], replies: list[list[int]]) -> list[float]:
        """Sum of log p(token) over each reply after ``prefix``, from one pass over the prefix."""
        device = next(self.model.parameters()).device
        out = self.model(input_ids=torch.tensor([prefix], device=device), use_cache=True, logits_to_keep=1)
        first = torch.log_softmax(out.logits[0, -1].float(), -1)
        totals = [0.0] * len(replies)
        for rows in self._batches(replies):
            batch = [replies[i] for i in rows]
            ids, mask = pad_token_ids(batch, self.tokenizer.pad_token_id)
            width = ids.shape[1]
            cache = _repeat(out.past_key_values, len(batch))
            full = torch.cat([torch.ones(len(batch), len(prefix), dtype=torch.long), mask], 1)
            positions = len(prefix) + torch.arange(width).expand(len(batch), width)
            logits = (
                self.model(
                    input_ids=ids.to(device),
                    attention_mask=full.to(device),
                    position_ids=positions.to(device),
                    past_key_values=cache,
                )
                .logits[:, :-1]
                .float()
            )
            # log p(next token) without a vocabulary-wide copy of the logits (long replies x 49k tokens)
            logp = (logits.gather(-1, ids[:, 1:, None].to(device))[..., 0] - torch.logsumexp(logits, -1)).cpu()
            for i, (row, r) in enumerate(zip(rows, batch, strict=True)):
                totals[row] = float(first[r[0]]) + float(logp[i, : len(r) - 1].sum())
        return totals

    def _key(self, context: str | None, response: str) -> str:
        c = self.config
        setting = [c.model, c.dtype, c.system_prompt, c.max_context_chars, c.max_reply_tokens, context, response]
        if self._end != self.tokenizer.eos_token:  # keys from before the end came from the template closed with eos
            setting.append(self._end)
        return hashlib.sha1(json.dumps(setting).encode("utf-8")).hexdigest()

    def log_likelihoods(self, context: str | None, responses: Sequence[str]) -> list[tuple[float, int]]:
        """(log p(r | context), tokens) per reply; ``context`` None: the assistant's opening line with no
        conversation, log p(r). Cached by setting, context and reply (in memory and in ``cache_file``)."""
        keys = [self._key(context, r) for r in responses]
        # read off before adding: a bounded cache may drop this call's own entries to make room for the new ones
        values = {k: self._cache[k] for k in keys if k in self._cache}
        todo = {k: r for k, r in zip(keys, responses, strict=True) if k not in values}
        if todo:
            ids = [self.reply_ids(r) for r in todo.values()]
            lls = self._log_likelihoods(self.prefix(context), ids)
            new = {k: [ll, len(i)] for k, ll, i in zip(todo, lls, ids, strict=True)}
            self._cache.add(new)
            values.update(new)
        return [tuple(values[k]) for k in keys]

    def score(self, contexts: Sequence[str], responses: Sequence[str], progress: bool = False) -> np.ndarray:
        """float32 PMI per pair (nats, or nats per token with ``per_token``)."""
        if len(contexts) != len(responses):
            raise ValueError(f"{len(contexts)} contexts but {len(responses)} responses")
        distinct = sorted(set(responses))
        marginal = dict(zip(distinct, self.log_likelihoods(None, distinct), strict=True))
        by_context: dict[str, list[int]] = {}
        for i, c in enumerate(contexts):
            by_context.setdefault(c, []).append(i)
        pmi = np.zeros(len(responses), dtype=np.float64)
        for c, rows in progress_bar(by_context.items(), desc="LM PMI", unit="context", disable=not progress):
            for i, (ll, n) in zip(rows, self.log_likelihoods(c, [responses[i] for i in rows]), strict=True):
                pmi[i] = (ll - marginal[responses[i]][0]) / (n if self.config.per_token else 1)
        return pmi.astype(np.float32)

    def describe(self) -> dict:
        return asdict(self.config)


def _repeat(cache, n: int):
    """A copy of a batch-1 KV cache repeated ``n`` times (the original stays for the next batch)."""
    out = copy.deepcopy(cache)
    out.batch_repeat_interleave(n)
    return out

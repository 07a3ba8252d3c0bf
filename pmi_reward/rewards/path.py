"""The one reward path: samples -> text -> raw PMI -> shaped rewards.

Every PMI reward runs it: ``PMIReward`` scores in process, ``RemotePMIReward`` over HTTP (``POST /score``), the
server's ``/get_reward`` and ``/rerank`` through its micro-batcher, and the verl adapter through either reward.
Only the scoring step differs, so for the same scorer and options they all return the same rewards.

1. samples -> text (``RewardPath.texts``): prompts and completions (strings or chat messages) become a context
   written as the scorer was trained and a reply (a reasoning model's answer, without its ``<think>`` block),
   both cut to ``max_chars``; unreadable ones are None. A prompt string that a known chat template's markup opens
   is read as its messages (``read_prompt``), a plain one as one turn per line; either opens its reply's think block
   when it ends with ``<think>`` (``conversation.prompt_opens_think``, the server's rule too). A completion a chat
   parser already split (TRL's ``parse_response``: ``reasoning_content`` or ``thinking``, ``tool_calls``) is its
   ``content``: the answer (``think_answers``).
2. text -> raw PMI: a ``score(contexts, replies)`` callable on the readable pairs (NaN where a pair fails).
3. raw PMI -> rewards (``RewardPath.shape``): minus the expected PMI at the reply's length (with a
   ``length_baseline``), centred, scaled, clipped; ``empty_score`` for the rest (replies that
   are empty, unreadable or invisible: nothing but zero-width, control or blank characters). With
   ``center="group"`` the samples of one prompt (as given, not as the scorer reads it) are centred together, and a
   call whose prompt has a single completion is refused (``GroupError``), never given 0.0.

Samples without a readable context (none, or one that shows nothing: blank, or only zero-width or control
characters, by the scorer's own ``visible`` check) get ``empty_score``; they are counted in the
``<name>/no_context_frac`` metric and logged as a warning, since they usually mean a data problem (e.g. a verl row
with no conversation).
Scorable samples whose scoring failed (the scorer raised on them, alone too, or returned NaN) get ``empty_score``
as well, counted in ``<name>/score_failed_frac`` (their share of the scorable samples): at 1.0 every reward of the
call is ``empty_score``, a constant reward that trains on nothing, so a broken scorer shows in the trainer's metrics.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..data.conversation import (
    THINK_OPEN,
    completion_to_text,
    drop_assistant_think,
    drop_think_blocks,
    message_text,
    prompt_opens_think,
    prompt_to_context,
    strip_think,
    templated_prompt,
    think_unfinished,
)
from ..data.dialogues import speaker
from ..scoring.scorer import PMIScorer, visible
from .length import LengthBaseline
from .options import RewardOptions

__all__ = [
    "RewardPath",
    "RewardBatch",
    "Rewards",
    "GroupError",
    "readable",
    "visible",
    "plain",
    "cut_context",
    "cut_reply",
    "score_robustly",
    "reasoning_parsed",
    "parsed_call",
    "reasoning_cut",
    "think_answers",
    "read_prompt",
    "prompts_open_think",
    "prompt_key",
    "REASONING_KEYS",
]

logger = logging.getLogger(__name__)

Score = Callable[[list[str], list[str]], np.ndarray]
LogMetric = Callable[[str, float], None]


class GroupError(ValueError):
    """``center="group"`` on a call that holds a prompt with a single completion (its reward would be 0.0)."""


def readable(text: str) -> bool:
    """Whether ``text`` is valid Unicode (no lone surrogates, which no tokenizer can encode)."""
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


_PLAIN_DEPTH = 16  # far deeper than a reader looks (messages > message > content parts > part > text)


def plain(value: Any, depth: int = 0) -> Any:
    """Lists and dicts as Python objects: datasets (TRL's, verl's parquet rows) can hand numpy arrays of messages
    or strings. What lies deeper than any message is left as it is (nesting hundreds deep, e.g. in a request
    body, would exhaust the recursion limit)."""
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if depth >= _PLAIN_DEPTH:
        return value
    if isinstance(value, Mapping):
        return {k: plain(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v, depth + 1) for v in value]
    return value


# the fields a response parser puts a reply's reasoning in: TRL 1.16's response templates for Qwen3, Qwen3.5, GLM,
# Nemotron 3, Gemma 4 and the R1 distills write "reasoning_content", gpt-oss's and LFM2.5's "thinking"
REASONING_KEYS = ("reasoning_content", "thinking")


def _messages(completion: Any) -> bool:
    """Whether a completion is a list of messages (not a string)."""
    return isinstance(completion, Sequence) and not isinstance(completion, (str, bytes, bytearray))


def reasoning_parsed(completion: Any) -> bool:
    """Whether a completion is chat messages a response parser wrote: TRL (1.16) decodes a conversational completion
    with the tokenizer's ``parse_response`` when it has a response template (always with ``tools=``), giving
    ``{"role": "assistant", "reasoning_content" (gpt-oss, LFM2.5: "thinking"): ..., "content": <the answer>}``, with
    ``tool_calls`` in a tool run. Its ``content`` is the answer whether or not the template opened the think block.
    The parser leaves out empty fields: a parsed reply with no reasoning and no tool call looks like a plain decode,
    so whether a call's completions were parsed is decided for the whole call (``parsed_call``)."""
    return _messages(completion) and any(
        isinstance(m, dict) and ("tool_calls" in m or any(k in m for k in REASONING_KEYS)) for m in completion
    )


def parsed_call(completions: Sequence[Any]) -> bool:
    """Whether a call's completions were parsed by a response parser: TRL parses every completion of a call or none,
    so one that shows it (``reasoning_parsed``) tells for all, a reply whose empty reasoning the parser left out
    included (read as a plain decode under ``think_opened``, its answer was emptied)."""
    return any(reasoning_parsed(c) for c in completions)


def reasoning_cut(completion: Any) -> bool:
    """Whether a parsed completion ends inside its reasoning: its last message is the assistant's, with reasoning
    and an empty ``content``. A tool run finished its reasoning when it ends on a tool's result (its answer cut, or
    out of tool-calling turns) or on the assistant's own tool call (TRL 1.16 rolls back a tool result that would pass
    ``max_completion_length``; or the turns ran out after a call): neither is counted."""
    if not _messages(completion) or not completion:
        return False
    last = completion[-1]
    if not isinstance(last, dict) or speaker(last.get("role", "assistant")) != "assistant" or last.get("tool_calls"):
        return False
    reasoned = any(isinstance(r := last.get(k), str) and r.strip() for k in REASONING_KEYS)
    answer = message_text(last.get("content"))
    return reasoned and not (answer and answer.strip())


def think_answers(completions: Sequence[Any], opened: Sequence[bool]) -> tuple[list[str | None], list[bool]]:
    """Each completion's answer (``completion_to_text`` after its last ``</think>``: ``strip_think``; None where it is
    unreadable) and whether it is unfinished reasoning (empty: a block never closed, or ``reasoning_cut``).
    ``opened``: per completion, whether its prompt opened the think block (``think_opened``, or a prompt string
    that ends in ``<think>``: ``read_prompt``), so that text without ``</think>`` is reasoning; it applies to no
    completion of a parsed call (``parsed_call``), whose ``content`` is the answer (a template that parses cut
    reasoning as ``content``, as Nemotron 3's and the R1 distills' do, then has that reasoning scored)."""
    parsed = parsed_call(completions)
    answers: list[str | None] = []
    unfinished: list[bool] = []
    for completion, o in zip(completions, opened, strict=True):
        o = o and not parsed
        text = completion_to_text(completion)
        answers.append(strip_think(text, o) if text is not None else None)
        unfinished.append(bool(text and text.strip() and think_unfinished(text, o)) or reasoning_cut(completion))
    return answers, unfinished


def read_prompt(prompt: Any) -> tuple[Any, bool]:
    """A prompt as the reward reads it, and whether it opened its reply's think block: a string a known chat
    template's markup opens as its messages (``conversation.templated_prompt``: the context and rewards of the same
    conversation given as messages; read line by line, the context was the template's markup around the last turns),
    anything else as it is (a plain string is one turn per line). A plain string that ends with an opened ``<think>``
    (R1-Zero's "... User: q Assistant: <think>") opens the block as a template's generation prompt does, and that tag
    is no turn of its context: one rule with the server's ``split_query`` (``conversation.prompt_opens_think``)."""
    if isinstance(prompt, str):
        if (templated := templated_prompt(prompt)) is not None:
            return templated
        if prompt_opens_think(prompt):
            return prompt[: prompt.rfind(THINK_OPEN)], True
    return prompt, False


def prompts_open_think(prompts: Sequence[Any]) -> list[bool]:
    """Per prompt, whether it is a string that opened its reply's think block (``read_prompt``: a templated one whose
    generation prompt opened it, or a plain one ending with ``<think>``; a prompt given as one object for many samples
    is read once)."""
    return [opened for _, opened in _once(list(prompts), read_prompt)]


def prompt_key(prompt: Any) -> str | None:
    """A prompt as given (plain Python values), as canonical JSON: which GRPO group a sample is in. Prompts the
    scorer reads alike (that differ only in a dropped system prompt, in turns older than ``max_context_turns`` or
    beyond ``max_chars``) are still distinct prompts. Objects JSON cannot write are named by their type; None for a
    prompt JSON cannot order or nest (keys of mixed types, nesting past the recursion limit)."""
    try:
        return json.dumps(
            prompt, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=lambda o: f"<{type(o).__name__}>"
        )
    except (TypeError, ValueError, RecursionError):
        return None


def world_size() -> int:
    """How many processes train together (torch.distributed; 1 when it is not running)."""
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def _once(values: list, read: Callable[[Any], Any]) -> list:
    """``read`` of each of ``values``, called once per distinct object: ``/rerank`` (and ``rerank_many``) hand one
    context object for every candidate, and reading a long one per candidate held the interpreter for minutes.
    ``values`` holds the objects for the whole call, so that no id is reused."""
    done: dict[int, Any] = {}
    for v in values:
        if id(v) not in done:
            done[id(v)] = read(v)
    return [done[id(v)] for v in values]


def cut_context(text: str, max_chars: int) -> str:
    """A context keeps its last ``max_chars`` characters (the most recent turns)."""
    return text[-max_chars:]


def cut_reply(text: str, max_chars: int) -> str:
    """A reply keeps its first ``max_chars`` characters."""
    return text[:max_chars]


def checked_scores(scores: Any, n: int) -> np.ndarray:
    """A scorer's answer as float64, refused unless it holds one score per pair (a custom scorer's bug)."""
    scores = np.asarray(scores, dtype=np.float64).reshape(-1)
    if len(scores) != n:
        raise ValueError(f"the scorer returned {len(scores)} scores for {n} pairs")
    return scores


def score_robustly(scorer: PMIScorer, contexts: list[str], replies: list[str]) -> np.ndarray:
    """Scores of a batch; if the batch fails, pair by pair (NaN where a pair fails), so that one bad sample
    cannot sink the rest."""
    try:
        return checked_scores(scorer.score(contexts, replies), len(replies))
    except Exception as err:  # noqa: BLE001 - a reward call must not crash a training run
        logger.warning("pmi_reward: batch of %d failed (%s); scoring pair by pair", len(replies), err)
    out = np.full(len(replies), np.nan)
    for j, (c, r) in enumerate(zip(contexts, replies, strict=True)):
        try:
            out[j] = scorer.score([c], [r])[0]
        except Exception as err:  # noqa: BLE001
            logger.warning("pmi_reward: unscorable pair (%s)", err)
    return out


@dataclass
class RewardBatch:
    """One call's samples as scorer text: per-sample context and reply (None when unreadable), the indices
    of the samples worth scoring, how many replies were emptied by an unterminated think block, and each sample's
    group (its prompt's ``prompt_key``; None without a context; the whole list None when the options do not centre
    on groups, or for a batch built elsewhere: the samples are then grouped by context)."""

    contexts: list[str | None]
    replies: list[str | None]
    valid: list[int]
    unfinished_think: int = 0
    groups: list[str | None] | None = None

    @property
    def no_context(self) -> list[int]:
        """Indices of the samples whose prompt gave no readable context."""
        return [i for i, c in enumerate(self.contexts) if c is None]

    def pairs(self) -> tuple[list[str], list[str]]:
        """The (contexts, replies) of the scorable samples."""
        return [self.contexts[i] or "" for i in self.valid], [self.replies[i] or "" for i in self.valid]

    def chunks(self, size: int) -> Iterator[tuple[list[str], list[str]]]:
        """The scorable (contexts, replies), ``size`` pairs at a time."""
        contexts, replies = self.pairs()
        for s in range(0, len(replies), size):
            yield contexts[s : s + size], replies[s : s + size]

    def raw(self, scores: np.ndarray) -> np.ndarray:
        """Per-sample raw PMI: the scores of the scorable samples, NaN for the rest."""
        out = np.full(len(self.replies), np.nan)
        out[self.valid] = scores
        return out


@dataclass
class Rewards:
    """What a pass down the path gives: shaped rewards, raw PMI per sample (NaN: unscored), and the texts."""

    rewards: list[float | None]
    raw: np.ndarray
    batch: RewardBatch


class RewardPath:
    """Prompts and completions to rewards under ``options``; the scoring step is the caller's ``score``."""

    def __init__(self, options: RewardOptions) -> None:
        self.options = options
        self.__name__ = options.name
        self._warned_no_context = False
        self.length_baseline = LengthBaseline.load(options.length_baseline) if options.length_baseline else None

    @staticmethod
    def samples(prompts: Sequence[Any] | None, completions: Sequence[Any] | None) -> tuple[list, list]:
        """The samples as lists of plain Python values (numpy arrays become lists); a ValueError naming both lengths
        when they differ (a caller bug)."""
        prompts = _once(list(prompts), plain) if prompts is not None else []
        completions = [plain(c) for c in completions] if completions is not None else []
        if len(prompts) != len(completions):
            raise ValueError(
                f"got {len(prompts)} prompts but {len(completions)} completions; a reward needs one "
                "prompt per completion"
            )
        return prompts, completions

    def texts(
        self,
        prompts: Sequence[Any] | None,
        completions: Sequence[Any] | None,
        group_by: Sequence[str | None] | None = None,
    ) -> RewardBatch:
        """Step 1: the samples as scorer text (contexts keep their end, replies their start: ``max_chars``).
        ``group_by``: each sample's group name where the prompts do not say it (the server's queries parsed without
        ``prompts``, whose parsed prompt depends on each reply's length), None for its scored context."""
        opts = self.options
        prompts, completions = self.samples(prompts, completions)

        def context(prompt: Any) -> tuple[str | None, bool]:
            """The prompt's context, and whether its chat template opened a think block (``read_prompt``)."""
            prompt, opened = read_prompt(prompt)
            return turns(prompt), opened

        def turns(prompt: Any) -> str | None:
            if opts.strip_think:  # before the turns are cut: reasoning neither fills a turn nor hides one
                prompt = drop_think_blocks(prompt) if isinstance(prompt, str) else drop_assistant_think(prompt)
            c = prompt_to_context(prompt, opts.include_system, opts.max_context_turns)
            if c is None or not readable(c):
                return None
            c = cut_context(c, opts.max_chars)
            # a prompt with no turn (system only, blank, []), or only invisible ones ("\u200b": the scorer reads it
            # as blank), has no context to score against: unscored, flagged in no_context_frac
            return c if visible(c) else None

        read = _once(prompts, context)  # a prompt given as one object for many samples is read once
        contexts = [c for c, _ in read]
        groups: list[str | None] | None = None
        if opts.center == "group":  # a prompt JSON cannot write is grouped by its context ("\0": no JSON is alike)
            if group_by is None:
                keys = _once(prompts, prompt_key)
            else:  # a caller's names ("\1": no JSON is alike either)
                keys = [None if k is None else "\1" + k for k in group_by]
                if len(keys) != len(prompts):
                    raise ValueError(f"got {len(keys)} group names for {len(prompts)} samples")
            groups = [c if c is None else k or "\0" + c for k, c in zip(keys, contexts, strict=True)]
        unfinished = 0
        if opts.strip_think:  # the block is opened by the options, or per sample by its prompt string
            replies, cut = think_answers(completions, [opts.think_opened or opened for _, opened in read])
            unfinished = sum(cut)
        else:
            replies = [completion_to_text(c) for c in completions]
        replies = [cut_reply(r.strip(), opts.max_chars) if r is not None and readable(r) else None for r in replies]
        valid = [
            i for i, (c, r) in enumerate(zip(contexts, replies, strict=True)) if c is not None and r and visible(r)
        ]
        return RewardBatch(contexts, replies, valid, unfinished, groups)

    def shape(self, batch: RewardBatch, raw: np.ndarray, log_metric: LogMetric | None = None) -> list[float | None]:
        """Step 3: rewards from raw PMI (NaN where unscored): length-neutral (with a baseline), centred, scaled,
        clipped; ``empty_score`` for the rest."""
        opts = self.options
        shaped = raw.copy()
        if self.length_baseline is not None and batch.valid:
            lengths = self.length_baseline.words([batch.replies[i] or "" for i in batch.valid])
            shaped[batch.valid] -= self.length_baseline.expected(lengths)
        if opts.center == "group":
            for members in self.groups(batch).values():
                scored = [i for i in members if math.isfinite(raw[i])]
                if scored:
                    shaped[scored] -= shaped[scored].mean()
        shaped *= opts.scale
        if opts.clip is not None:
            shaped = np.clip(shaped, -opts.clip, opts.clip)
        if len(raw):
            self._warn_no_context(batch)
            if log_metric is not None:
                self._log(log_metric, raw, shaped, batch)
        return [float(r) if math.isfinite(r) else opts.empty_score for r in shaped]

    def groups(self, batch: RewardBatch) -> dict[str, list[int]]:
        """The samples of each prompt (a GRPO group: the prompt as given, not the context the scorer reads, which
        prompts that differ only in what it drops share); a GroupError if a prompt has a single sample, whose
        centred reward would be 0.0 whatever the reply, or when several processes each score a slice of the batch."""
        if (processes := world_size()) > 1:
            raise GroupError(
                f"center='group' subtracts the mean PMI of each prompt's completions within one call, but {processes} "
                "processes each score their own slice of the batch, and a prompt's completions can sit on different "
                "processes: each part would be centred on its own mean, which can flip the sign of an advantage. Use "
                "center='none': GRPO and RLOO centre each group's rewards over all processes themselves"
            )
        groups: dict[str, list[int]] = {}
        for i, key in enumerate(batch.groups if batch.groups is not None else batch.contexts):
            if key is not None:
                groups.setdefault(key, []).append(i)
        lonely = [members[0] for members in groups.values() if len(members) == 1]
        if lonely:
            raise GroupError(
                f"center='group' subtracts the mean PMI of each prompt's completions, but {len(lonely)} of the "
                f"{len(batch.contexts)} samples in this call are the only completion of their prompt (first: sample "
                f"{lonely[0]}), so their reward would be 0.0 whatever the reply. Callers that send one sample per "
                "call (OpenRLHF >= 0.9.1's /get_reward, verl's reward loop and naive reward manager) cannot centre "
                "here: use center='none' and let the trainer's group advantage centre (OpenRLHF "
                "--algo.advantage.estimator group_norm, verl algorithm.adv_estimator=grpo)"
            )
        return groups

    def measure(
        self,
        prompts: Sequence[Any] | None,
        completions: Sequence[Any] | None,
        score: Score,
        group_by: Sequence[str | None] | None = None,
    ) -> tuple[RewardBatch, np.ndarray]:
        """Steps 1 and 2: the samples as text and their raw PMI (NaN where unscored), unshaped (reranking)."""
        batch = self.texts(prompts, completions, group_by)
        return batch, batch.raw(score(*batch.pairs()))

    def run(
        self,
        prompts: Sequence[Any] | None,
        completions: Sequence[Any] | None,
        score: Score,
        log_metric: LogMetric | None = None,
        group_by: Sequence[str | None] | None = None,
    ) -> Rewards:
        """The whole path with a synchronous scoring step (``group_by``: as in ``texts``)."""
        batch, raw = self.measure(prompts, completions, score, group_by)
        return Rewards(self.shape(batch, raw, log_metric), raw, batch)

    async def run_async(
        self,
        prompts: Sequence[Any] | None,
        completions: Sequence[Any] | None,
        score: Callable[[list[str], list[str]], Awaitable[np.ndarray]],
        log_metric: LogMetric | None = None,
    ) -> Rewards:
        """The whole path with an asynchronous scoring step (a remote scorer)."""
        batch = self.texts(prompts, completions)
        raw = batch.raw(await score(*batch.pairs()))
        return Rewards(self.shape(batch, raw, log_metric), raw, batch)

    def _log(self, log_metric: LogMetric, raw: np.ndarray, rewards: np.ndarray, batch: RewardBatch) -> None:
        name, n, n_valid = self.__name__, len(raw), len(batch.valid)
        log_metric(f"{name}/empty_frac", 1.0 - n_valid / n)
        log_metric(f"{name}/no_context_frac", len(batch.no_context) / n)
        log_metric(f"{name}/think_unfinished_frac", batch.unfinished_think / n)
        ok = np.isfinite(raw)
        # the scorable samples whose score failed (NaN: empty_score), which empty_frac does not count: 1.0 when the
        # scorer fails on everything (a missing package, a lost device), whose every reward is then the same
        log_metric(f"{name}/score_failed_frac", float((~ok[batch.valid]).mean()) if n_valid else 0.0)
        if ok.any():  # not when every scorable pair failed: a NaN would blank the trainer's step average
            log_metric(f"{name}/raw_pmi_mean", float(raw[ok].mean()))
            clipped = np.abs(rewards[ok]) >= self.options.clip if self.options.clip else np.zeros(n_valid, bool)
            log_metric(f"{name}/clipped_frac", float(clipped.mean()))

    def _warn_no_context(self, batch: RewardBatch) -> None:
        """A warning the first time samples come without a readable context (then at debug level: once per run is
        enough to notice, every step would flood the log)."""
        missing = batch.no_context
        if not missing:
            return
        level = logging.DEBUG if self._warned_no_context else logging.WARNING
        self._warned_no_context = True
        logger.log(
            level,
            "%s: %d of %d samples have no readable context (first: sample %d); they get empty_score=%s. "
            "Metric: %s/no_context_frac",
            self.__name__,
            len(missing),
            len(batch.contexts),
            missing[0],
            self.options.empty_score,
            self.__name__,
        )

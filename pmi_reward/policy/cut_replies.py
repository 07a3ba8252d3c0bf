"""Replies cut at the token limit, trained as they were sampled.

TRL closes every completion it trains with the end of turn: a chat message through the chat template, a text
completion with ``eos_token``. A reply the policy never ended (cut at ``rollout_max_new_tokens``, kept with
``drop_truncated false``) went into SFT and DPO as if the policy had ended it there: as DPO's rejected reply (the
setting of a truncation penalty) it lowered the end of turn's probability after the cut text, teaching the policy
not to stop; as a kept reply, to stop mid-sentence. These trainers put the reply's sampled ids, which hold no end of
turn, in place of TRL's tokens of it. A finished reply trains as TRL renders it.

A row marks a cut reply by a ``<key>_cut_ids`` column (``completion_cut_ids``; ``chosen_cut_ids``,
``rejected_cut_ids``): the sampled ids, or ``[]`` for a finished reply.

A cut reply follows its prompt's own tokens, as the policy was given them, not TRL's: TRL starts a completion where
the tokenized prompt and prompt + completion diverge, so a text prompt ending in " Wow!" before a reply "!!" lost
its "!" (merged into "!!!" on re-tokenization), and the sampled ids followed a context the policy never saw.

Chat prompts are rendered as the sampler rendered them, with ``CHAT_TEMPLATE_KWARGS`` (a pinned date for the
templates that write today's): these trainers give TRL a ``chat_template_kwargs`` column holding them unless the
dataset has its own, and a cut reply's prompt is rendered with the row's.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

from trl import DPOTrainer, SFTTrainer

from .sampling import CHAT_TEMPLATE_KWARGS, Replies

__all__ = ["CUT", "cut_ids", "CutRepliesSFTTrainer", "CutRepliesDPOTrainer"]

CUT = "_cut_ids"  # the suffix of a reply's cut-ids column
KWARGS = "chat_template_kwargs"  # TRL's column of a row's apply_chat_template keywords


def cut_ids(replies: Replies, i: int, j: int) -> list[int]:
    """Prompt ``i``'s reply ``j`` as sampled if it was cut at the token limit, else ``[]``."""
    return [int(t) for t in replies.tokens[i][j]] if replies.truncated[i][j] else []


def prompt_ids(
    processing_class: Any, prompt: str | list, chat_template_kwargs: Mapping[str, Any] | None = None
) -> list[int]:
    """A prompt's tokens alone, as TRL tokenizes a prompt (and the sampler gave it to the policy, but for a BOS token
    a tokenizer adds to a text prompt, which TRL's finished rows carry too: SmolLM2 adds none): a text prompt
    through the processing class, chat messages through its chat template with the generation prompt and
    ``chat_template_kwargs`` (the row's, as TRL renders it; by default ``CHAT_TEMPLATE_KWARGS``, as the sampler)."""
    if isinstance(prompt, str):
        return list(processing_class(text=prompt)["input_ids"])
    kwargs = CHAT_TEMPLATE_KWARGS if chat_template_kwargs is None else chat_template_kwargs
    chat = processing_class.apply_chat_template(
        prompt, tokenize=True, return_dict=True, add_generation_prompt=True, **kwargs
    )
    return list(chat["input_ids"])


def _pin_chat_template(dataset: Any) -> tuple[Any, bool]:
    """``dataset`` with a ``chat_template_kwargs`` column of ``CHAT_TEMPLATE_KWARGS`` unless it has its own (TRL then
    renders its chat prompts as the sampler did, not with today's date), and whether the column was added."""
    if KWARGS in (dataset.column_names or []):
        return dataset, False
    return dataset.map(lambda _: {KWARGS: dict(CHAT_TEMPLATE_KWARGS)}), True


def _sft_row(row: dict, column: str, max_length: int | None, mode: str, processing_class: Any) -> dict:
    """A tokenized SFT row whose completion is a cut reply: its prompt's own tokens, then the sampled ids (all
    trained), cut to ``max_length`` as TRL cut the row (``mode``: keep_start or keep_end)."""
    cut = row[column]
    if cut:
        context = prompt_ids(processing_class, row["prompt"], row.get(KWARGS))
        ids, labels = context + cut, [-100] * len(context) + cut
        if max_length is not None:
            kept = slice(None, max_length) if mode == "keep_start" else slice(-max_length, None)
            ids, labels = ids[kept], labels[kept]
        row["input_ids"], row["labels"] = ids, labels
    return row


def check_sft_settings(packing: bool, completion_only_loss: bool | None) -> None:
    """Refuse SFT settings under which a cut reply cannot train as sampled: packing joins rows, and without the loss
    on completions alone TRL's own labels, end of turn included, would be trained."""
    if packing or completion_only_loss is False:
        raise ValueError(
            "drop_truncated false keeps cut replies, which train as sampled (no end of turn) only with the loss on "
            "completions and no packing: completion_only_loss true (the default) and packing false, or keep them out "
            "with drop_truncated true"
        )


def _dpo_row(row: dict, processing_class: Any) -> dict:
    """A tokenized preference row whose chosen or rejected reply was cut: the prompt's own tokens, the sampled ids of
    a cut reply after them, and TRL's tokens of a finished one. ``apart`` marks a row whose finished reply TRL
    tokenized into the prompt's end ("!" + "!..." as "!!..."): no one prompt serves both replies."""
    row["apart"] = False
    if any(row[key + CUT] for key in ("chosen", "rejected")):
        context = prompt_ids(processing_class, row["prompt"], row.get(KWARGS))
        for key in ("chosen", "rejected"):
            whole = context + row[key + CUT] if row[key + CUT] else row["prompt_ids"] + row[f"{key}_ids"]
            row["apart"] |= whole[: len(context)] != context
            row[f"{key}_ids"] = whole[len(context) :]
        row["prompt_ids"] = context
    return row


class CutRepliesSFTTrainer(SFTTrainer):
    """TRL's SFTTrainer; a completion marked cut trains as sampled, without the end of turn."""

    def _prepare_dataset(self, dataset: Any, processing_class: Any, args: Any, packing: bool, *rest: Any) -> Any:
        dataset, pinned = _pin_chat_template(dataset)
        dataset = super()._prepare_dataset(dataset, processing_class, args, packing, *rest)
        added = [KWARGS] if pinned and KWARGS in dataset.column_names else []
        column = "completion" + CUT
        if column not in dataset.column_names:
            return dataset.remove_columns(added)
        if any(dataset[column]):
            check_sft_settings(packing, getattr(self, "completion_only_loss", True))
        settings = {"column": column, "max_length": args.max_length, "mode": args.truncation_mode}
        dataset = dataset.map(_sft_row, fn_kwargs={**settings, "processing_class": processing_class})
        # as TRL drops a row its truncation left with nothing to train
        return dataset.filter(lambda row: any(t != -100 for t in row["labels"])).remove_columns([column, *added])


class CutRepliesDPOTrainer(DPOTrainer):
    """TRL's DPOTrainer; a chosen or rejected reply marked cut trains as sampled, without the end of turn."""

    def _prepare_dataset(self, dataset: Any, processing_class: Any, args: Any, *rest: Any) -> Any:
        dataset, pinned = _pin_chat_template(dataset)
        dataset = super()._prepare_dataset(dataset, processing_class, args, *rest)
        added = [KWARGS] if pinned and KWARGS in dataset.column_names else []
        columns = ["chosen" + CUT, "rejected" + CUT]
        if not set(columns) <= set(dataset.column_names):
            return dataset.remove_columns(added)
        dataset = dataset.map(_dpo_row, fn_kwargs={"processing_class": processing_class})
        if apart := sum(dataset["apart"]):
            warnings.warn(
                f"{apart} of {len(dataset)} preference pairs dropped: a cut reply follows its prompt's own tokens, "
                "and TRL tokenized the other, finished reply into the prompt's last token",
                stacklevel=2,
            )
            dataset = dataset.filter(lambda row: not row["apart"])
        if args.max_length is not None and args.truncation_mode == "keep_start":  # as TRL drops a prompt alone
            dataset = dataset.filter(lambda row: len(row["prompt_ids"]) < args.max_length)
        return dataset.remove_columns([*columns, "apart", *added])

"""Replies cut at the token limit, trained as they were sampled.

TRL closes every completion it trains with the end of turn: a chat message through the chat template, a text
completion with ``eos_token``. A reply the policy never ended (cut at ``rollout_max_new_tokens``, kept with
``drop_truncated false``) went into SFT and DPO as if the policy had ended it there: as DPO's rejected reply (the
setting of a truncation penalty) it lowered the end of turn's probability after the cut text, teaching the policy
not to stop; as a kept reply, to stop mid-sentence. These trainers put the reply's sampled ids, which hold no end of
turn, in place of TRL's tokens of it. A finished reply trains as TRL renders it.

A row marks a cut reply by a ``<key>_cut_ids`` column (``completion_cut_ids``; ``chosen_cut_ids``,
``rejected_cut_ids``): the sampled ids, or ``[]`` for a finished reply.
"""

from __future__ import annotations

from typing import Any

from trl import DPOTrainer, SFTTrainer

from .sampling import Replies

__all__ = ["CUT", "cut_ids", "CutRepliesSFTTrainer", "CutRepliesDPOTrainer"]

CUT = "_cut_ids"  # the suffix of a reply's cut-ids column


def cut_ids(replies: Replies, i: int, j: int) -> list[int]:
    """Prompt ``i``'s reply ``j`` as sampled if it was cut at the token limit, else ``[]``."""
    return [int(t) for t in replies.tokens[i][j]] if replies.truncated[i][j] else []


def _sft_row(row: dict, column: str, max_length: int | None, mode: str) -> dict:
    """A tokenized SFT row whose completion is a cut reply: its prompt tokens, then the sampled ids (all trained),
    cut to ``max_length`` as TRL cut the row (``mode``: keep_start or keep_end)."""
    cut = row[column]
    if cut:
        start = next(n for n, label in enumerate(row["labels"]) if label != -100)
        ids, labels = row["input_ids"][:start] + cut, [-100] * start + cut
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


def _dpo_row(row: dict) -> dict:
    """A tokenized preference row whose chosen or rejected reply was cut: the sampled ids in place of TRL's."""
    for key in ("chosen", "rejected"):
        if row[key + CUT]:
            row[f"{key}_ids"] = row[key + CUT]
    return row


class CutRepliesSFTTrainer(SFTTrainer):
    """TRL's SFTTrainer; a completion marked cut trains as sampled, without the end of turn."""

    def _prepare_dataset(self, dataset: Any, processing_class: Any, args: Any, packing: bool, *rest: Any) -> Any:
        dataset = super()._prepare_dataset(dataset, processing_class, args, packing, *rest)
        column = "completion" + CUT
        if column not in dataset.column_names:
            return dataset
        if any(dataset[column]):
            check_sft_settings(packing, getattr(self, "completion_only_loss", True))
        settings = {"column": column, "max_length": args.max_length, "mode": args.truncation_mode}
        return dataset.map(_sft_row, fn_kwargs=settings).remove_columns(column)


class CutRepliesDPOTrainer(DPOTrainer):
    """TRL's DPOTrainer; a chosen or rejected reply marked cut trains as sampled, without the end of turn."""

    def _prepare_dataset(self, dataset: Any, *rest: Any) -> Any:
        dataset = super()._prepare_dataset(dataset, *rest)
        columns = ["chosen" + CUT, "rejected" + CUT]
        if not set(columns) <= set(dataset.column_names):
            return dataset
        return dataset.map(_dpo_row).remove_columns(columns)

"""``pmi-reward rerank``: candidate replies sorted by PMI, from the command line or a JSONL of rows.

    pmi-reward rerank --scorer DIR --context "I went hiking." "Where?" "Yosemite!" --candidates "Nice." "Half Dome?"
    pmi-reward rerank --scorer DIR --input rows.jsonl --output ranked.jsonl
    pmi-reward rerank --scorer DIR --input contexts.jsonl --output best.jsonl --model smollm2-135m-instruct --n 8

Rows hold a context (a string with one turn per line, or chat messages) and a list of candidates; with
``--model``, rows without candidates get ``n`` sampled replies (best-of-n). Each output row gains
``ranked`` (``[{"text", "pmi"}]``, best first) and ``best``. The embedding cache is chosen as ``score`` chooses it
(``--cache_dir``, ``--no_cache``); a progress bar goes to stderr, never to stdout, which holds the output.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from ..configs import parse_args
from ..data.conversation import DEFAULT_SYSTEM_PROMPT, message_text, turns_to_messages
from ..data.records import DataError, check_output, read_records, write_records
from ..policy.sampling import SamplingSettings, sample_replies
from ..rewards.rerank import rerank_many
from ..scoring.encoder import EncoderRuntime
from ..scoring.scorer import DEFAULT_SCORER, PMIScorer
from .device import check_device, device_help
from .processes import single_process
from .score import EmbeddingCacheArguments, scorer_files


@dataclass
class RerankArguments:
    scorer: str = field(
        default=DEFAULT_SCORER,
        metadata={
            "help": "a directory written by `pmi-reward train`, or a Hub repo id org/name; by default the recommended "
            "scorer, where `pmi-reward train --config scorer/recommended` (or `make scorer` in a checkout) saves it"
        },
    )
    context: list[str] | None = field(default=None, metadata={"help": "inline context: its turns, oldest first"})
    candidates: list[str] | None = field(default=None, metadata={"help": "inline candidate replies"})
    input: str | None = field(default=None, metadata={"help": "JSONL/JSON rows with a context and candidates"})
    output: str | None = field(
        default=None, metadata={"help": "where to write the ranked rows (.jsonl/.json); without it, print them"}
    )
    overwrite: bool = field(default=False, metadata={"help": "replace --output if it exists"})
    context_column: str = field(
        default="context",
        metadata={"help": "--input's context column: text (turns one per line, oldest first) or chat messages"},
    )
    candidates_column: str = field(
        default="candidates",
        metadata={"help": "--input's column of candidate replies (a list); a row without them is sampled with --model"},
    )
    model: str | None = field(default=None, metadata={"help": "chat model for best-of-n when a row has no candidates"})
    device: str | None = field(
        default=None, metadata={"help": device_help("the scorer and --model run", onnx="the scorer on the CPU")}
    )
    n: int = field(default=8, metadata={"help": "replies sampled per context for best-of-n"})
    system_prompt: str | None = field(
        default=DEFAULT_SYSTEM_PROMPT,
        metadata={
            "help": "system message of --model's prompts ('' for none; not added to a context given as chat "
            "messages); the default is the one the policy commands train and evaluate-policy samples with"
        },
    )
    progress: bool = field(default=True, metadata={"help": "show a progress bar"})

    def __post_init__(self) -> None:
        if self.n < 1:  # checked when read: sampling would refuse it only after the chat model had loaded
            raise ValueError(f"n must be >= 1, got {self.n}")
        if self.input and (self.context or self.candidates):  # one of them would be dropped without a word
            raise ValueError("give --input or --context/--candidates, not both")


def _rows(args: RerankArguments) -> list[dict]:
    if args.input:
        rows = read_records(args.input)
        for n, row in enumerate(rows, 1):
            context = row.get(args.context_column)
            if not (isinstance(context, str) or (isinstance(context, list) and all(map(_is_message, context)))):
                raise DataError(
                    f"{args.input}, row {n}, field {args.context_column!r}: expected text or chat messages "
                    "({role, content} objects)"
                )
            cands = row.get(args.candidates_column)
            if cands is not None and not (isinstance(cands, list) and all(isinstance(c, str) for c in cands)):
                raise DataError(f"{args.input}, row {n}, field {args.candidates_column!r}: expected a list of strings")
        return rows
    if not args.context:
        raise SystemExit("give --input FILE, or --context TURN [TURN ...] with --candidates (or --model)")
    return [{args.context_column: "\n".join(args.context), args.candidates_column: args.candidates}]


def _is_message(message: object) -> bool:
    """A chat message that a context reads (anything else in a list would be dropped from it unseen)."""
    return (
        isinstance(message, dict)
        and isinstance(message.get("role"), str)
        and message_text(message.get("content")) is not None
    )


def _sample_missing(args: RerankArguments, settings: SamplingSettings, rows: list[dict]) -> None:
    missing = [r for r in rows if not r.get(args.candidates_column)]
    if not missing:
        return
    if not args.model:
        raise SystemExit(f"{len(missing)} row(s) have no candidates: give them, or --model for best-of-n")
    from ..policy.loading import load_policy
    from ..policy.prompts import fit_prompts

    model, tokenizer = load_policy(args.model, device=args.device)  # --device keeps both models off a GPU
    prompts = [
        c if isinstance(c, list) else turns_to_messages(c, args.system_prompt)
        for c in (r[args.context_column] for r in missing)
    ]
    # as the policy commands fit theirs: a template without a system role, or one that wants a user turn first, is
    # named (with the --system_prompt '' way out) or fitted, not a raw template error from the first generate
    prompts = fit_prompts(prompts, tokenizer)
    sampled = sample_replies(model, tokenizer, prompts, args.n, settings, "best-of-n")
    for row, replies in zip(missing, sampled, strict=True):
        row[args.candidates_column] = replies


# the JSON files of a chat model's folder that loading it reads by name (an output of ours is JSON)
_MODEL_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "chat_template.json",
    "adapter_config.json",
)


def _model_files(model: str | None) -> list[Path]:
    """The files of a local ``--model`` folder that an output must not replace; a report beside them may be."""
    return [Path(model) / name for name in _MODEL_FILES] if model else []


def main(argv: list[str] | None = None) -> int:
    single_process("rerank")  # before anything loads: it has no multi-process path
    args, settings, cache, runtime = parse_args(
        (RerankArguments, SamplingSettings, EmbeddingCacheArguments, EncoderRuntime), argv, prog="pmi-reward rerank"
    )
    check_device(args.device)  # a device this machine lacks: one line now, not a traceback once a model loaded
    if args.output:  # ranked rows hold lists: JSON only
        inputs = [args.input, *_model_files(args.model), *scorer_files(args.scorer)]
        check_output(args.output, args.overwrite, inputs=inputs, suffixes=(".jsonl", ".ndjson", ".json"))
    rows = _rows(args)
    _sample_missing(args, settings, rows)
    scorer = PMIScorer.from_pretrained(
        args.scorer, device=args.device, cache_dir=cache.directory(), **runtime.as_kwargs()
    )
    # strict: a scorer that fails raises here (as in `pmi-reward score`), not an exit 0 with every score null
    contexts, candidates = [r[args.context_column] for r in rows], [r[args.candidates_column] for r in rows]
    ranked = rerank_many(scorer, contexts, candidates, strict=True, progress=args.progress)
    for row, ranking in zip(rows, ranked, strict=True):
        row["ranked"] = [{"text": t, "pmi": None if s is None else round(s, 4)} for t, s in ranking]
        row["best"] = ranking[0][0] if ranking and ranking[0][1] is not None else None  # nothing scorable: none
    if args.output:
        write_records(args.output, rows)
        print(json.dumps({"rows": len(rows), "output": args.output}))
        return 0
    for row in rows:
        print("   PMI  reply")
        for r in row["ranked"]:
            print(f"{'    --' if r['pmi'] is None else format(r['pmi'], '+6.2f')}  {r['text']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

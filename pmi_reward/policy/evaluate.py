"""Engagement gain of tuned policies over their base, judged by a scorer independent of the training reward.

    pmi-reward evaluate-policy --config recipes/smollm2-135m/evaluate.yaml --tuned outputs/policies/grpo

For held-out dialogue contexts, every policy samples ``samples`` replies under the same settings and
seeds; the evaluation scorer (trained on other dialogues and/or with another seed or encoder than the
reward's, so that a reward hack does not grade itself) scores them. Reported per policy: mean PMI with a
bootstrap CI over contexts, the paired gain over base with its CI, win-rate over base, the reward
scorer's mean (a gap to the evaluation scorer hints at reward hacking), reply length, distinct-1/2, and
the shares of generic, context-copying and empty replies. Writes ``results.md``, ``results.json``,
``samples.jsonl`` and ``pmi_hist.png`` into ``output_dir``.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..data.conversation import prompt_to_context
from ..evaluation.metrics import copies_context, distinct_n, is_generic, mean_ci, row_means, win_rate, words
from ..evaluation.report import plot_distributions
from ..rewards.reward import PMIReward
from ..scoring.scorer import PMIScorer
from .loading import DEFAULT_POLICY, load_policy
from .prompts import PromptArguments, build_prompts
from .report import independence_note, policy_table, provenance_of
from .sampling import SamplingSettings, sample_replies

__all__ = [
    "EvalPromptArguments",
    "EvalArguments",
    "ARGUMENTS",
    "policy_metrics",
    "score_grid",
    "evaluate_policies",
    "run_evaluation",
]


@dataclass
class EvalPromptArguments(PromptArguments):
    """Held-out contexts: by default the last chitchat dialogues, used by no scorer and no training run."""

    first_dialogue: int = 3700
    max_dialogues: int | None = None
    max_prompts: int | None = 100
    prompt_seed: int = 1


@dataclass
class EvalArguments:
    """Which policies, which scorers, how many replies each (how they are sampled is ``SamplingSettings``)."""

    tuned: list[str] = field(default_factory=list, metadata={"help": "tuned policy dirs (full or LoRA adapter)"})
    base_model: str = field(default=DEFAULT_POLICY, metadata={"help": "the policy before tuning"})
    scorer: str = field(default="outputs/scorers/eval-minilm-s1", metadata={"help": "independent evaluation scorer"})
    reward_scorer: str | None = field(default=None, metadata={"help": "the training reward's scorer (reported beside)"})
    samples: int = field(default=4, metadata={"help": "replies sampled per context and policy"})
    include_reference: bool = field(default=True, metadata={"help": "also score the human reply of each context"})
    output_dir: str = "outputs/eval"


ARGUMENTS = (EvalPromptArguments, EvalArguments, SamplingSettings)


def policy_metrics(pmi: np.ndarray, replies: list[list[str]], contexts: list[str]) -> dict[str, float]:
    """Text and score statistics of one policy's replies (rows: contexts, columns: samples)."""
    flat = [r for row in replies for r in row]
    pmi_ci = mean_ci(pmi)
    return {
        "pmi_mean": pmi_ci.value,
        "pmi_lo": pmi_ci.low,
        "pmi_hi": pmi_ci.high,
        "words": float(np.mean([len(words(r)) for r in flat])),
        "distinct_1": distinct_n(flat, 1),
        "distinct_2": distinct_n(flat, 2),
        "generic": float(np.mean([is_generic(r) for r in flat])),
        "copy": float(np.mean([copies_context(r, c) for c, row in zip(contexts, replies, strict=True) for r in row])),
        "empty": float(np.mean([not r.strip() for r in flat])),
    }


def score_grid(reward: PMIReward, prompts: list, replies: list[list[str]]) -> np.ndarray:
    """(contexts, samples) PMI of each reply."""
    flat_p = [p for p, row in zip(prompts, replies, strict=True) for _ in row]
    flat_r = [r for row in replies for r in row]
    return np.asarray(reward(flat_p, flat_r), dtype=np.float64).reshape(len(replies), -1)


def evaluate_policies(
    policies: dict,
    prompts: list,
    scorer: PMIScorer,
    reward_scorer: PMIScorer | None,
    args: EvalArguments,
    settings: SamplingSettings | None = None,
    references: list[str] | None = None,
) -> dict:
    """Sample, score and summarise every policy (the first one is the base); returns rows and samples."""
    # an empty reply says nothing about its context: PMI 0 (its share is reported as "empty")
    judge = PMIReward(scorer, empty_score=0.0)
    train_judge = PMIReward(reward_scorer, empty_score=0.0) if reward_scorer else None
    contexts = [prompt_to_context(p) or "" for p in prompts]
    settings = settings or SamplingSettings()
    replies = {
        name: sample_replies(model, tok, prompts, args.samples, settings, f"sampling {name}")
        for name, (model, tok) in policies.items()
    }
    if references is not None:
        replies["human reference"] = [[r] for r in references]
    scores = {name: score_grid(judge, prompts, rows) for name, rows in replies.items()}
    base = next(iter(policies))
    rows = []
    for name in replies:
        row: dict[str, Any] = {"policy": name, **policy_metrics(scores[name], replies[name], contexts)}
        if name != base:
            gain = mean_ci(row_means(scores[name]) - row_means(scores[base]))  # paired: contexts resampled together
            row["gain"], row["gain_lo"], row["gain_hi"] = gain.value, gain.low, gain.high
            row["win_rate"] = win_rate(scores[name], scores[base])
        if train_judge is not None:
            row["reward_pmi"] = float(score_grid(train_judge, prompts, replies[name]).mean())
        rows.append(row)
    samples = [
        {
            "context": c,
            **{
                n: [{"reply": r, "pmi": round(float(s), 3)} for r, s in zip(replies[n][i], scores[n][i], strict=True)]
                for n in replies
            },
        }
        for i, c in enumerate(contexts)
    ]
    return {"rows": rows, "samples": samples, "scores": {n: s.tolist() for n, s in scores.items()}}


def run_evaluation(prompt_args: EvalPromptArguments, args: EvalArguments, settings: SamplingSettings) -> dict:
    """Load the scorers and policies, evaluate, write the report files into ``args.output_dir``."""
    data = build_prompts(prompt_args)
    prompts = list(data["prompt"])
    references = list(data["reference"]) if args.include_reference and "reference" in data.column_names else None
    scorer = PMIScorer.from_pretrained(args.scorer)
    reward_scorer = (
        PMIScorer.from_pretrained(args.reward_scorer, encoder=_shared(scorer, args.reward_scorer))
        if args.reward_scorer
        else None
    )
    note = independence_note(provenance_of(scorer), provenance_of(reward_scorer) if reward_scorer else None)
    print(note)
    policies = {"base": load_policy(args.base_model)}
    for path in args.tuned:
        policies[Path(path).name] = load_policy(path)
    result = evaluate_policies(policies, prompts, scorer, reward_scorer, args, settings, references)
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    table = policy_table(result["rows"])
    header = (
        f"{len(prompts)} held-out contexts x {args.samples} samples per policy "
        f"(T={settings.temperature}, top_p={settings.top_p}, max_new_tokens={settings.max_new_tokens}, "
        f"seed={settings.seed}).\n{note}\n\n"
    )
    (out / "results.md").write_text(header + table + "\n")
    (out / "results.json").write_text(
        json.dumps(
            {
                "rows": result["rows"],
                "note": note,
                "args": asdict(args),
                "sampling": asdict(settings),
                "prompts": asdict(prompt_args),
            },
            indent=1,
        )
    )
    with (out / "samples.jsonl").open("w") as f:
        for s in result["samples"]:
            f.write(json.dumps(s, ensure_ascii=False) + "\n")
    plot_distributions(result["scores"], out / "pmi_hist.png")
    print("\n" + table)
    return result


def _shared(scorer: PMIScorer, other_dir: str):
    """The evaluation scorer's encoder when the reward scorer uses the same one (load it once)."""
    from ..scoring.encoder import EncoderSpec

    spec = EncoderSpec.from_dict(PMIScorer.read_config(other_dir)["encoder"])
    return scorer.encoder if scorer.encoder.spec.embeds_like(spec) else None

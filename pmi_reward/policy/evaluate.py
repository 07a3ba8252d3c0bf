"""Engagement gain of tuned policies over their base, judged by a scorer independent of the training reward.

    python -m pmi_reward.policy.evaluate --config recipes/smollm2-135m/evaluate.yaml --tuned outputs/policies/grpo

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

import numpy as np
from trl import TrlParser

from ..data.conversation import prompt_to_context
from ..rewards.reward import PMIReward
from ..scoring.scorer import PMIScorer
from .loading import load_policy_dir
from .metrics import bootstrap_ci, copies_context, distinct_n, is_generic, paired_bootstrap_ci, win_rate, words
from .prompts import PromptArguments, build_prompts
from .report import independence_note, markdown_table, plot_distributions
from .sampling import SamplingSettings, sample_replies


@dataclass
class EvalPromptArguments(PromptArguments):
    """Held-out contexts: by default the last chitchat dialogues, used by no scorer and no training run."""

    first_dialogue: int = 3700
    max_dialogues: int | None = None
    max_prompts: int | None = 100
    prompt_seed: int = 1


@dataclass
class EvalArguments:
    tuned: list[str] = field(default_factory=list, metadata={"help": "tuned policy dirs (full or LoRA adapter)"})
    base_model: str = field(default="smollm2-135m-instruct", metadata={"help": "the policy before tuning"})
    scorer: str = field(default="outputs/scorers/eval-minilm-s1", metadata={"help": "independent evaluation scorer"})
    reward_scorer: str | None = field(default=None, metadata={"help": "the training reward's scorer (reported beside)"})
    samples: int = field(default=4, metadata={"help": "replies sampled per context and policy"})
    max_new_tokens: int = 48
    temperature: float = 0.8
    top_p: float = 0.95
    batch_size: int = 32
    seed: int = 1234
    include_reference: bool = field(default=True, metadata={"help": "also score the human reply of each context"})
    output_dir: str = "outputs/eval"


def policy_metrics(pmi: np.ndarray, replies: list[list[str]], contexts: list[str]) -> dict[str, float]:
    """Text and score statistics of one policy's replies (rows: contexts, columns: samples)."""
    flat = [r for row in replies for r in row]
    mean, lo, hi = bootstrap_ci(pmi)
    return {"pmi_mean": mean, "pmi_lo": lo, "pmi_hi": hi, "words": float(np.mean([len(words(r)) for r in flat])),
            "distinct_1": distinct_n(flat, 1), "distinct_2": distinct_n(flat, 2),
            "generic": float(np.mean([is_generic(r) for r in flat])),
            "copy": float(np.mean([copies_context(r, c) for c, row in zip(contexts, replies) for r in row])),
            "empty": float(np.mean([not r.strip() for r in flat]))}


def score_grid(reward: PMIReward, prompts: list, replies: list[list[str]]) -> np.ndarray:
    """(contexts, samples) PMI of each reply."""
    flat_p = [p for p, row in zip(prompts, replies) for _ in row]
    flat_r = [r for row in replies for r in row]
    return np.asarray(reward(flat_p, flat_r), dtype=np.float64).reshape(len(replies), -1)


def evaluate_policies(policies: dict, prompts: list, scorer: PMIScorer, reward_scorer: PMIScorer | None,
                      args: EvalArguments, references: list[str] | None = None) -> dict:
    """Sample, score and summarise every policy (the first one is the base); returns rows and samples."""
    # an empty reply says nothing about its context: PMI 0 (its share is reported as "empty")
    judge = PMIReward(scorer, empty_score=0.0)
    train_judge = PMIReward(reward_scorer, empty_score=0.0) if reward_scorer else None
    contexts = [prompt_to_context(p) or "" for p in prompts]
    settings = SamplingSettings(args.max_new_tokens, args.temperature, args.top_p, args.batch_size, args.seed)
    replies = {name: sample_replies(model, tok, prompts, args.samples, settings, f"sampling {name}")
               for name, (model, tok) in policies.items()}
    if references is not None:
        replies["human reference"] = [[r] for r in references]
    scores = {name: score_grid(judge, prompts, rows) for name, rows in replies.items()}
    base = next(iter(policies))
    rows = []
    for name in replies:
        row = {"policy": name, **policy_metrics(scores[name], replies[name], contexts)}
        if name != base:
            row["gain"], row["gain_lo"], row["gain_hi"] = paired_bootstrap_ci(scores[name], scores[base])
            row["win_rate"] = win_rate(scores[name], scores[base])
        if train_judge is not None:
            row["reward_pmi"] = float(score_grid(train_judge, prompts, replies[name]).mean())
        rows.append(row)
    samples = [{"context": c, **{n: [{"reply": r, "pmi": round(float(s), 3)}
                                     for r, s in zip(replies[n][i], scores[n][i])] for n in replies}}
               for i, c in enumerate(contexts)]
    return {"rows": rows, "samples": samples, "scores": {n: s.tolist() for n, s in scores.items()}}


def main(argv: list[str] | None = None) -> dict:
    parser = TrlParser((EvalPromptArguments, EvalArguments), prog="pmi_reward.policy.evaluate")
    prompt_args, args = parser.parse_args_and_config(argv)
    data = build_prompts(prompt_args)
    prompts = list(data["prompt"])
    references = list(data["reference"]) if args.include_reference and "reference" in data.column_names else None
    scorer = PMIScorer.from_pretrained(args.scorer)
    reward_scorer = PMIScorer.from_pretrained(args.reward_scorer, encoder=_shared(scorer, args.reward_scorer)) \
        if args.reward_scorer else None
    note = independence_note(scorer.metadata, reward_scorer.metadata if reward_scorer else None)
    print(note)
    policies = {"base": load_policy_dir(args.base_model)}
    for path in args.tuned:
        policies[Path(path).name] = load_policy_dir(path)
    result = evaluate_policies(policies, prompts, scorer, reward_scorer, args, references)
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    table = markdown_table(result["rows"])
    header = (f"{len(prompts)} held-out contexts x {args.samples} samples per policy "
              f"(T={args.temperature}, top_p={args.top_p}, max_new_tokens={args.max_new_tokens}, seed={args.seed}).\n"
              f"{note}\n\n")
    (out / "results.md").write_text(header + table + "\n")
    (out / "results.json").write_text(json.dumps({"rows": result["rows"], "note": note, "args": asdict(args),
                                                  "prompts": asdict(prompt_args)}, indent=1))
    with (out / "samples.jsonl").open("w") as f:
        for s in result["samples"]:
            f.write(json.dumps(s, ensure_ascii=False) + "\n")
    plot_distributions(result["scores"], out / "pmi_hist.png")
    print("\n" + table)
    return result


def _shared(scorer: PMIScorer, other_dir: str):
    """The evaluation scorer's encoder when the reward scorer uses the same one (load it once)."""
    spec = PMIScorer.read_config(other_dir)["encoder"]
    return scorer.encoder if {**spec, "batch_size": 0} == {**scorer.encoder.spec.to_dict(), "batch_size": 0} else None


if __name__ == "__main__":
    main()

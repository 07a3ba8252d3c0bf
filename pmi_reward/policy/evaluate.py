"""Engagement gain of tuned policies over their base, judged by a panel of scorers unlike the training reward.

    pmi-reward evaluate-policy --config recipes/smollm2-135m/final/evaluate.yaml --tuned outputs/policies/grpo-s0

For dialogue contexts of one range (tuning or held-out), every policy samples ``samples`` replies under the
same settings and seeds, the base ``base_samples`` when given (best-of-n rows rerank a pool of the base's samples
with the reward): each gain is paired against the base's mean on a context, and one draw of the base, shared by
every policy compared with it, would lend its luck to all of them. Each judge
(``panel``) scores them; per policy and judge: mean PMI with a bootstrap CI over contexts, the paired gain
over base with its CI, the gain after a linear length effect (``diagnostics``) and inside length bins, the
win-rate; per policy: the reward scorer's mean, reply length, the share cut at the token limit, diversity
within and across contexts, template openings, questions, generic, copied and empty replies, and the KL to
the base (``divergence``). A gain counts when every judge that shares nothing with the reward sees it.
Writes ``results.md``, ``results.json``, ``samples.jsonl``, ``samples.md`` and ``pmi_hist.png`` into
``output_dir`` (and appends one line per policy to ``log_file``: the trials log, in the order run).
``from_samples`` judges an earlier evaluation's ``samples.jsonl`` again (a new judge on replies already fixed,
without the policies: everything but the KL); where its contexts came from is read from the ``results.json``
beside it.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import numpy as np

from ..data.conversation import prompt_to_context, strip_think, think_unfinished
from ..data.records import DataError, json_safe
from ..evaluation.metrics import copies_context, distinct_n, is_generic, mean_ci, row_means, win_rate, words
from ..evaluation.report import plot_distributions
from ..progress import progress_bar
from ..rewards.path import visible
from ..rewards.reward import PMIReward
from ..scoring.models import cache_root, missing_local, model_identity, shipped_copy
from .best_of_n import best_of_n_kl_bound, best_of_n_replies
from .diagnostics import binned_gain, length_adjusted_gain, length_edges, reply_lengths, text_diagnostics
from .divergence import kl_to_base
from .loading import DEFAULT_POLICY, load_policy
from .panel import LM_PREFIX, Judge, check_panel, load_judges, parse_val_aucs, row_name, verdict
from .prompts import PromptArguments, build_prompts, fit_prompts
from .samples import HUMAN, policy_width
from .sampling import Replies, SamplingSettings, generate_replies

__all__ = [
    "EvalPromptArguments",
    "EvalArguments",
    "ARGUMENTS",
    "is_empty",
    "text_metrics",
    "score_grid",
    "judge_grid",
    "evaluate_policies",
    "recorded_start",
    "start_mismatches",
]


# The default panel's judge: judge (a) of recipes/README.md, section 4 (MiniLM on Chit-Chat 1000-1999, seed 1, a
# twin of the reward), where the command below writes it. The command spells out the settings of
# recipes/smollm2-135m/scorers/judge-minilm.yaml as flags on a shipped config, so that it runs from an installed
# wheel, which has no recipes/ (tests/test_packaging.py keeps the two equal).
DEFAULT_JUDGE_DIR = "outputs/scorers/eval-minilm-s1"
DEFAULT_JUDGE_COMMAND = (
    "pmi-reward train --config scorer/minilm --dialogues chitchat --skip_dialogues 1000 --max_dialogues 1000 "
    f"--seed 1 --split_seed 1 --output_dir {DEFAULT_JUDGE_DIR}"
)


@dataclass
class EvalPromptArguments(PromptArguments):
    """Evaluation contexts: by default the held-out chitchat dialogues (3700+), used by no scorer and no training
    run; the tuning contexts are 3400-3699 (``pmi_reward.policy.protocol``)."""

    first_dialogue: int = field(
        default=3700, metadata={"help": "skip the dialogues before this index (3700+: the held-out range)"}
    )
    max_dialogues: int | None = field(
        default=None, metadata={"help": "use at most N dialogues from first_dialogue (unset or 0: all)"}
    )
    max_prompts: int | None = field(default=100, metadata={"help": "keep at most N prompts (0: all)"})
    prompt_seed: int = field(default=1, metadata={"help": "seed for picking positions in dialogues"})


@dataclass
class EvalArguments:
    """Which policies, which judges, how many replies each (how they are sampled is ``SamplingSettings``)."""

    tuned: list[str] = field(default_factory=list, metadata={"help": "tuned policy dirs (full or LoRA adapter)"})
    base_model: str = field(default=DEFAULT_POLICY, metadata={"help": "the policy before tuning"})
    judges: list[str] = field(
        default_factory=lambda: [f"minilm={DEFAULT_JUDGE_DIR}"],
        metadata={"help": "the judge panel: name=scorer_dir (or scorer_dir), or name=lm:MODEL (a chat LM's PMI)"},
    )
    judge_val_auc: list[str] = field(
        default_factory=list,
        metadata={"help": "name=AUC: validation AUC of a judge whose directory holds none (an lm: judge)"},
    )
    from_samples: str | None = field(
        default=None,
        metadata={"help": "judge the replies of an earlier evaluation's samples.jsonl again (no sampling, no KL)"},
    )
    reward_scorer: str | None = field(
        default=None, metadata={"help": "the training reward's scorer: compared with each judge, reported beside"}
    )
    samples: int = field(default=4, metadata={"help": "replies sampled per context and policy"})
    base_samples: int | None = field(
        default=None,
        metadata={
            "help": "replies sampled per context for the base (default: --samples): every gain is paired against "
            "the base's mean on each context, so more draws of the base take its chance out of every gain"
        },
    )
    include_reference: bool = field(default=True, metadata={"help": "also score the human reply of each context"})
    best_of_n: list[int] = field(
        default_factory=list, metadata={"help": "best-of-n rows of the base, reranked by the reward (e.g. 4 8 16)"}
    )
    kl: bool = field(default=True, metadata={"help": "measure each tuned policy's KL to the base on its replies"})
    sample_contexts: int = field(default=30, metadata={"help": "contexts shown side by side in samples.md"})
    log_file: str | None = field(default=None, metadata={"help": "append one JSON line per policy (a trials log)"})
    output_dir: str = field(
        default="outputs/eval",
        metadata={"help": "where results.md, results.json, samples.jsonl, samples.md and pmi_hist.png are written"},
    )

    def __post_init__(self) -> None:
        """Refuse counts that sampling would only reject after every policy had loaded (best-of-n: sampled); a list
        given as null in a YAML config is an empty one."""
        self.tuned, self.best_of_n, self.judge_val_auc = (
            self.tuned or [],
            self.best_of_n or [],
            self.judge_val_auc or [],
        )
        if self.samples < 1:
            raise ValueError(f"samples must be >= 1, got {self.samples}")
        if self.base_samples is not None and self.base_samples < 1:
            raise ValueError(f"base_samples must be >= 1, got {self.base_samples}")
        if self.base_samples is not None and self.base_samples < self.samples:
            raise ValueError(
                f"base_samples ({self.base_samples}) below samples ({self.samples}): the base's diversity would be "
                "read on fewer replies per context than a tuned policy's; give base_samples >= samples"
            )
        if any(n < 1 for n in self.best_of_n):
            raise ValueError(f"best_of_n must be >= 1 each, got {self.best_of_n}")


ARGUMENTS = (EvalPromptArguments, EvalArguments, SamplingSettings)


def is_empty(reply: str) -> bool:
    """Whether a reply shows nothing: no visible character (``rewards.path.visible``, the reward's own test) in
    the answer a judge reads (after a closed ``<think>`` block). A reply that ends inside a think block is
    unfinished reasoning, not an empty reply: the judges leave it unscored."""
    return not think_unfinished(reply) and not visible(strip_think(reply))


def text_metrics(replies: list[list[str]], contexts: list[str]) -> dict[str, float]:
    """Length, diversity and the shares of generic, context-copying and empty replies (rows: contexts), in words of
    any script (``metrics.words``: each letter of Chinese, Japanese or Thai a word), all of the answer the
    judges read (``strip_think``: without a ``<think>`` block; unfinished reasoning reads as no answer);
    ``is_empty`` reads the whole reply, to tell unfinished reasoning from an empty answer."""
    answers = [[strip_think(r) for r in row] for row in replies]
    flat = [a for row in answers for a in row]
    return {
        "words": float(np.mean([len(words(a)) for a in flat])),
        "distinct_1": distinct_n(flat, 1),
        "distinct_2": distinct_n(flat, 2),
        **text_diagnostics(answers),
        "generic": float(np.mean([is_generic(a) for a in flat])),
        "copy": float(np.mean([copies_context(a, c) for c, row in zip(contexts, answers, strict=True) for a in row])),
        "empty": float(np.mean([is_empty(r) for row in replies for r in row])),
    }


def score_grid(reward: PMIReward, prompts: list, replies: list[list[str]]) -> np.ndarray:
    """(contexts, samples) PMI of each reply (NaN where the reward returns None)."""
    flat_p = [p for p, row in zip(prompts, replies, strict=True) for _ in row]
    flat_r = [r for row in replies for r in row]
    out = [np.nan if s is None else s for s in reward(flat_p, flat_r)]
    return np.asarray(out, dtype=np.float64).reshape(len(replies), -1)


def judge_grid(scorer: Any, prompts: list, replies: list[list[str]]) -> np.ndarray:
    """(contexts, samples) PMI of each reply by a judge (or the reward scorer): 0.0 for an empty reply
    (``is_empty``: it says nothing about its context; the report's "empty" share), NaN for a reply left unscored
    (the scorer raised or gave no finite PMI, unfinished reasoning, unreadable text, no readable context), so that a
    failure is never read as a PMI of 0."""
    grid = score_grid(PMIReward(scorer, empty_score=None), prompts, replies)
    empty = np.array([is_empty(r) for row in replies for r in row], dtype=bool).reshape(grid.shape)
    grid[empty] = 0.0
    return grid


def unscored_share(scores: np.ndarray) -> float:
    """Share of the replies a judge left unscored (NaN in its grid)."""
    return float(np.isnan(scores).mean()) if np.size(scores) else 0.0


def _sample(policies: dict, prompts: list, args: EvalArguments, settings: SamplingSettings) -> dict[str, Replies]:
    """Every policy's replies, the base (the first) ``base_samples`` per context when given."""
    counts = [args.base_samples or args.samples] + [args.samples] * (len(policies) - 1)
    return {
        name: generate_replies(model, tok, prompts, n, settings, f"sampling {name}")
        for n, (name, (model, tok)) in zip(counts, policies.items(), strict=True)
    }


def _comparable(replies: dict[str, Replies], base: str) -> Replies:
    """The base's replies cut to as many per context as a tuned policy's, for its text metrics (``--base_samples``):
    diversity and template shares fall with the number of replies they count. Its judges' scores, reward, tokens
    and cut share read every reply."""
    width, rep = policy_width(replies, base), replies[base]
    if width is None or not rep.texts or len(rep.texts[0]) <= width:
        return rep
    counts = rep.token_counts()
    return Replies(
        [row[:width] for row in rep.texts],
        [row[:width] for row in rep.tokens],
        [row[:width] for row in rep.truncated],
        [row[:width] for row in counts],
    )


def _best_of_n(
    base: tuple, prompts: list, reward: PMIReward | None, args: EvalArguments, settings: SamplingSettings
) -> dict[str, Replies]:
    """Best-of-n rows from one pool of lcm(n) samples per context of the base (its own seeds): a multiple of every
    n, so that best-of-n takes the best of each of the pool's lcm(n)/n disjoint groups of n."""
    if not args.best_of_n:
        return {}
    if reward is None:
        raise ValueError("--best_of_n reranks with the reward: give --reward_scorer")
    pool_size = int(np.lcm.reduce(args.best_of_n))
    pool_settings = SamplingSettings(**{**asdict(settings), "seed": settings.seed + 1})
    model, tokenizer = base
    pool = generate_replies(
        model, tokenizer, prompts, pool_size, pool_settings, f"sampling best-of-n pool ({pool_size})"
    )
    # ranked with unscorable replies (empty, unfinished) as NaN, which never win; the report's 0.0 would beat a
    # group of negative PMI
    ranker = PMIReward(reward.scorer, replace(reward.options, empty_score=None))
    scores = score_grid(ranker, prompts, pool.texts)
    return {f"best-of-{n}": best_of_n_replies(pool, scores, n) for n in sorted(args.best_of_n)}


def _judge_all(judges: list[Judge], prompts: list, replies: dict[str, Replies]) -> dict[str, dict[str, np.ndarray]]:
    """Every judge's (contexts, samples) scores of every policy's replies. Each judge reads a context's replies of
    all policies in one row, so that a context is read once (what an LM judge spends most of its time on)."""
    widths = {name: len(rep.texts[0]) if rep.texts else 0 for name, rep in replies.items()}
    rows = [[t for rep in replies.values() for t in rep.texts[i]] for i in range(len(prompts))]
    scores: dict[str, dict[str, np.ndarray]] = {}
    for j in progress_bar(judges, desc="judging", unit="judge"):
        grid = judge_grid(j.scorer, prompts, rows)
        edges = np.cumsum([0, *widths.values()])
        scores[j.name] = {name: grid[:, a:b] for name, a, b in zip(widths, edges[:-1], edges[1:], strict=True)}
    return scores


def _judge_row(scores: np.ndarray, base: np.ndarray, lengths: np.ndarray, base_len: np.ndarray, edges) -> dict:
    """One judge's view of a policy: its mean PMI, the gain over base and the rest, each with its CI. Where the
    judge left a reply of the policy unscored its PMI is not computed (NaN), and where it left one of the policy or
    of the base unscored no gain, length-adjusted or binned gain or win-rate is (a mean over the scored replies
    would compare other contexts, or other replies, than the base's); ``unscored`` gives the policy's share."""
    pmi = mean_ci(scores)
    row: dict[str, Any] = {
        "pmi_mean": pmi.value,
        "pmi_lo": pmi.low,
        "pmi_hi": pmi.high,
        "unscored": unscored_share(scores),
    }
    if scores is base:
        return row
    if np.isnan(scores).any() or np.isnan(base).any():
        nan = float("nan")
        bins = binned_gain(np.zeros_like(scores), np.zeros_like(base), lengths, base_len, edges)["bins"]
        return {
            **row,
            **dict.fromkeys(("gain", "gain_lo", "gain_hi", "len_adj_gain", "len_adj_lo", "len_adj_hi"), nan),
            "binned_gain": nan,
            "bins": [{**b, "gain": nan} for b in bins],
            "win_rate": nan,
        }
    gain = mean_ci(row_means(scores) - row_means(base))  # paired: contexts resampled together
    adjusted = length_adjusted_gain(scores, base, lengths, base_len)
    binned = binned_gain(scores, base, lengths, base_len, edges)
    return {
        **row,
        "gain": gain.value,
        "gain_lo": gain.low,
        "gain_hi": gain.high,
        "len_adj_gain": adjusted.value,
        "len_adj_lo": adjusted.low,
        "len_adj_hi": adjusted.high,
        "binned_gain": binned["gain"],
        "bins": binned["bins"],
        "win_rate": win_rate(scores, base),
    }


def _kl(name: str, policies: dict, base: str, replies: Replies, prompts: list, settings, args) -> dict:
    if name.startswith("best-of-"):
        return {"kl_reply": best_of_n_kl_bound(int(name.split("-")[-1])), "kl_token": None, "kl_is_bound": True}
    if name == base:
        return {"kl_reply": 0.0, "kl_token": 0.0}
    if name not in policies or not args.kl:
        return {}
    (model, tok), (base_model, _) = policies[name], policies[base]
    return kl_to_base(model, base_model, tok, prompts, replies.tokens, settings.temperature, settings.batch_size)


def evaluate_policies(  # one pass: sample, score with every judge, summarise; each step is a helper above
    policies: dict,
    prompts: list,
    judges: list[Judge],
    reward_scorer: Any | None,
    args: EvalArguments,
    settings: SamplingSettings | None = None,
    references: list[str] | None = None,
    replies: dict[str, Replies] | None = None,
) -> dict:
    """Sample, score and summarise every policy (the first one is the base); returns rows, judges and samples.
    Given ``replies`` (read back from a samples file, the base first), nothing is sampled and ``policies`` may be
    empty."""
    settings = settings or SamplingSettings()
    # an empty reply says nothing about its context: PMI 0 (its share is reported as "empty"); one left unscored is
    # NaN (judge_grid). best-of-n ranks with empty and unscored replies as NaN: they never win
    reward = PMIReward(reward_scorer, empty_score=None) if reward_scorer is not None else None
    contexts = [prompt_to_context(p) or "" for p in prompts]
    if replies is None:
        replies = _sample(policies, prompts, args, settings)
        replies.update(_best_of_n(policies[next(iter(policies))], prompts, reward, args, settings))
    else:
        replies = {name: rep for name, rep in replies.items() if name != HUMAN}
    base = next(iter(replies))
    if references is not None:
        replies[HUMAN] = Replies([[r] for r in references], [[[]] for _ in references], [[False] for _ in references])
    scores = _judge_all(judges, prompts, replies)
    # the answer's length, as the judges and the words column read it (a <think> block is no part of it)
    lengths = {n: reply_lengths([[strip_think(t) for t in row] for row in r.texts]) for n, r in replies.items()}
    edges = length_edges(lengths[base])
    rows: list[dict[str, Any]] = []
    for name, rep in replies.items():
        shown = _comparable(replies, base) if name == base else rep
        row: dict[str, Any] = {"policy": name, **text_metrics(shown.texts, contexts)}
        row["replies"] = len(rep.texts[0]) if rep.texts else 0
        row["text_replies"] = len(shown.texts[0]) if shown.texts else 0  # what its text figures read
        row["tokens"] = float(np.mean([n for r in rep.token_counts() for n in r])) if name != HUMAN else None
        row["cut"] = rep.truncated_share() if name != HUMAN else None
        row.update(_kl(name, policies, base, rep, prompts, settings, args))
        if reward is not None:
            grid = judge_grid(reward.scorer, prompts, rep.texts)
            row["reward_pmi"] = float(np.mean(grid))  # NaN (blank) where any reply was left unscored
            row["reward_unscored"] = unscored_share(grid)
        row["judges"] = {
            j.name: _judge_row(scores[j.name][name], scores[j.name][base], lengths[name], lengths[base], edges)
            for j in judges
        }
        if name != base:
            row["verdict"] = verdict(
                {k: (v["gain"], v["gain_lo"], v["gain_hi"]) for k, v in row["judges"].items()}, judges
            )
        rows.append(row)
    return {
        "rows": rows,
        "replies": replies,
        "contexts": contexts,
        "scores": {j: {n: s.tolist() for n, s in by.items()} for j, by in scores.items()},
        "length_edges": edges,
    }


def judge_info(judges: list[Judge]) -> list[dict]:
    """What results.json and the report say about each judge."""
    return [
        {
            "name": j.name,
            "path": j.path,
            "val_auc": j.val_auc,
            "test_auc": j.meta.get("test_auc"),
            "encoder": j.meta.get("encoder"),
            "shares": j.shares,
            "independent": j.independent,
        }
        for j in judges
    ]


def run_evaluation(prompt_args: EvalPromptArguments, args: EvalArguments, settings: SamplingSettings) -> dict:
    """Load the judges, the reward scorer and the policies, evaluate, write the report files into ``output_dir``."""
    from .protocol import Entry, run_warnings, span
    from .report import write_report
    from .samples import write_samples

    val_aucs = _check_options(args, settings)
    on_trust = False
    if args.from_samples:
        prompts, references, replies = _read_back(args.from_samples, args)
        band = samples_band(args.from_samples, prompt_args)
        on_trust, prompt_args = band is prompt_args, band
    else:
        data = build_prompts(prompt_args)
        prompts = list(data["prompt"])
        has_reference = args.include_reference and "reference" in data.column_names
        references = list(data["reference"]) if has_reference else None
        replies = None
    if len(prompts) < 2:
        raise ValueError(
            f"evaluate-policy needs at least 2 contexts, got {len(prompts)}: its CIs resample contexts, and one "
            "context gives a zero-width CI that a verdict would read as certain (widen the range or --max_prompts)"
        )
    policies, summaries = _load_policies(args) if replies is None else ({}, {})
    prompts = _fit_to_templates(prompts, policies)
    judges, reward_scorer, reward_meta = load_judges(args.judges, args.reward_scorer, val_aucs)
    warnings = []
    if not prompt_args.prompt_file:
        where = Entry(
            "evaluation",
            "evaluation",
            prompt_args.dialogues,
            span(prompt_args.first_dialogue, prompt_args.max_dialogues),
        )
        metas = {j.name: j.meta for j in judges} | ({"reward": reward_meta} if reward_meta else {})
        warnings = run_warnings(where, metas, summaries)
    warnings += [
        f"judge {j.name} reads replies with the base policy's own LM: it favours replies like the base's"
        for j in judges
        if j.meta.get("method") == "lm_pmi"
        and model_identity(str(j.meta.get("encoder"))) == model_identity(args.base_model)
    ]
    for w in warnings:
        print(f"WARNING: {w}", file=sys.stderr)  # with every warning (and results.md holds them)
    if replies is None:  # sampled here: each tuned policy's start against the base it is compared with
        for w in start_mismatches(args.tuned, args.base_model):
            print(f"WARNING: {w}", file=sys.stderr)
            warnings.append(w)  # into results.md and results.json
    start = time.perf_counter()
    result = evaluate_policies(policies, prompts, judges, reward_scorer, args, settings, references, replies)
    result.update(judges=judge_info(judges), warnings=warnings, seconds=round(time.perf_counter() - start, 1))
    result["prompts_on_trust"] = on_trust
    result["device"] = sorted({str(next(model.parameters()).device) for model, _ in policies.values()})
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    text = write_report(out, result, judges, reward_meta, prompt_args, args, settings)
    write_samples(out, result, references, args.sample_contexts)
    main_judge = next((j.name for j in judges if j.independent), judges[0].name)
    scored = {n: [v for v in np.ravel(s) if np.isfinite(v)] for n, s in result["scores"][main_judge].items()}
    plot_distributions({n: v for n, v in scored.items() if v}, out / "pmi_hist.png")  # unscored replies left out
    if args.log_file:
        _log_trials(Path(args.log_file), result, args, prompt_args, summaries)
    print("\n" + text)
    return result


def _check_options(args: EvalArguments, settings: SamplingSettings) -> dict[str, float]:
    """Check what can be checked before anything loads or samples: the judge panel, the reward that best-of-n
    reranks with, the KL (at the sampling temperature: none for greedy replies), and the tuned policies' names (each
    a row of the report: a tuned directory named like the base, another tuned policy or a best-of-n row would merge
    with it). Returns the ``lm:`` judges' validation AUCs."""
    val_aucs = parse_val_aucs(args.judge_val_auc)
    check_panel(args.judges, val_aucs)
    if args.best_of_n and not args.reward_scorer and not args.from_samples:
        raise ValueError("--best_of_n reranks with the reward: give --reward_scorer")
    if args.kl and args.tuned and settings.temperature == 0:
        raise ValueError("--kl compares the tempered policies; greedy replies (--temperature 0) have none: --kl false")
    # the base, the human row and best-of-n rows; "context" and "reference" are keys of a samples.jsonl record
    taken = {"base", HUMAN, "context", "reference", *(f"best-of-{n}" for n in args.best_of_n)}
    for path in args.tuned:
        name = row_name(path)
        if not name:
            raise ValueError(f"tuned policy {path!r} has no folder name to name its row of the report by")
        if name in taken or name.startswith("best-of-"):  # best-of-N names get the analytic KL bound
            raise ValueError(
                f"tuned policy {path!r} is named {name!r} like another row of the report: give its directory "
                "a distinct name"
            )
        taken.add(name)
    for name, path in check_panel(args.judges, val_aucs):  # found out only after the policies had loaded and sampled
        if not path.startswith(LM_PREFIX) and missing_local(path):
            how = DEFAULT_JUDGE_COMMAND if Path(path) == Path(DEFAULT_JUDGE_DIR) else "recipes/README.md, section 4"
            raise FileNotFoundError(
                f"judge {name}={path}: no such scorer folder (train it first: {how}; or give --judges name=DIR)"
            )
    return val_aucs


def _fit_to_templates(prompts: list, policies: dict) -> list:
    """The prompts as every policy's chat template accepts them (``fit_prompts``), one set for all: the policies
    are compared on the same contexts, and the judges read those."""
    # by the template's text (a tokenizer may hold a dict of named templates, which cannot be a key itself)
    templates = {repr(getattr(tok, "chat_template", None)): tok for _, tok in policies.values()}
    fitted = [fit_prompts(prompts, tok) for tok in templates.values()]
    if any(f != fitted[0] for f in fitted[1:]):
        raise DataError(
            "the policies' chat templates accept different prompts (one refuses a conversation that opens with an "
            "assistant turn): evaluate policies of one template together"
        )
    return fitted[0] if fitted else prompts


def _start_identity(name: str) -> str:
    """``model_identity`` of a recorded starting model, where a converted copy of a shipped model (the cache path an
    adapter records as its base, this machine's or another's) counts as the shipped model, as ``load_policy`` maps
    it."""
    shipped = shipped_copy(name)
    if shipped is not None and (
        not Path(name).exists() or Path(name).resolve().parent == (cache_root() / "models").resolve()
    ):
        return shipped
    return model_identity(name)


def recorded_start(path: str | Path) -> str | None:
    """The model a tuned policy folder's run started from: its ``run_summary.json``'s ``start_model``, else its
    LoRA adapter's ``base_model_name_or_path``; None when neither records one (a folder of full weights from an
    older run or another tool)."""
    folder = Path(path)
    for file, key in (("run_summary.json", "start_model"), ("adapter_config.json", "base_model_name_or_path")):
        try:
            value = json.loads((folder / file).read_text()).get(key)
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(value, str) and value.strip():
            return value
    return None


def start_mismatches(tuned: list[str], base_model: str) -> list[str]:
    """A warning for each tuned policy whose recorded starting model (``recorded_start``) is not ``base_model``:
    its gains, win-rates and KL would be measured against another model than the one it was tuned from. A warning,
    not an error: comparing with another base may be meant."""
    base = _start_identity(base_model)
    out = []
    for path in tuned:
        start = recorded_start(path)
        if start is not None and _start_identity(start) != base:
            out.append(
                f"tuned policy {row_name(path)} started from {start}, not from the base it is compared with "
                f"({base_model}): its gain, win-rate and KL are measured against another model (give --base_model "
                f"{start} to compare it with its start)"
            )
    return out


def _load_policies(args: EvalArguments) -> tuple[dict, dict[str, dict]]:
    """The base and the tuned policies by name (``_check_options`` made the names distinct), and each tuned run's
    summary (empty when it has none)."""
    policies, summaries = {"base": load_policy(args.base_model)}, {}
    for path in args.tuned:
        name = row_name(path)
        policies[name] = load_policy(path)
        summary = Path(path) / "run_summary.json"
        summaries[name] = json.loads(summary.read_text()) if summary.is_file() else {}
    return policies, summaries


def _read_back(path: str, args: EvalArguments) -> tuple[list[str], list[str] | None, dict[str, Replies]]:
    """The contexts, human replies and policies' replies of a samples file, checked against the other options."""
    from .samples import read_samples

    if args.tuned or args.best_of_n:
        raise ValueError("--from_samples judges saved replies again: it samples nothing (no --tuned, no --best_of_n)")
    contexts, references, replies = read_samples(path)
    return contexts, references if args.include_reference else None, replies


def samples_band(path: str, given: EvalPromptArguments) -> EvalPromptArguments:
    """Where a samples file's contexts came from: the ``prompts`` record of the ``results.json`` written beside it
    (the overlap check and the report must name the file's contexts, not the options given with it). Without that
    record the given options stand, with a warning that they are taken on trust; so does a record that was itself
    taken on trust (``prompts_on_trust``: an evaluation of read-back samples written into their own folder)."""
    results = Path(path).parent / "results.json"
    try:
        saved = json.loads(results.read_text())
        if saved.get("prompts_on_trust"):
            raise ValueError("its prompts record was itself taken on trust")
        record = saved["prompts"]
        if not isinstance(record, dict):
            raise TypeError(f"prompts is {type(record).__name__}, not an object")
        known = {f.name for f in fields(EvalPromptArguments)}
        band = EvalPromptArguments(**{k: v for k, v in record.items() if k in known})
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        print(
            f"WARNING: {path}: no readable contexts record beside it ({results}: {type(err).__name__}: {err}); the "
            "overlap check and the report take the given prompt options as where its contexts came from",
            file=sys.stderr,
        )
        return given
    if asdict(band) != asdict(given):
        print(f"note: {path}'s contexts came from {results}'s prompt options, not the given ones", file=sys.stderr)
    return band


def _log_trials(path: Path, result: dict, args: EvalArguments, prompt_args, summaries: dict) -> None:
    """One line per policy: when, where (the contexts named as the report's header names them), its training run's
    summary, and its row (the trials log)."""
    from .report import context_source

    path.parent.mkdir(parents=True, exist_ok=True)
    paths = dict(zip([row_name(p) for p in args.tuned], args.tuned, strict=True))
    with path.open("a") as f:
        for row in result["rows"]:
            line = {
                "time": time.strftime("%Y-%m-%d %H:%M:%S"),
                "eval_dir": args.output_dir,
                "contexts": context_source(prompt_args, args),
                "policy": row["policy"],
                "path": paths.get(row["policy"]),
                "run": summaries.get(row["policy"], {}),
                "row": row,
            }
            f.write(json.dumps(json_safe(line), default=str, allow_nan=False) + "\n")

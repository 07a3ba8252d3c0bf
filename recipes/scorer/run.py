"""The reward's scorer, measured: one training setting for ``seeds`` seeds, scored on validation or (once) on test.

Each run trains the public ``fit_scorer`` (the artefact `pmi-reward train` saves) on the en study training file
and/or Chit-Chat dialogues, with contexts cut to the reward's 3 turns, and scores fixed negatives of every kind
the reward must rank below a real reply: random replies (the paper's AUC, 5 per positive), a line of the context
(parroting), a lexical look-alike from another dialogue, the encoder's nearest reply from another dialogue, and a
fixed list of generic replies. ``--stage test`` adds the human-rated set (Spearman/Pearson against the ratings,
all rows, 95% bootstrap intervals). ``--method cosine`` is the untrained baseline: the cosine of the encoder's
context and reply embeddings; ``--method lm_pmi`` the untrained chat LM's own PMI, log p(r | c) - log p(r)
(``LMPMIScorer``; ``--lm_model``, ``--lm_per_token``), scored on the same negatives (mined by ``--model``'s
embeddings, as for every other row); ``--lm_weight w`` combines it with a trained head's score (an ensemble row,
logged as NAME+lmW, or NAME+lmWmin with ``--lm_combine min``); ``--cosine_weight w`` adds w x the encoder's cosine to
a trained head's score (one scorer, the same embeddings; logged as NAME+cosW).
``--max_train_pairs 1000 3000 ...`` trains one run per size (a scaling curve).
``--normalize_k K`` scores the self-normalised PMI instead (``self_normalise``), logged as NAME+selfnormK.
``--paired_cosine true`` (test stage) adds each head's Spearman minus the cosine's, with a paired interval.

    python recipes/scorer/run.py --config recipes/scorer/lines.yaml --stage val
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import torch
from scipy.special import logsumexp

from pmi_reward.configs import parse_args
from pmi_reward.data.dialogues import load_dialogues
from pmi_reward.data.negatives import NegativeSpec, sample_negatives
from pmi_reward.data.pairs import PairSet, load_pairs
from pmi_reward.evaluation.baselines.lm_pmi import LMPMIConfig, LMPMIScorer
from pmi_reward.evaluation.generic import GENERIC_PROBES
from pmi_reward.evaluation.metrics import bootstrap_ci, pearson, roc_auc, spearman
from pmi_reward.scoring.cache import EmbeddingCache
from pmi_reward.scoring.encoder import EncoderSpec, TextEncoder
from pmi_reward.scoring.features import PairFeatures
from pmi_reward.scoring.head import HeadConfig
from pmi_reward.scoring.models import cache_root
from pmi_reward.scoring.scorer import PMIScorer
from pmi_reward.scoring.templates import TEMPLATES
from pmi_reward.training.fit import fit_scorer, mine_negatives
from pmi_reward.training.loop import TrainConfig, score_index_pairs

sys.path.append(str(Path(__file__).resolve().parents[1]))  # recipes/: the scripts' shared input check (run by path)
from recipe_inputs import STUDY_DATA, require_inputs  # noqa: E402

# fixed evaluation negatives per positive, by kind (columns in KINDS order), drawn with EVAL_SEED
EVAL_NEGATIVES = NegativeSpec(k_random=5, k_in_dialogue=0, k_context=1, k_lexical=1, k_nearest=1)
EVAL_SEED = 7
TARGETS = ("annot_relevant_mean", "annot_engaging_mean")


@dataclass
class ScorerRecipeArguments:
    """Which data a run trains on, how it is scored, and where the log goes."""

    name: str = field(metadata={"help": "the run's name in the log"})
    data_dir: str = field(default="../shared/data/pmiscore")
    train_data: list[str] = field(default_factory=lambda: ["study"], metadata={"help": "study and/or chitchat"})
    chitchat_range: list[int] = field(default_factory=lambda: [0, 2000], metadata={"help": "dialogues [a, b)"})
    max_pairs_per_dialogue: int = 8
    select_pairs: int = field(
        default=0,
        metadata={
            "help": "choose the training round on this many validation pairs drawn at random (0: all); the val stage "
            "still scores every pair. For prompt-mode runs, where every validation pair costs 5 encoder passes a round"
        },
    )
    context_turns: int = field(default=3, metadata={"help": "contexts keep their last N turns (the reward's cut)"})
    human_context_turns: int | None = field(
        default=None,
        metadata={
            "help": "test stage: the human-rated set's contexts keep their last N turns (default: --context_turns; "
            "0: whole, as its raters read them and the paper scores them)"
        },
    )
    method: str = field(default="head", metadata={"help": "head (trained), cosine or lm_pmi (untrained baselines)"})
    model: str = "minilm"
    lm_model: str = field(default="smollm2-135m-instruct", metadata={"help": "--method lm_pmi: the chat LM"})
    lm_per_token: bool = field(default=False, metadata={"help": "--method lm_pmi: PMI per reply token"})
    lm_weight: float = field(
        default=0.0, metadata={"help": "--method head: combine the head's score with w x the chat LM's PMI"}
    )
    lm_combine: str = field(default="sum", metadata={"help": "sum: (1 - w) head + w LM; min: min(head, w LM)"})
    cosine_weight: float = field(
        default=0.0,
        metadata={"help": "--method head: add w x the encoder's cosine of context and reply (nats per unit of cosine)"},
    )
    init_scorer: str | None = field(
        default=None,
        metadata={
            "help": "continue training from this saved scorer: its encoder (fine-tuned further under --train_encoder) "
            "and its head, validated as round 0"
        },
    )
    seeds: int = 3
    first_seed: int = field(default=0, metadata={"help": "seeds first_seed .. first_seed + seeds - 1"})
    progress: bool = field(default=False, metadata={"help": "progress bars of training (long fine-tuning runs)"})
    stage: str = field(default="val", metadata={"help": "val (choose) or test (once, with the human set)"})
    max_train_pairs: list[int] = field(default_factory=list, metadata={"help": "one run per size (scaling)"})
    normalize_k: int = field(
        default=0,
        metadata={
            "help": "self-normalise every score by its context's log-mean-exp score against K reference replies "
            "drawn from the training data (0: raw scores)"
        },
    )
    paired_cosine: bool = field(
        default=False,
        metadata={
            "help": "test stage, trained heads: also score the human set by the pretrained encoder's cosine and give "
            "the difference in Spearman (head - cosine) with a paired bootstrap interval (the same rows resampled)"
        },
    )
    n_boot: int = 1000
    threads: int = field(default=1, metadata={"help": "torch threads (the frozen runs' figures: 1)"})
    output_dir: str = "outputs/scorer-recipe"
    scorer_dir: str | None = field(
        default=None,
        metadata={
            "help": "save each trained scorer under DIR/NAME/ (val stage) and load it from there instead of "
            "retraining when the settings match (test stage): training is deterministic, so it is the same scorer"
        },
    )


def training_pairs(args: ScorerRecipeArguments, root: Path) -> PairSet:
    sets = []
    if "study" in args.train_data:
        sets.append(load_pairs(root / "train.csv", max_context_turns=args.context_turns))
    if "chitchat" in args.train_data:
        a, b = args.chitchat_range
        dialogues = load_dialogues("chitchat")[a:b]
        sets.append(
            PairSet.from_dialogues(dialogues, args.context_turns, max_pairs_per_dialogue=args.max_pairs_per_dialogue)
        )
    if not sets:
        raise SystemExit(f"--train_data {args.train_data}: name study and/or chitchat")
    return PairSet.concat(sets) if len(sets) > 1 else sets[0]


def human_pairs(args: ScorerRecipeArguments, root: Path) -> PairSet:
    """The human-rated set, its contexts cut like the others (``--context_turns``) or as ``--human_context_turns``
    says (0: whole)."""
    turns = args.context_turns if args.human_context_turns is None else args.human_context_turns or None
    return load_pairs(root / "human.csv", extra_columns=TARGETS, max_context_turns=turns)


def subsample(pairs: PairSet, n: int, seed: int = 0) -> PairSet:
    """``n`` pairs drawn at random (all when n is 0 or more than there are)."""
    if not n or n >= len(pairs):
        return pairs
    keep = np.sort(np.random.default_rng(seed).choice(len(pairs), n, replace=False))
    return PairSet.from_pairs(
        [pairs.context_texts[i] for i in keep],
        [pairs.response_texts[i] for i in keep],
        [str(pairs.group[i]) for i in keep],
    )


def same_settings(saved: dict | None, current: dict) -> bool:
    """Whether a saved scorer was trained with ``current``'s settings; a training option added after it was saved
    counts at its default (the scorer was trained as that default does)."""
    if not saved:
        return False
    defaults = json.loads(json.dumps(asdict(TrainConfig())))
    training = {**defaults, **saved.get("training", {})}
    return {**saved, "training": {k: training[k] for k in current["training"] if k in training}} == current


def train_or_reuse(
    args: ScorerRecipeArguments,
    train: PairSet,
    val: PairSet,
    encoder: TextEncoder,
    config: TrainConfig,
    head: HeadConfig,
    negatives: NegativeSpec,
) -> tuple[PMIScorer, dict]:
    """A scorer of these settings and its log fields: loaded from ``scorer_dir`` when a scorer trained with the very
    same settings (data, head, negatives, optimisation, seed) is saved there, else trained (and saved there)."""
    settings = json.loads(
        json.dumps(
            {
                "train_data": args.train_data,
                "chitchat_range": args.chitchat_range,
                "train_pairs": len(train),
                "head": asdict(head),
                "negatives": asdict(negatives),
                "training": asdict(config),
                **({"select_pairs": args.select_pairs} if args.select_pairs else {}),
                # the cut leaves the pair count as it is: a scorer of another cut is another scorer (the default 3
                # has no key, as the scorers saved before it)
                **({"context_turns": args.context_turns} if args.context_turns != 3 else {}),
                **({"init_scorer": args.init_scorer} if args.init_scorer else {}),
            }
        )
    )
    cut = f"-turns{args.context_turns}" if args.context_turns != 3 else ""  # another cut, another folder
    where = Path(args.scorer_dir) / args.name / f"pairs{len(train)}-seed{config.seed}{cut}" if args.scorer_dir else None
    if where is not None and (where / "config.json").is_file():
        meta = PMIScorer.read_metadata(where)
        if same_settings(meta.get("recipe"), settings):  # a fine-tuned scorer carries its own encoder
            shared = encoder if config.train_encoder == "none" else None
            return PMIScorer.from_pretrained(where, encoder=shared), meta["recipe_row"]
    start = None
    if args.init_scorer:  # its encoder and head, trained further
        init = PMIScorer.from_pretrained(args.init_scorer)
        encoder, start = init.encoder, init.head
    scorer, result = fit_scorer(
        train,
        val,
        encoder,
        TEMPLATES["en"],
        config,
        head,
        negatives,
        {"recipe": settings},
        progress=args.progress,
        start_head=start,
    )
    row: dict = {"train_pairs": len(train), "best_val_auc": result.best_val_auc, "best_epoch": result.best_epoch}
    if config.train_encoder != "none":  # round 0 is the warmed-up head on the pretrained encoder
        row["val_auc_by_round"] = [None if h["val_auc"] is None else round(h["val_auc"], 4) for h in result.history]
        row["seconds_by_round"] = [round(h["seconds"]) for h in result.history]
    if scorer.head.prior_parameters():  # a residual head: the cosine's learned scale and shift
        row["prior_scale_shift"] = [round(p.detach().item(), 4) for p in scorer.head.prior_parameters()]
    if where is not None:
        scorer.metadata["recipe_row"] = row
        scorer.save_pretrained(where)
    return scorer, row


class Scoring:
    """Scores of index pairs of a PairSet: a trained scorer's head, or the cosine of the embeddings."""

    def __init__(self, encoder: TextEncoder, head=None) -> None:
        self.encoder, self.head = encoder, head

    def features(self, pairs: PairSet) -> PairFeatures:
        lines = self.head.config.line_turns if self.head is not None else 0
        return PairFeatures(self.encoder, TEMPLATES["en"], pairs, "pair", False, lines)

    def __call__(self, features: PairFeatures, ctx: np.ndarray, resp: np.ndarray) -> np.ndarray:
        if self.head is not None:
            return score_index_pairs(self.head, features, ctx, resp)
        features.prepare(np.ravel(ctx), np.ravel(resp))
        u, v = features(ctx, resp)
        with torch.no_grad():
            return torch.nn.functional.cosine_similarity(u, v, dim=-1).numpy()


class PromptScoring(Scoring):
    """A prompt-mode scorer (one encoder pass per context and reply together: a cross-encoder when fine-tuned);
    its features are the pretrained encoder's pair embeddings, of which it reads only the pairs (the negatives are
    mined by that encoder for every row: ``eval_negatives``)."""

    def __init__(self, encoder: TextEncoder, scorer: PMIScorer) -> None:
        super().__init__(encoder)
        self.scorer = scorer

    def __call__(self, features: PairFeatures, ctx: np.ndarray, resp: np.ndarray) -> np.ndarray:
        prompts = PairFeatures(self.scorer.encoder, self.scorer.template, features.pairs, "prompt", False)
        return score_index_pairs(self.scorer.head, prompts, ctx, resp)


class LMScoring(Scoring):
    """The chat LM's zero-shot PMI of index pairs; its features are the encoder's, of which it reads only the pairs
    (the negatives are mined by the pretrained encoder for every row: ``eval_negatives``)."""

    def __init__(self, encoder: TextEncoder, lm: LMPMIScorer) -> None:
        super().__init__(encoder)
        self.lm = lm

    def __call__(self, features: PairFeatures, ctx: np.ndarray, resp: np.ndarray) -> np.ndarray:
        pairs = features.pairs
        flat_c, flat_r = np.ravel(ctx), np.ravel(resp)
        texts = [pairs.contexts[i] for i in flat_c], [pairs.responses[i] for i in flat_r]
        scores = self.lm.score(*texts, progress=True)
        return scores.reshape(np.shape(ctx))


def lm_scorer(args: ScorerRecipeArguments, out: Path) -> LMPMIScorer:
    """The chat LM's PMI scorer of ``--lm_model``, its log-likelihoods cached beside the run log. Replies are read
    whole: the study's texts are at most 942 tokens (no reply is cut, as when RESULTS.md's figures were taken)."""
    config = LMPMIConfig(model=args.lm_model, per_token=args.lm_per_token, max_reply_tokens=1024)
    return LMPMIScorer(config, cache_file=out / "lm-pmi-cache.jsonl")


class MixScoring(Scoring):
    """A trained head's score combined with another score of the same pairs: the chat LM's zero-shot PMI (two PMI
    estimates, a labelled ensemble row, not a single scorer) or the encoder's cosine (no trained parameter, the same
    embeddings: one scorer). ``sum``, (1 - w) x head + w x other; ``min``, min(head, w x other), credit only where
    both agree (the head refuses copies, the LM on-topic non-answers); ``add``, head + w x other."""

    COMBINES = ("sum", "min", "add")

    def __init__(self, head: Scoring, other: Scoring, weight: float, combine: str = "sum") -> None:
        super().__init__(head.encoder, head.head)
        if combine not in self.COMBINES:
            raise ValueError(f"combine must be one of {self.COMBINES}, got {combine!r}")
        self.other, self.weight, self.combine = other, weight, combine
        self._features: dict[int, tuple[PairFeatures, PairFeatures]] = {}

    def other_features(self, features: PairFeatures) -> PairFeatures:
        """The other score's own features of the same pairs (the cosine reads no context lines), built once."""
        if id(features) not in self._features:  # the pair keeps ``features`` alive, so its id is not reused
            self._features[id(features)] = (features, self.other.features(features.pairs))
        return self._features[id(features)][1]

    def __call__(self, features: PairFeatures, ctx: np.ndarray, resp: np.ndarray) -> np.ndarray:
        head = super().__call__(features, ctx, resp)
        other = self.weight * self.other(self.other_features(features), ctx, resp)
        if self.combine == "min":
            return np.minimum(head, other)
        return head + other if self.combine == "add" else (1 - self.weight) * head + other


def row_scoring(
    encoder: TextEncoder, trained: Scoring | None, lm: LMPMIScorer | None, args: ScorerRecipeArguments
) -> Scoring:
    """What a row scores with: the trained head (combined with the chat LM under ``--lm_weight``, or plus the
    encoder's cosine under ``--cosine_weight``), else the chat LM alone (``--method lm_pmi``), else the cosine."""
    if trained is not None:
        if args.cosine_weight:
            return MixScoring(trained, Scoring(encoder), args.cosine_weight, "add")
        return trained if lm is None else MixScoring(trained, LMScoring(encoder, lm), args.lm_weight, args.lm_combine)
    return Scoring(encoder) if lm is None else LMScoring(encoder, lm)


def reference_replies(train: PairSet, k: int) -> list[str]:
    """``k`` distinct training replies drawn with ``EVAL_SEED``: a sample of the marginal p(r)."""
    distinct = sorted(set(train.response_texts))
    if k > len(distinct):
        raise SystemExit(f"--normalize_k {k}: the training data has only {len(distinct)} distinct replies")
    return [distinct[i] for i in np.random.default_rng(EVAL_SEED).choice(len(distinct), k, replace=False)]


def self_normalise(scoring: Scoring, pairs: PairSet, reference: list[str]) -> np.ndarray:
    """Per row of ``pairs``: log (1/K) sum_k exp s(c, r_k) over the K reference replies, for its context c.

    At the NWJ optimum s = log p(r|c)/p(r), E_{r ~ p(r)} exp s(c, r) = 1 for EVERY context, so this is 0; a trained
    head meets the constraint only on average over contexts. Subtracting it gives scores that are comparable
    across contexts (the human-rated set has one reply per context)."""
    contexts = pairs.contexts
    probe = PairSet.from_pairs([c for c in contexts for _ in reference], list(reference) * len(contexts))
    s = scoring(scoring.features(probe), probe.ctx, probe.resp).astype(np.float64).reshape(len(contexts), -1)
    return (logsumexp(s, axis=1) - np.log(len(reference)))[pairs.ctx]


def paired_difference(
    score: np.ndarray, baseline: np.ndarray, y: np.ndarray, n_boot: int
) -> tuple[float, tuple[float, float]]:
    """Spearman(score, y) - Spearman(baseline, y) and its 95% bootstrap interval, resampling rows jointly: both
    scorers see the same draws, so the interval is that of the difference (narrower than the two separate ones
    when the scorers rank rows alike)."""

    def diff(a: np.ndarray, b: np.ndarray, t: np.ndarray) -> float:
        return spearman(a, t) - spearman(b, t)

    return diff(score, baseline, y), bootstrap_ci(diff, score, baseline, y, n_boot=n_boot)


def eval_negatives(pairs: PairSet, encoder: TextEncoder) -> np.ndarray:
    """The fixed evaluation negatives of ``pairs`` (``EVAL_NEGATIVES``, drawn with ``EVAL_SEED``), the mined kinds
    (lexical, nearest) mined with ``encoder``'s plain pair embeddings: the run's pretrained, frozen encoder, so that
    every row and seed is ranked against one pool, whatever encoder its scorer reads (a fine-tuned encoder's nearest
    replies would be a pool of its own making, and another per seed).

    Mined on a copy of ``pairs`` whose ``mined`` is empty: the tables ``pairs.mined`` holds (those training mined,
    with the encoder it started from, or another row's) are neither read nor filled. With the recipe's embedding
    cache, the embeddings (and so the tables) are the same for every row, however many rows ran before it."""
    fresh = replace(pairs, mined={})
    mine_negatives(fresh, EVAL_NEGATIVES, PairFeatures(encoder, TEMPLATES["en"], fresh, "pair", False))
    return sample_negatives(fresh, EVAL_NEGATIVES, np.random.default_rng(EVAL_SEED))


def evaluate(
    scoring: Scoring,
    pairs: PairSet,
    encoder: TextEncoder,
    human: PairSet | None,
    n_boot: int,
    reference: list[str] | None = None,
    baseline: Scoring | None = None,
) -> dict:
    """AUC against each kind of fixed negative (mined by the run's pretrained ``encoder``: ``eval_negatives``), the
    generic probes, and (with ``human``) the correlations; with ``reference`` replies, of the self-normalised scores;
    with a ``baseline`` (the cosine), the paired difference of the human correlations."""
    negs = eval_negatives(pairs, encoder)
    features = scoring.features(pairs)
    # positives and negatives in one call: a scorer that reads each context once (the chat LM) reads it once here
    both = scoring(features, np.repeat(pairs.ctx[:, None], 1 + negs.shape[1], 1), np.column_stack([pairs.resp, negs]))
    pos, neg = both[:, 0], both[:, 1:]
    offset = self_normalise(scoring, pairs, reference) if reference else np.zeros(len(pairs))
    pos, neg = pos - offset, neg - offset[:, None]
    out: dict = {"pos_mean": float(pos.mean())}
    col = 0
    for kind, k in EVAL_NEGATIVES.counts().items():
        if k:
            out[f"auc_{kind}"] = roc_auc(pos, neg[:, col : col + k])
            if kind == "random":  # the paper's test protocol: 3 random negatives per positive
                out["auc_random3"] = roc_auc(pos, neg[:, :3])
            col += k
    n = min(200, len(pairs))
    contexts = [pairs.context_texts[i] for i in range(n)]
    probes = PairSet.from_pairs([c for c in contexts for _ in GENERIC_PROBES], list(GENERIC_PROBES) * n)
    gen = scoring(scoring.features(probes), probes.ctx, probes.resp).reshape(n, len(GENERIC_PROBES))
    gen = gen - offset[:n, None]
    out["generic_mean"] = float(gen.mean())
    out["auc_generic"] = roc_auc(pos[:n], gen)
    if human is not None:
        hf = scoring.features(human)
        score = scoring(hf, human.ctx, human.resp).astype(np.float64)
        if reference:
            score = score - self_normalise(scoring, human, reference)
        base = baseline(baseline.features(human), human.ctx, human.resp).astype(np.float64) if baseline else None
        for target in TARGETS:
            y = np.asarray(human.extras[target], dtype=np.float64)
            short = target.split("_")[1]
            out[f"spearman_{short}"] = spearman(score, y)
            out[f"spearman_{short}_ci"] = bootstrap_ci(spearman, score, y, n_boot=n_boot)
            out[f"pearson_{short}"] = pearson(score, y)
            # the paper's way: the mean over 4 disjoint random subsets of ~94 rows (its rounds used ~92 of 375)
            parts = np.array_split(np.random.default_rng(EVAL_SEED).permutation(len(y)), 4)
            out[f"spearman_{short}_subsets"] = float(np.mean([spearman(score[i], y[i]) for i in parts]))
            if base is not None:
                delta, ci = paired_difference(score, base, y, n_boot)
                out[f"spearman_{short}_minus_cosine"], out[f"spearman_{short}_minus_cosine_ci"] = delta, ci
    return out


def main(argv: list[str] | None = None) -> int:
    args, head, negatives, config = parse_args(
        (ScorerRecipeArguments, HeadConfig, NegativeSpec, TrainConfig), argv, prog="recipes/scorer/run.py"
    )
    torch.set_num_threads(args.threads)
    splits = ["val"] + ([] if args.stage == "val" else ["test"]) + (["human"] if args.stage == "test" else [])
    if "study" in args.train_data and (args.method == "head" or args.normalize_k):  # what training_pairs reads
        splits.append("train")
    files = [f"datasets/empirical/en/{split}.csv" for split in splits]
    require_inputs("recipes/scorer/run.py", f"--data_dir should be {STUDY_DATA}", files, args.data_dir)
    root = Path(args.data_dir) / "datasets" / "empirical" / "en"
    val = load_pairs(root / "val.csv", max_context_turns=args.context_turns)
    eval_set = val if args.stage == "val" else load_pairs(root / "test.csv", max_context_turns=args.context_turns)
    human = None
    if args.stage == "test":
        human = human_pairs(args, root)
    cache = EmbeddingCache(cache_root() / "embeddings")
    encoder = TextEncoder(EncoderSpec(args.model), cache=cache)
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    if args.method not in ("head", "cosine", "lm_pmi"):
        raise SystemExit(f"--method {args.method}: head, cosine or lm_pmi")
    if args.lm_weight and (args.method != "head" or not 0 < args.lm_weight <= 1):
        raise SystemExit(f"--lm_weight {args.lm_weight}: a weight in (0, 1], with --method head")
    if args.lm_combine not in ("sum", "min"):
        raise SystemExit(f"--lm_combine {args.lm_combine}: sum or min")
    if args.cosine_weight and (args.method != "head" or args.lm_weight or args.cosine_weight < 0):
        raise SystemExit(f"--cosine_weight {args.cosine_weight}: a weight >= 0, with --method head and no --lm_weight")
    all_train = training_pairs(args, root) if args.method == "head" else None
    lm = lm_scorer(args, out) if args.method == "lm_pmi" or args.lm_weight else None  # loaded once, for every seed
    if args.paired_cosine and args.normalize_k:
        raise SystemExit("--paired_cosine compares raw scores with the raw cosine: drop --normalize_k")
    reference = None
    if args.normalize_k:
        source = all_train if all_train is not None else training_pairs(args, root)
        reference = reference_replies(source, args.normalize_k)
    for size in args.max_train_pairs or [0]:
        seeds = range(args.first_seed, args.first_seed + args.seeds) if args.method == "head" else range(1)
        for seed in seeds:
            start = time.perf_counter()
            name = f"{args.name}+selfnorm{args.normalize_k}" if args.normalize_k else args.name
            if args.lm_weight:  # the head is saved under --name
                name = f"{name}+lm{args.lm_weight:g}" + ("min" if args.lm_combine == "min" else "")
            if args.cosine_weight:
                name = f"{name}+cos{args.cosine_weight:g}"
            row: dict = {"name": name, "stage": args.stage, "method": args.method, "seed": seed}
            if args.lm_weight:
                row["lm_weight"], row["lm_combine"] = args.lm_weight, args.lm_combine
            if args.cosine_weight:
                row["cosine_weight"] = args.cosine_weight
            if all_train is not None:
                train = subsample(all_train, size, seed)
                tc = TrainConfig(**{**config.__dict__, "seed": seed})
                # every seed fine-tunes a fresh pretrained encoder (fit_scorer tunes a copy of the one it is given)
                base = encoder if tc.train_encoder == "none" else TextEncoder(EncoderSpec(args.model), cache=cache)
                select = subsample(val, args.select_pairs, EVAL_SEED)
                scorer, fields = train_or_reuse(args, train, select, base, tc, head, negatives)
                row |= fields
                prompt = scorer.input_mode == "prompt"
                trained = PromptScoring(encoder, scorer) if prompt else Scoring(scorer.encoder, scorer.head)
            else:
                trained = None
            scoring = row_scoring(encoder, trained, lm, args)
            if lm is not None:
                row["lm"] = lm.describe()
            if human is not None and args.human_context_turns is not None:
                row["human_context_turns"] = args.human_context_turns
            paired = Scoring(encoder) if args.paired_cosine and human is not None and args.method != "cosine" else None
            row |= evaluate(scoring, eval_set, encoder, human, args.n_boot, reference, paired)
            row["seconds"] = round(time.perf_counter() - start, 1)
            row["settings"] = {
                "train_data": args.train_data,
                "head": head.__dict__,
                "negatives": negatives.__dict__,
                "training": config.__dict__,
            }
            with (out / "runs.jsonl").open("a") as f:
                f.write(json.dumps(row) + "\n")
            print(json.dumps({k: v for k, v in row.items() if k != "settings"}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Quality push, on train/val only: PMIScore variants compared by validation ROC-AUC, one line per try.

Each variant changes one thing against ``base`` (MiniLM, pair input [u, v, u*v], NWJ, per-seed fixed
negatives with the config's mix, the study's: 3 random) and is trained with the one training loop for ``seeds`` seeds.
Validation positives are scored against fixed random negatives (the paper's AUC) and in-dialogue
negatives; the average of the seeds' scores (head averaging) is reported too. Test and human sets are
never read here: winners are then run once through ``recipes/empirical``.

    python recipes/quality/run.py --config recipes/quality/en.yaml
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from pmi_reward.configs import parse_args
from pmi_reward.data.negatives import NegativeSpec, sample_negatives
from pmi_reward.data.pairs import PairSet, load_pairs
from pmi_reward.evaluation.baselines.kde import KDEConfig
from pmi_reward.evaluation.metrics import format_mean_std, roc_auc
from pmi_reward.evaluation.report import markdown_table, provenance
from pmi_reward.evaluation.study import EvalSet, FeatureBank, fit_method
from pmi_reward.scoring.cache import EmbeddingCache
from pmi_reward.scoring.encoder import EncoderSpec, TextEncoder
from pmi_reward.scoring.head import HeadConfig
from pmi_reward.scoring.models import cache_root
from pmi_reward.scoring.templates import TEMPLATES
from pmi_reward.training.loop import TrainConfig, score_index_pairs, train_head
from pmi_reward.training.trainable import LoraSpec, TrainableFeatures, add_lora

sys.path.append(str(Path(__file__).resolve().parents[1]))  # recipes/: the scripts' shared input check (run by path)
from recipe_inputs import STUDY_DATA, require_inputs  # noqa: E402

# one change each against the base setting (keys: Try fields)
VARIANTS: dict[str, dict] = {
    "base": {},
    "mix-3r-1d": {"k_in_dialogue": 1},
    "mix-3r-1d-resample": {"k_in_dialogue": 1, "resample": True},
    "mix-7r-1d": {"k_random": 7, "k_in_dialogue": 1},
    "random-k8": {"k_random": 8},
    "resample-every-epoch": {"resample": True},
    "concat-uv": {"pair_product": False},
    "no-normalize": {"normalize": False},
    "weight-decay-0.1": {"weight_decay": 0.1},
    "head-512-256": {"hidden": (512, 256)},
    "head-64": {"hidden": (64,)},
    "lr-x0.3": {"lr_scale": 0.3},
    "context-last-3-turns": {"context_turns": 3},
    "layer-5-of-6": {"layer": 5},
    "layer-4-of-6": {"layer": 4},
    "prompt-input": {"input_mode": "prompt"},
    # the KDE baseline's bandwidth (on the same head inputs; one seed: it has no training randomness)
    "kde-scott": {"kde": {"bandwidth": "scott"}},
    "kde-scott-whiten-pca16": {"kde": {"bandwidth": "scott", "whiten": True, "n_components": 16}},
    "kde-bandwidth-3": {"kde": {"bandwidth": 3.0}},
    "kde-bandwidth-10": {"kde": {"bandwidth": 10.0}},
    # LoRA adapters on the encoder, trained with the head under the same NWJ loss (slow on CPU)
    "lora-r8": {"lora": True},
}


@dataclass
class Try:
    """The knobs a variant may turn; unset negative counts are the config's mix (the study's: 3 random only)."""

    input_mode: str = "pair"
    pair_product: bool = True
    hidden: tuple = (256, 128)
    k_random: int | None = None
    k_in_dialogue: int | None = None
    resample: bool = False
    layer: int = -1
    normalize: bool = True
    weight_decay: float = 0.01
    lr_scale: float = 1.0
    context_turns: int | None = None  # keep only the last N turns of every context
    kde: dict | None = None  # fit the KDE baseline (KDEConfig fields) instead of training a head
    lora: bool = False  # fine-tune LoRA adapters (r=8) of the encoder along with the head


@dataclass
class QualityArguments:
    """The data, the encoder, which variants, and the fixed validation negatives (their counts: the YAML's)."""

    val_k_random: int = field(metadata={"help": "random validation negatives per positive (the paper's AUC)"})
    val_k_in_dialogue: int = field(metadata={"help": "in-dialogue validation negatives per positive"})
    data_dir: str = field(default="../shared/data/pmiscore")
    lang: str = "en"
    model: str = "minilm"
    dtype: str = "float32"
    variants: list[str] = field(default_factory=lambda: list(VARIANTS), metadata={"help": f"of {list(VARIANTS)}"})
    seeds: int = 3
    max_train_pairs: int | None = field(default=None, metadata={"help": "first N training pairs (for slow tries)"})
    lora_epochs: int = 3
    lora_batch_size: int = 32
    epochs: int = 40
    patience: int = 6
    output_dir: str = "outputs/quality-en"
    progress: bool = True


def _last_turns(pairs: PairSet, n: int) -> PairSet:
    cut = PairSet(**{**pairs.__dict__})
    cut.contexts = ["\n".join(c.split("\n")[-n:]) for c in pairs.contexts]
    return cut


def run_variant(
    name: str, args: QualityArguments, base: NegativeSpec, cache: EmbeddingCache, train, val, val_negs
) -> dict:
    t = replace(Try(), **VARIANTS[name])
    if t.context_turns:
        train, val = _last_turns(train, t.context_turns), _last_turns(val, t.context_turns)
    spec = EncoderSpec(args.model, normalize=t.normalize, layer=t.layer, dtype=args.dtype)
    bank = FeatureBank(TextEncoder(spec, cache=cache), TEMPLATES[args.lang], progress=args.progress)
    changes = {k: v for k, v in (("k_random", t.k_random), ("k_in_dialogue", t.k_in_dialogue)) if v is not None}
    mix = replace(base, **changes)
    head = HeadConfig(bank.encoder.dim, t.input_mode, t.hidden, pair_product=t.pair_product)
    val_set = EvalSet("val", val, val_negs)
    fv = bank(val_set, t.input_mode)
    seeds, start = [], time.perf_counter()
    for seed in range(1 if t.kde else args.seeds):
        rng = np.random.default_rng(seed)
        train_negs = None if t.resample else sample_negatives(train, mix, rng)
        config = TrainConfig(
            epochs=args.epochs,
            patience=args.patience,
            weight_decay=t.weight_decay,
            seed=seed,
            lr=1e-3 * 1024 / bank.encoder.dim * t.lr_scale,
        )
        fit_val = EvalSet("val", val, sample_negatives(val, mix, np.random.default_rng(1000 + seed)))
        if t.kde:
            score, _ = fit_method(
                "kde", head, EvalSet("train", train, train_negs), fit_val, bank, config, KDEConfig(**t.kde)
            )
            seeds.append((score(fv, val.ctx, val.resp), score(fv, val_set.negative_contexts(), val_negs), 0))
            continue
        ft = bank(EvalSet("train", train), t.input_mode)
        if t.lora:  # a fresh encoder with adapters per seed; features embed with gradients, no cache
            tuned = TextEncoder(replace(spec, encode_batch_size=args.lora_batch_size), cache=None)
            add_lora(tuned, LoraSpec())
            ft, fv = TrainableFeatures(tuned, bank.template, train), TrainableFeatures(tuned, bank.template, val)
            config = replace(
                config, epochs=args.lora_epochs, patience=args.lora_epochs, batch_size=args.lora_batch_size
            )
        result = train_head(head, ft, train, fv, val, config, False, train_negs, fit_val.negatives, negatives=mix)
        seeds.append(
            (
                score_index_pairs(result.head, fv, val.ctx, val.resp),
                score_index_pairs(result.head, fv, val_set.negative_contexts(), val_negs),
                result.best_epoch,
            )
        )
    k = args.val_k_random
    aucs = {"random": lambda p, n: roc_auc(p, n[:, :k]), "in_dialogue": lambda p, n: roc_auc(p, n[:, k:])}
    row = {
        "variant": name,
        "changes": VARIANTS[name],
        "seconds": round(time.perf_counter() - start),
        "best_epochs": [s[2] for s in seeds],
    }
    for key, fn in aucs.items():
        row[f"val_auc_{key}"] = [fn(p, n) for p, n, _ in seeds]
        row[f"val_auc_{key}_avg_heads"] = fn(np.mean([s[0] for s in seeds], 0), np.mean([s[1] for s in seeds], 0))
    return row


def main(argv: list[str] | None = None) -> int:
    args, base = parse_args((QualityArguments, NegativeSpec), argv, prog="recipes/quality/run.py")
    # every name checked before the first try: a typo after a slow variant (lora-r8: hours on a CPU) ended in a
    # KeyError once the earlier ones had run, and the table was never written
    unknown = [name for name in args.variants if name not in VARIANTS]
    if unknown:
        raise SystemExit(f"--variants {' '.join(unknown)}: unknown; choose from {' '.join(VARIANTS)}")
    where = f"datasets/empirical/{args.lang}"
    files = [f"{where}/train.csv", f"{where}/val.csv"]
    require_inputs("recipes/quality/run.py", f"--data_dir should be {STUDY_DATA}", files, args.data_dir)
    root = Path(args.data_dir) / where
    train, val = load_pairs(root / "train.csv"), load_pairs(root / "val.csv")
    if args.max_train_pairs:
        keep = list(range(min(args.max_train_pairs, len(train))))
        train = PairSet.from_pairs(
            [train.context_texts[i] for i in keep],
            [train.response_texts[i] for i in keep],
            [str(train.group[i]) for i in keep],
        )
    val_spec = NegativeSpec(args.val_k_random, args.val_k_in_dialogue, 0)
    val_negs = sample_negatives(val, val_spec, np.random.default_rng(20_000))
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    cache = EmbeddingCache(cache_root() / "embeddings")
    rows = []
    for name in args.variants:
        rows.append(run_variant(name, args, base, cache, train, val, val_negs))
        with (out / "tries.jsonl").open("a") as f:
            f.write(json.dumps(rows[-1]) + "\n")
        print(json.dumps(rows[-1]), flush=True)
    table = [
        [
            r["variant"],
            json.dumps(r["changes"]),
            format_mean_std(r["val_auc_random"]),
            f"{r['val_auc_random_avg_heads']:.3f}",
            format_mean_std(r["val_auc_in_dialogue"]),
            f"{r['val_auc_in_dialogue_avg_heads']:.3f}",
            str(r["best_epochs"]),
            str(r["seconds"]),
        ]
        for r in rows
    ]
    text = "\n\n".join(
        [
            f"# Quality push ({args.lang}, {args.model}): validation only",
            provenance(),
            markdown_table(
                [
                    "variant",
                    "change vs base",
                    "val AUC random",
                    "avg heads",
                    "val AUC in-dialogue",
                    "avg heads",
                    "best epochs",
                    "s",
                ],
                table,
            ),
        ]
    )
    (out / "results.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

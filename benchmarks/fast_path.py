"""The fast CPU scoring path against the bare float32 forward: speed on the same texts, and what it costs in accuracy.

Speed: the first ``--pairs`` pairs of ``--input`` (distinct contexts and replies, and the context lines a scorer
with line features embeds too), embedded by a bare float32 torch forward of the scorer's encoder (pre-tokenized,
length-sorted, only ``model(**batch)`` timed, as in ``throughput.py``), by ``PMIScorer.score`` in float32 torch,
and by ``PMIScorer.score`` on the fast path for each of ``--quantize`` (comma-separated: ``none``, ``int8``,
``int8-block``) with ``--backend``, and for each of ``--dtypes`` with the torch backend (e.g. ``bfloat16``: on a CPU
with AVX512-BF16 or AMX), all without an embedding cache, at ``--threads`` threads; runs alternate, the
fastest of ``--repeats`` is compared. Accuracy: every pair of ``--input`` and seeded negatives of the mix the
scorer was trained with (its metadata; ``NegativeSpec``'s default if it has none), scored by the float32 scorer and
by each fast one: ROC-AUC of each, and how far the fast path's PMI is from float32's (share of scores within 0.1
nat, quantiles of the gap). Accuracy uses the embedding cache (``--cache_dir``): each runtime's embeddings have
their own keys, so nothing mixes; ``--no_accuracy`` times only.

``--device cuda``: everything timed runs on the GPU (the bare forward, the float32 scorer, each ``--dtypes``
variant; pass ``--quantize ''``, ONNX Runtime is refused there), while accuracy keeps the CPU's float32 scores
as the reference and adds the GPU's float32 scorer as one more variant: the same scorer, another device. Each
device then caches its embeddings in its own folder under ``--cache_dir``.

The HF tokenizers run on one thread (``TOKENIZERS_PARALLELISM=false``, as the Makefile sets it) unless the
environment says otherwise, so that ``--threads 1`` means one thread for the scorers too, which tokenize while
timed (the bare forward is pre-tokenized); the result records the setting.

    python benchmarks/fast_path.py --scorer outputs/scorer --backend onnx --quantize int8,int8-block --threads 1
    python benchmarks/fast_path.py --scorer outputs/scorer --device cuda --quantize '' --dtypes bfloat16 \
        --pairs 1000 --encode_batch_size 256
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

# before the tokenizers are imported or used: their thread pool is otherwise one thread per core
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np
import torch
from sklearn.metrics import roc_auc_score
from throughput import bare_batches

from pmi_reward.data.negatives import NegativeSpec
from pmi_reward.data.pairs import load_pairs
from pmi_reward.scoring.models import cache_root
from pmi_reward.scoring.scorer import PMIScorer
from pmi_reward.training.fit import score_with_negatives


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scorer", required=True, help="a scorer directory or Hub repo id")
    parser.add_argument("--input", default="../shared/data/pmiscore/datasets/empirical/en/test.csv")
    parser.add_argument("--backend", default="onnx")
    parser.add_argument("--quantize", default="int8,int8-block", help="comma-separated: none, int8, int8-block")
    parser.add_argument("--dtypes", default="", help="comma-separated torch dtypes to time too, e.g. bfloat16")
    parser.add_argument("--pairs", type=int, default=512, help="pairs timed")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu", help="where the timed runs go: cpu, cuda, cuda:1 ...")
    parser.add_argument("--encode_batch_size", type=int, default=None, help="default: the scorer's")
    parser.add_argument("--cache_dir", default=str(cache_root() / "embeddings"), help="for the accuracy part")
    parser.add_argument("--seed", type=int, default=2)
    parser.add_argument("--no_accuracy", action="store_true", help="time only")
    return parser.parse_args()


def _timed_texts(path: str, n: int) -> tuple[list[str], list[str]]:
    pairs = load_pairs(Path(path))
    seen_c, seen_r, contexts, replies = set(), set(), [], []
    for c, r in zip(pairs.ctx.tolist(), pairs.resp.tolist(), strict=True):
        if c not in seen_c and r not in seen_r and len(contexts) < n:
            seen_c.add(c), seen_r.add(r)
            contexts.append(pairs.contexts[c]), replies.append(pairs.responses[r])
    return contexts, replies


def _variants(args: argparse.Namespace) -> dict[str, dict]:
    """The fast runtimes to compare, by name: ``--backend`` with each ``--quantize``, the torch backend in each
    ``--dtypes``."""
    names = lambda text: [x.strip() for x in text.split(",") if x.strip()]  # noqa: E731
    out = {f"{args.backend} {q}": {"backend": args.backend, "quantize": q} for q in names(args.quantize)}
    return out | {f"torch {d}": {"backend": "torch", "dtype": d} for d in names(args.dtypes)}


def speed(args: argparse.Namespace, reference: PMIScorer, fast: dict[str, PMIScorer]) -> dict:
    """Pairs/s of the bare float32 forward, the float32 scorer and each fast scorer on the same texts."""
    contexts, replies = _timed_texts(args.input, args.pairs)
    line_turns = reference.head.config.line_turns
    batches = bare_batches(reference.encoder, contexts, replies, reference.input_mode, reference.template, line_turns)
    device = reference.encoder.device
    batches = [{k: v.to(device) for k, v in batch.items()} for batch in batches]

    def bare() -> None:
        with torch.inference_mode():
            for batch in batches:
                reference.encoder.model(**batch)
        if device.type == "cuda":
            torch.cuda.synchronize(device)  # the scorers' runs end on a copy to the host; the bare one must wait too

    runs = {
        "bare float32 forward": bare,
        "scorer, float32 torch": lambda: reference.score(contexts, replies),
        **{f"scorer, {name}": (lambda s=s: s.score(contexts, replies)) for name, s in fast.items()},
    }
    for fn in runs.values():
        fn()  # warm-up (and the fast path's one-off graph build)
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(args.repeats):
        for name, fn in runs.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    pairs_per_s = {name: round(len(contexts) / min(t), 1) for name, t in times.items()}
    bare_rate = pairs_per_s["bare float32 forward"]
    return {
        "pairs": len(contexts),
        "pairs_per_s": pairs_per_s,
        "ratio_to_bare_float32": {k: round(v / bare_rate, 2) for k, v in pairs_per_s.items()},
        "runs_s": {k: [round(x, 2) for x in v] for k, v in times.items()},
    }


def accuracy(args: argparse.Namespace, reference: PMIScorer, fast: dict[str, PMIScorer]) -> dict:
    """AUC of every scorer on the whole file (positives against seeded negatives) and each fast one's PMI gap."""
    pairs = load_pairs(Path(args.input))
    trained = reference.metadata.get("training") or {}
    spec = NegativeSpec(**{k: trained[k] for k in NegativeSpec.__dataclass_fields__ if k in trained})
    scored = {}
    for name, scorer in (("float32", reference), *fast.items()):
        pos, neg = score_with_negatives(scorer, pairs, spec, seed=args.seed, progress=True)
        assert neg is not None
        scored[name] = np.r_[pos, neg.ravel()]
    labels = np.r_[np.ones(len(pairs)), np.zeros(scored["float32"].size - len(pairs))]
    auc = {k: float(roc_auc_score(labels, v)) for k, v in scored.items()}
    result: dict = {
        "file": args.input,
        "negatives": spec.counts(),
        "positives": len(pairs),
        "scores": int(labels.size),
        "auc_float32": round(auc["float32"], 4),
    }
    for name in fast:
        gap = np.abs(scored[name] - scored["float32"])
        result[name] = {
            "auc": round(auc[name], 4),
            "auc_delta": round(auc[name] - auc["float32"], 4),
            "share_within_0.1_nat": round(float((gap <= 0.1).mean()), 4),
            "gap_nat_p50_p95_p99_max": [round(float(q), 3) for q in np.quantile(gap, [0.5, 0.95, 0.99, 1.0])],
        }
    return result


def main() -> int:
    args = _arguments()
    torch.set_num_threads(args.threads)
    variants = _variants(args)
    # float32 as labelled, whatever dtype the scorer was saved in (a bfloat16 one would be timed as "float32")
    reference = PMIScorer.from_pretrained(args.scorer, device=args.device, dtype="float32")
    timed = {name: PMIScorer.from_pretrained(args.scorer, device=args.device, **rt) for name, rt in variants.items()}
    for scorer in (reference, *timed.values()):
        scorer.encoder.set_batch_size(args.encode_batch_size)
    result = {
        "scorer": args.scorer,
        "device": torch.cuda.get_device_name(args.device) if args.device.startswith("cuda") else "cpu",
        "threads": args.threads,
        "tokenizers_parallelism": os.environ.get("TOKENIZERS_PARALLELISM"),
        "cpus": os.cpu_count(),
        "load1_start": round(os.getloadavg()[0], 2),
        "speed": speed(args, reference, timed),
    }
    result["load1_after_speed"] = round(os.getloadavg()[0], 2)
    if args.no_accuracy:
        print(json.dumps(result, indent=1))
        return 0
    if args.device != "cpu":
        variants = {f"{args.device} float32": {"dtype": "float32"}} | {
            f"{args.device} {k}": v for k, v in variants.items()
        }

    # cache keys name the dtype, not the device: against a GPU, each device's embeddings get a folder of their own
    # (the default cache of a GPU machine may hold embeddings the GPU made)
    def cache(device: str) -> str:
        return args.cache_dir if args.device == "cpu" else str(Path(args.cache_dir) / device.replace(":", "-"))

    cached = {
        name: PMIScorer.from_pretrained(args.scorer, device=args.device, cache_dir=cache(args.device), **runtime)
        for name, runtime in variants.items()
    }
    reference = PMIScorer.from_pretrained(args.scorer, device="cpu", cache_dir=cache("cpu"), dtype="float32")
    result["accuracy"] = accuracy(args, reference, cached)
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.exit(main())

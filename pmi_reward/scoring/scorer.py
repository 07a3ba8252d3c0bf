"""``PMIScorer``: encoder spec + template + head, saved as JSON + safetensors (no pickle anywhere).

A scorer directory holds ``config.json`` (everything inference needs: the encoder spec, the template, the head's
shape and how many context turns the scorer was trained on), ``head.safetensors`` (the head's weights),
``metadata.json`` (provenance: data, training settings, wall time, memory; never read to score) and ``README.md``
(a model card made from the other two). Version-1 directories kept the provenance, and the context-turn count
inside it, in ``config.json``; they still load. ``from_pretrained`` also takes a Hugging Face Hub repo id
(``hub``), and ``push_to_hub`` uploads a scorer; how the encoder runs on this machine (backend, int8, dtype,
batch) is chosen at load time and never saved.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import tempfile
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import regex
import torch
from safetensors.torch import load_file, save_file
from typing_extensions import TypedDict, Unpack

from ..data.pairs import join_turns
from ..data.records import atomic_write, json_safe
from ..progress import progress_bar
from . import hub
from .cache import EmbeddingCache
from .card import model_card
from .encoder import LOCAL_ENCODER, RUNTIME_FIELDS, EncoderSpec, RuntimeKwargs, TextEncoder, default_device
from .features import embed_contexts, embed_prompts, embed_responses, newest_lines, stack_lines
from .head import HeadConfig, PMIHead
from .models import SCORER_FORMAT, hub_id_form, shipped_name
from .templates import PromptTemplate

__all__ = [
    "PMIScorer",
    "ScorerLoadError",
    "LOCAL_ENCODER",
    "DEFAULT_SCORER",
    "HUB_OPTIONS",
    "HubKwargs",
    "visible",
    "as_trained",
]

FORMAT = SCORER_FORMAT  # models.py holds it: it tells a scorer folder from a model folder (is_scorer_dir)
VERSION = 2
CONFIG_NAME = "config.json"
METADATA_NAME = "metadata.json"
WEIGHTS_NAME = "head.safetensors"
ENCODER_DIGESTS = "encoder_sha256"  # config.json's record of a fine-tuned encoder's files: {file name: sha256}
# config.json's record of where an encoder named by a local folder was when the scorer was saved: {"from_scorer": the
# folder relative to the scorer's, "absolute": its absolute path}; tried, in that order, where the name as given is
# no folder from the working directory (a scorer moved with its encoder, or loaded from another folder)
ENCODER_FOLDER = "encoder_folder"
# config.json's record of that folder's files that decide its embeddings (``_encoder_folder_files``), as they were
# when the scorer was saved: {file name: sha256}. Checked when it loads, as a fine-tuned encoder's (ENCODER_DIGESTS):
# a folder retrained or updated in place gave the head other embeddings than it was trained on, silently. A scorer
# saved before it was recorded loads unchecked.
ENCODER_FOLDER_DIGESTS = "encoder_folder_sha256"
CARD_NAME = "README.md"
# files any tokenizer keeps its vocabulary in: a fine-tuned encoder saved before its files' digests were recorded
# must have one (without it transformers builds a tokenizer of a few special tokens, and every text scores alike)
TOKENIZER_FILES = (
    "tokenizer.json",
    "vocab.txt",
    "vocab.json",
    "tokenizer.model",
    "spiece.model",
    "sentencepiece.bpe.model",
)
# a model folder's other files that transformers reads to build the encoder (``_encoder_folder_files``)
MODEL_FILES = (
    "config.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "merges.txt",
    "adapter_config.json",
)
# from_pretrained's options of where a Hub scorer comes from (the callers that pass them on: PMIReward, verl's adapter)
HUB_OPTIONS = ("revision", "token", "hub_cache_dir", "local_files_only")


class HubKwargs(TypedDict, total=False):
    """``HUB_OPTIONS`` as keyword options of a caller that passes them on (``PMIReward.from_pretrained``), typed for
    a checker (PEP 692's ``Unpack``) as ``PMIScorer.from_pretrained`` types them. Its keys are ``HUB_OPTIONS`` (a
    test holds them equal)."""

    revision: str | None
    token: str | bool | None
    hub_cache_dir: str | Path | None
    local_files_only: bool


# the commands' default: where `pmi-reward train --config scorer/recommended` (`make scorer`) saves the scorer
DEFAULT_SCORER = "outputs/scorer"
# pairs whose head inputs ``score`` builds at once: about 45 KiB a pair at 768-d with line features, so a whole input
# file's (``pmi-reward score``) ran out of memory only after all of its encoding; the head reads each pair alone
SCORE_BLOCK = 4096


class ScorerLoadError(ValueError):
    """A scorer directory that is missing, partial or corrupted."""


class EncoderNotFoundError(ScorerLoadError, FileNotFoundError):
    """A saved scorer's encoder, named by a folder or a Hub id, found nowhere: the message names the scorer's
    config.json and each place tried. A FileNotFoundError too, as the loader's own error for a missing folder was."""


# What renders as nothing: controls (NUL, ...), format characters (zero-width space and joiners, BOM, word joiner,
# soft hyphen, bidi marks), unassigned and private-use code points, separators, lone combining marks; the letters
# and symbols that are drawn blank (Hangul fillers, the Braille blank); and what says nothing and MiniLM's tokenizer
# drops: U+FFFD (what a byte-level policy's incomplete UTF-8 decodes to) and U+1734 (a scan of every code point found
# no others), so that a reply of them read as an empty one and scored above real replies.
# The categories by the ``regex`` package's Unicode database, newer than Python's (3.11's is Unicode 14, where the
# emoji of Unicode 15 and later, 🫨, are unassigned: a reply of them was blank there and not on 3.12).
_SHOWN = regex.compile(
    r"[^\p{Cc}\p{Cf}\p{Cn}\p{Co}\p{Cs}\p{Zs}\p{Zl}\p{Zp}\p{Mn}\p{Me}\u115f\u1160\u3164\uffa0\u2800\ufffd\u1734]"
)


def visible(text: str) -> bool:
    """Whether ``text`` shows anything: a text of only invisible, control or replacement characters
    (``"\\u200b"``, ``"\\x00"``, ``"\\ufeff"``, ``"\\ufffd"``, ...) tokenizes like an empty one and must be read as
    one, or a policy learns to emit it. The one check of what counts as blank: ``PMIScorer.score`` refuses such a
    response, and the reward path (``rewards.path``) reads such a reply as empty and such a context as none."""
    return _SHOWN.search(text) is not None


def as_trained(contexts: Sequence[str], responses: Sequence[str]) -> tuple[list[str], list[str]]:
    """Contexts and replies written as the training pairs write them (``PairSet``, ``join_turns``): a context's
    non-blank lines are its turns, each stripped; a reply's line breaks are spaces. A tokenizer that reads a line
    break as a token of its own (SmolLM2's and other decoders') would otherwise embed another text than the one the
    head was trained on; MiniLM's and MPNet's give the same ids either way."""
    kept = [join_turns([line for line in c.split("\n") if line.strip()]) for c in contexts]
    return kept, [join_turns([r]) for r in responses]


def _check_texts(name: str, values: Sequence[str]) -> list[str]:
    if isinstance(values, str) or not isinstance(values, Sequence):
        raise TypeError(f"{name} must be a sequence of strings, got {type(values).__name__}")
    bad = next((i for i, v in enumerate(values) if not isinstance(v, str)), None)
    if bad is not None:
        raise TypeError(f"{name}[{bad}] must be a string, got {type(values[bad]).__name__}")
    for i, value in enumerate(values):  # the tokenizer's own error for one named neither the argument nor the row
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as err:
            raise ValueError(
                f"{name}[{i}] is not valid text: a lone surrogate {value[err.start]!r} at character {err.start} (half "
                "of an emoji cut apart, or a bad \\u escape in JSON); repair or drop that text"
            ) from None
    return list(values)


class PMIScorer:
    """Scores (context, response) pairs with a PMI estimate in nats, bounded by +-cap.

    A context is the conversation so far, turns joined by newlines, oldest first; a response is the
    reply being judged. Generic replies score near 0, on-topic ones above, mismatched ones below.
    """

    def __init__(
        self,
        encoder: TextEncoder,
        template: PromptTemplate,
        head: PMIHead,
        metadata: dict[str, Any] | None = None,
        context_turns: int | None = None,
    ) -> None:
        if head.config.dim != encoder.dim:
            raise ValueError(f"head expects {head.config.dim}-d embeddings, encoder gives {encoder.dim}")
        if context_turns is not None and context_turns < 1:
            raise ValueError(f"context_turns must be >= 1 or None, got {context_turns}")
        self.encoder, self.template, self.head = encoder, template, head.eval()
        self.context_turns = context_turns  # turns of context the training pairs kept (None: every turn)
        self.metadata: dict[str, Any] = metadata or {}
        # the encoder dtype of the config.json it was loaded from: a dtype chosen at load time is the machine's
        self.saved_dtype: str | None = None
        self.directory: Path | None = None  # where it was loaded from (a fine-tuned encoder's weights live there)

    @property
    def input_mode(self) -> str:
        return self.head.config.input_mode

    @property
    def cap(self) -> float:
        return self.head.config.cap

    def embed(
        self, contexts: Sequence[str], responses: Sequence[str], progress: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Head inputs for the pairs: (u, v) in pair mode, (prompt embeddings, None) in prompt mode; the texts are
        written as training wrote them first (``as_trained``), whichever path scores them."""
        contexts, responses = as_trained(contexts, responses)
        if self.input_mode == "prompt":
            return torch.from_numpy(embed_prompts(self.encoder, self.template, contexts, responses, progress)), None
        u = torch.from_numpy(embed_contexts(self.encoder, self.template, contexts, progress and "contexts"))
        v = torch.from_numpy(embed_responses(self.encoder, self.template, responses, progress and "responses"))
        n = self.head.config.line_turns
        if n:
            lines = [newest_lines(c, n) for c in contexts]
            flat = [line for own in lines for line in own]
            table = torch.zeros(len(contexts), n, u.shape[-1])
            present = torch.zeros(len(contexts), n, dtype=torch.bool)
            if flat:
                emb = torch.from_numpy(embed_responses(self.encoder, self.template, flat, progress and "lines"))
                at = 0
                for i, own in enumerate(lines):
                    table[i, : len(own)], present[i, : len(own)] = emb[at : at + len(own)], True
                    at += len(own)
            u = stack_lines(u, table, present)
        return u, v

    @torch.no_grad()
    def score(self, contexts: Sequence[str], responses: Sequence[str], progress: bool = False) -> np.ndarray:
        """float32 PMI estimates, one per pair; each distinct context and response is encoded once (within a block of
        ``SCORE_BLOCK`` pairs, which are scored in turn; across blocks by the embedding cache, where there is one).
        A blank response is refused: PMI is not defined for it, and the head would rate it like any text (one scorer:
        +2.3 nats); ``PMIReward`` gives such replies its ``empty_score``. So is an invisible one (only zero-width,
        control or replacement characters: ``visible``), which tokenizes exactly like a blank one, and a text with a
        lone surrogate."""
        contexts, responses = _check_texts("contexts", contexts), _check_texts("responses", responses)
        if len(contexts) != len(responses):
            raise ValueError(f"got {len(contexts)} contexts but {len(responses)} responses")
        blank = next((i for i, r in enumerate(responses) if not visible(r)), None)
        if blank is not None:
            shown = "" if not responses[blank].strip() else " (it shows nothing: only invisible or control characters)"
            raise ValueError(
                f"responses[{blank}] is blank{shown}: PMI is not defined for an empty reply "
                "(PMIReward scores it empty_score)"
            )
        out = np.zeros(len(contexts), dtype=np.float32)
        blocks = range(0, len(contexts), SCORE_BLOCK)
        bar = progress_bar(total=len(contexts), desc="scoring", unit="pair", disable=not progress or len(blocks) < 2)
        with bar:  # in blocks of pairs: the memory of one block's head inputs, not of the whole call's
            for s in blocks:
                end = min(s + SCORE_BLOCK, len(contexts))
                u, v = self.embed(contexts[s:end], responses[s:end], progress)
                with self.encoder.computing():  # a fork waits for it (``scoring/forking.py``)
                    out[s:end] = self.head(u, v).numpy()
                bar.update(end - s)
        return out

    # -- persistence ------------------------------------------------------------------------------
    def config(self) -> dict[str, Any]:
        """What ``config.json`` holds: everything inference needs, nothing else. A dtype asked as ``auto`` is saved
        as ``auto``, not as this machine's answer, so that each machine that loads the scorer resolves it again
        (bfloat16 saved on a GPU would run emulated, several times slower, on a CPU without native bf16).

        The encoder's model is saved as it was named (a Hub id, or a folder as the user gave it, relative or not), so
        that the card, ``/health`` and a fine-tuned scorer's ``base_encoder`` show that name, and a scorer moved with
        its encoder folder loads from the same relative working directory; an encoder named by a local folder also
        records that folder's absolute path (``ENCODER_FOLDER``; ``save_pretrained`` adds its path relative to the
        scorer), where ``from_config`` looks when the name is no folder from the working directory."""
        encoder = self.encoder.spec.saved_dict()
        # a fine-tuned encoder's weights are written in the dtype they are held in: that dtype, never "auto"
        if getattr(self.encoder, "requested_dtype", None) == "auto" and self.encoder.spec.model != LOCAL_ENCODER:
            encoder["dtype"] = "auto"
        config = {
            "format": FORMAT,
            "version": VERSION,
            "encoder": encoder,
            "template": self.template.to_dict(),
            "head": self.head.config.to_dict(),
            "context_turns": self.context_turns,
        }
        folder = _local_folder(encoder["model"])
        if folder is not None:
            config[ENCODER_FOLDER] = {"absolute": str(folder)}
        return config

    def save_pretrained(self, directory: str | Path, repo_id: str | None = None) -> Path:
        """Write ``head.safetensors``, the encoder (fine-tuned: ``encoder/``), ``metadata.json``, the model card
        ``README.md`` and, last, ``config.json`` into ``directory`` (each atomically); ``repo_id`` names the Hub repo in
        the card's examples. ``config.json`` records the digests of the head and of a fine-tuned encoder's files, so
        that a save cut short over an earlier scorer (its config beside another head or encoder), a file lost or
        broken in a download, is refused when loaded, never loaded as a mix of the two; and those of an encoder
        folder's files (``ENCODER_FOLDER_DIGESTS``), so that the folder retrained or replaced in place is refused too
        (each file read once per process while it is unchanged: ``_digest``)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        config = self.config()
        if ENCODER_FOLDER in config:  # where the encoder folder is from the scorer's: it holds when both move together
            absolute = config[ENCODER_FOLDER]["absolute"]
            try:
                from_scorer: str | None = os.path.relpath(absolute, directory.resolve())
            except ValueError:  # another drive (Windows): no relative path between them
                from_scorer = None
            config[ENCODER_FOLDER] = {"from_scorer": from_scorer, "absolute": absolute}
        tuned_float32 = self.saved_dtype in ("float32", "auto")  # "auto": a fine-tuned one saved so on 2026-11-28
        if self.encoder.spec.model == LOCAL_ENCODER and tuned_float32 and self.encoder.spec.dtype != "float32":
            raise ValueError(
                f"this scorer's fine-tuned encoder was loaded in {self.encoder.spec.dtype}, not the {self.saved_dtype} "
                "it was saved in: saving it would keep the rounded weights; load it without a dtype to save it"
            )
        state = {k: v.detach().contiguous() for k, v in self.head.state_dict().items()}
        atomic_write(directory / WEIGHTS_NAME, lambda p: save_file(state, p, metadata={"format": FORMAT}))
        digests: dict[str, Any] = {"head_sha256": _digest(directory / WEIGHTS_NAME)}
        if self.encoder.spec.model == LOCAL_ENCODER:
            local = directory / LOCAL_ENCODER
            self.encoder.model.save_pretrained(local)
            self.encoder.tokenizer.save_pretrained(local)
            files = sorted(p for p in local.iterdir() if p.is_file())
            digests[ENCODER_DIGESTS] = {p.name: _digest(p) for p in files}
        elif ENCODER_FOLDER in config:  # a local folder's files, as the head was trained on them
            folder = Path(config[ENCODER_FOLDER]["absolute"])
            digests[ENCODER_FOLDER_DIGESTS] = {name: _digest(folder / name) for name in _encoder_folder_files(folder)}
        _write_json(directory / METADATA_NAME, self.metadata)
        card = model_card(config, self.metadata, repo_id, pooling=self.encoder.pooling)
        atomic_write(directory / CARD_NAME, lambda p: Path(p).write_text(card, encoding="utf-8"))
        if self.saved_dtype:  # a dtype chosen at load time is the machine's, not the scorer's
            config = {**config, "encoder": {**config["encoder"], "dtype": self.saved_dtype}}
        _write_json(directory / CONFIG_NAME, {**config, **digests})
        return directory

    def push_to_hub(
        self,
        repo_id: str,
        private: bool | None = None,
        token: str | None = None,
        revision: str | None = None,
        commit_message: str = "Upload pmi-reward scorer",
        create_pr: bool = False,
    ) -> str:
        """Save this scorer (its model card naming ``repo_id``) and commit it to the Hub model repo ``repo_id``,
        creating the repo if needed; the commit's URL. ``PMIScorer.from_pretrained(repo_id)`` loads it back. An
        encoder read from a local folder is refused: its weights would not travel, and the scorer would load nowhere
        else (publish the encoder on the Hub and name it by its id, or fine-tune it into the scorer's own folder);
        so no uploaded ``config.json`` holds a folder of this machine (``ENCODER_FOLDER``)."""
        if "/" not in repo_id:  # the Hub puts a bare name under the token's user, while the card names the bare one
            raise ValueError(f"push_to_hub: give the repo id with its namespace, org/name or user/name: {repo_id!r}")
        model = self.encoder.spec.model
        if model != LOCAL_ENCODER and shipped_name(model) is None and Path(model).expanduser().exists():
            raise ValueError(
                f"push_to_hub: the encoder is the local folder {model!r}, whose weights a Hub repo would not hold; "
                "publish the encoder and name it by its Hub id first"
            )
        with tempfile.TemporaryDirectory(prefix="pmi-scorer-") as tmp:
            self.save_pretrained(tmp, repo_id=repo_id)
            return hub.upload(tmp, repo_id, private, token, revision, commit_message, create_pr)

    @classmethod
    def read_config(cls, directory: str | Path) -> dict[str, Any]:
        directory = Path(directory)
        path = directory / CONFIG_NAME
        if not directory.is_dir():
            hint = (
                " (train the recommended scorer there with `pmi-reward train --config scorer/recommended`, which needs "
                "`pip install 'pmi-reward[mpnet]'` (add `--model minilm` without it), or with `make scorer` in a "
                "checkout)"
                if str(directory) == DEFAULT_SCORER
                else ""
            )
            raise ScorerLoadError(f"{directory}: not a directory (expected a saved pmi-reward scorer){hint}")
        if not path.is_file():
            raise ScorerLoadError(f"{directory}: missing {CONFIG_NAME}; not a saved pmi-reward scorer")
        try:
            config = json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise ScorerLoadError(f"{path}: corrupted ({err})") from None
        if not isinstance(config, dict) or config.get("format") != FORMAT:
            raise ScorerLoadError(f"{path}: not a pmi-reward scorer config (format != {FORMAT!r})")
        if "version" not in config and "metadata" not in config:  # version 1 wrote both; 2 writes "version"
            raise ScorerLoadError(
                f"{path}: missing field 'version' (every pmi-reward scorer's config.json has one; without it, and "
                "without the 'metadata' of version 1, it is damaged or not a scorer's); re-download or save again"
            )
        version = config.get("version", 0)
        if not isinstance(version, int) or isinstance(version, bool):
            raise ScorerLoadError(f"{path}: invalid version {version!r} (expected a whole number)")
        if version > VERSION:
            raise ScorerLoadError(f"{path}: written by a newer pmi-reward (version {version})")
        for key in ("encoder", "template", "head"):
            if not isinstance(config.get(key), dict):
                raise ScorerLoadError(f"{path}: missing or invalid field {key!r}")
        for key, read in (("encoder", EncoderSpec.from_dict), ("template", PromptTemplate.from_dict)):
            try:  # each field's type and value, named (a reader of the spec alone, such as the judge panel's, too)
                read(config[key])
            except (TypeError, ValueError) as err:
                raise ScorerLoadError(f"{path}: invalid field {key!r} ({err})") from None
        return config

    @classmethod
    def read_metadata(cls, directory: str | Path) -> dict[str, Any]:
        """The provenance of a saved scorer (``metadata.json``; a version-1 scorer's ``config.json``)."""
        path = Path(directory) / METADATA_NAME
        if path.is_file():
            try:
                metadata = json.loads(path.read_text(encoding="utf-8"))
            except (json.JSONDecodeError, UnicodeDecodeError) as err:
                raise ScorerLoadError(f"{path}: corrupted ({err})") from None
            if not isinstance(metadata, dict):
                raise ScorerLoadError(f"{path}: corrupted (expected a JSON object, got {type(metadata).__name__})")
            return metadata
        return cls.read_config(directory).get("metadata") or {}

    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str | Path,
        device: str | torch.device | None = None,
        cache_dir: str | Path | None = None,
        encoder: TextEncoder | None = None,
        *,
        revision: str | None = None,
        token: str | bool | None = None,
        hub_cache_dir: str | Path | None = None,
        local_files_only: bool = False,
        **runtime: Unpack[RuntimeKwargs],
    ) -> PMIScorer:
        """Load a saved scorer from a directory or a Hugging Face Hub repo id (``org/name``; ``revision``, ``token``,
        ``hub_cache_dir`` and ``local_files_only`` as in ``huggingface_hub``, which also honours
        ``HF_HUB_OFFLINE=1``). ``cache_dir`` is the embedding cache. ``runtime`` chooses how this machine runs the
        encoder (``backend``, ``quantize``, ``dtype``, ``encode_batch_size``: ``EncoderSpec``); ``encoder`` shares
        one already loaded (same model and settings)."""
        bad = sorted(set(runtime) - set(RUNTIME_FIELDS))
        if bad:
            raise TypeError(f"unexpected arguments {bad}; the encoder's runtime options are {list(RUNTIME_FIELDS)}")
        try:  # the commands' default is a local directory, never a Hub id, even where it does not exist yet
            local = str(name_or_path) == DEFAULT_SCORER
            if local and revision is not None:
                raise hub.HubError(
                    f"{name_or_path} is a local directory, and revision {revision!r} applies to Hub repo ids only"
                )
            directory = (
                Path(name_or_path)
                if local
                else hub.resolve(name_or_path, revision, token, hub_cache_dir, local_files_only)
            )
        except hub.HubError as err:
            raise ScorerLoadError(str(err)) from None
        config = cls.read_config(directory)
        saved_dtype = config["encoder"].get("dtype")
        if runtime:
            config = {**config, "encoder": {**config["encoder"], **{k: v for k, v in runtime.items() if v is not None}}}
        weights = directory / WEIGHTS_NAME
        if not weights.is_file():
            raise ScorerLoadError(f"{directory}: missing {WEIGHTS_NAME}")
        expected = config.get("head_sha256")
        if expected is not None and _digest(weights) != expected:
            raise ScorerLoadError(
                f"{weights} is not the head {directory / CONFIG_NAME} was saved with (a save cut short or a broken "
                "download?); re-download or save again"
            )
        try:
            state = load_file(weights)
        except Exception as err:  # safetensors raises its own error types for truncated files
            raise ScorerLoadError(f"{weights}: corrupted ({err}); re-download or save again") from None
        scorer = cls.from_config(
            config,
            state,
            device,
            cache_dir,
            encoder,
            source=str(directory),
            metadata=cls.read_metadata(directory),
            directory=directory,
        )
        scorer.saved_dtype = saved_dtype
        return scorer

    @classmethod
    def from_config(
        cls,
        config: dict,
        head_state: dict,
        device: str | torch.device | None = None,
        cache_dir: str | Path | None = None,
        encoder: TextEncoder | None = None,
        source: str = "<config>",
        metadata: dict[str, Any] | None = None,
        directory: str | Path | None = None,
    ) -> PMIScorer:
        """Build a scorer from a config dict (as in config.json) and the head's tensors; ``directory`` is where a
        fine-tuned encoder's weights live (the scorer's own directory)."""
        try:
            spec = EncoderSpec.from_dict(config["encoder"])
            template = PromptTemplate.from_dict(config["template"])
            head = PMIHead(HeadConfig(**config["head"]))
        except (KeyError, TypeError, ValueError) as err:
            raise ScorerLoadError(f"{source}: invalid scorer config ({err})") from None
        try:
            head.load_state_dict({k: torch.as_tensor(v) for k, v in head_state.items()}, strict=True)
        except (RuntimeError, KeyError) as err:
            raise ScorerLoadError(f"{source}: head weights do not match config.json ({err})") from None
        broken = [name for name, value in head.state_dict().items() if not torch.isfinite(value).all()]
        if broken:
            raise ScorerLoadError(f"{source}: head weights {broken} hold NaN or infinite values; retrain or restore it")
        if metadata is None:
            metadata = config.get("metadata")
        config_file = str(Path(directory) / CONFIG_NAME) if directory is not None else source
        found, tried = _find_encoder_folder(spec.model, config.get(ENCODER_FOLDER), directory, config_file)
        if found is not None:  # the folder where it was recorded: loaded (and named, for the cache's keys) from there
            spec = replace(spec, model=found)
        folder = _local_folder(spec.model)  # the local folder it loads from, wherever it was found
        if folder is not None:
            _check_encoder_folder(folder, config.get(ENCODER_FOLDER_DIGESTS), config_file)
        here = encoder.device if encoder is not None else default_device(device, spec.backend)
        resolved = spec.on(here)  # a concrete dtype
        if encoder is None:  # it resolves "auto" itself, and keeps the request for a copy made on another machine
            cache = EmbeddingCache(cache_dir) if cache_dir else None
            weights = _local_weights(resolved, directory, source, config.get(ENCODER_DIGESTS))
            missing = None
            try:
                encoder = TextEncoder(spec, cache=cache, device=device, **weights)
            except OSError as err:  # no such folder, no such Hub repo, no network
                if cache is not None:
                    cache.close()
                if not tried or found is not None:  # a folder that is there (or no search needed): its own error
                    raise
                missing = _encoder_not_found(spec.model, tried, config_file, err, config)
            except ValueError as err:  # a saved layer or max_length the model lacks: config.json's, not a flag's
                if cache is not None:
                    cache.close()
                blamed = _saved_field_error(err, spec, config_file)
                if blamed is None:
                    raise
                raise blamed from None
            if missing is not None or encoder is None:  # raised outside the handler: not one during another's
                raise EncoderNotFoundError(missing or f"{source}: its encoder did not load")
            if spec.model == LOCAL_ENCODER and isinstance(metadata, dict):  # what its weights were tuned from
                encoder.base_model = metadata.get("base_encoder")
        elif not encoder.spec.embeds_like(resolved):
            raise ValueError(f"the shared encoder's spec differs from {source}'s")
        try:
            scorer = cls(encoder, template, head, metadata, _context_turns(config))
        except (TypeError, ValueError) as err:  # a context_turns that is no count, a head of another width
            raise ScorerLoadError(f"{source}: invalid scorer config ({err})") from None
        scorer.directory = Path(directory) if directory is not None else None
        return scorer


def _local_weights(spec: EncoderSpec, directory: str | Path | None, source: str, digests: Any = None) -> dict:
    """The model and tokenizer of a fine-tuned encoder saved inside the scorer directory (none for a named one),
    its files checked against the digests its ``config.json`` records (``digests``; a scorer saved before they were
    recorded: it must have a tokenizer's vocabulary at least)."""
    if spec.model != LOCAL_ENCODER:
        return {}
    path = Path(directory or "") / LOCAL_ENCODER
    if directory is None or not path.is_dir():
        raise ScorerLoadError(f"{source}: its fine-tuned encoder should be in {path}, which is missing")
    if not (path / "config.json").is_file():
        raise ScorerLoadError(f"{path / 'config.json'}: missing from the fine-tuned encoder; re-download or save again")
    _check_encoder_files(path, digests, source)
    from .models import load_backbone, load_tokenizer

    try:  # a truncated or foreign file: safetensors', tokenizers' and transformers' own errors, whatever their type
        return {"model": load_backbone(str(path), spec.dtype), "tokenizer": load_tokenizer(str(path))}
    except Exception as err:
        raise ScorerLoadError(f"{path}: corrupted or incomplete fine-tuned encoder ({err})") from None


def _check_encoder_files(path: Path, digests: Any, source: str) -> None:
    """Refuse a fine-tuned encoder folder with a recorded file missing or changed (a save cut short, a broken
    download, weights copied in from elsewhere), naming the file; without a record, one without any tokenizer
    vocabulary (transformers would build a tokenizer of a few special tokens and score every text alike)."""
    if digests is None:
        if not any((path / name).is_file() for name in TOKENIZER_FILES):
            raise ScorerLoadError(
                f"{path}: the fine-tuned encoder has no tokenizer (none of {', '.join(TOKENIZER_FILES)}); "
                "re-download or save again"
            )
        return
    difference = _first_difference(path, digests, ENCODER_DIGESTS, source)
    if difference is None:
        return
    file, how = difference
    if how == "missing":
        raise ScorerLoadError(f"{file}: missing from the fine-tuned encoder; re-download or save again")
    raise ScorerLoadError(
        f"{file} is not the file the fine-tuned encoder was saved with (a save cut short, a broken download, "
        "or another model's?); re-download or save again"
    )


def _check_encoder_folder(folder: Path, digests: Any, config_file: str) -> None:
    """Refuse a local encoder folder (``ENCODER_FOLDER``) whose files differ from those the scorer was saved with
    (``ENCODER_FOLDER_DIGESTS``): one of them changed or missing, or a weights or tokenizer file added (transformers
    prefers a ``model.safetensors`` put beside the ``pytorch_model.bin`` recorded). The folder was retrained or
    updated in place, and the head, trained on the old one's embeddings, would score with the new ones. A scorer
    saved before the digests were recorded (``digests`` None) loads unchecked, as it did."""
    if digests is None:
        return
    difference = _first_difference(folder, digests, ENCODER_FOLDER_DIGESTS, config_file, _encoder_folder_files(folder))
    if difference is None:
        return
    file, how = difference
    what = {
        "missing": f"{file}: missing, though the encoder folder held it when this scorer was trained",
        "changed": f"{file} changed since this scorer was trained ({config_file} records another sha256 for it)",
        "added": f"{file}: added to the encoder folder since this scorer was trained",
    }[how]
    raise ScorerLoadError(
        f"{what}. The encoder folder changed since the scorer was trained (retrained or updated in place?), and its "
        "head was trained on the old encoder's embeddings: restore the folder, or retrain the scorer"
    )


def _first_difference(
    path: Path, digests: Any, field: str, source: str, current: list[str] | None = None
) -> tuple[Path, str] | None:
    """The first file of folder ``path`` that differs from config.json's record ``field`` ({file name: sha256}):
    ``(file, "missing" | "added" | "changed")``, where ``current`` (the names that would be recorded now) holds one
    the record lacks for "added"; None where all match. A record that is no such mapping is refused, naming
    ``field``. Names are compared before any file is read (a difference found without reading gigabytes)."""
    if not isinstance(digests, dict) or not all(isinstance(d, str) for d in digests.values()):
        raise ScorerLoadError(f"{source}: invalid field {field!r} (expected file names and sha256 digests)")
    bad = next((name for name in sorted(digests) if Path(name).name != name), None)
    if bad is not None:
        raise ScorerLoadError(f"{source}: invalid field {field!r} (file name {bad!r})")
    missing = next((name for name in sorted(digests) if not (path / name).is_file()), None)
    if missing is not None:
        return path / missing, "missing"
    added = next((name for name in current or [] if name not in digests), None)
    if added is not None:
        return path / added, "added"
    changed = next((name for name, expected in sorted(digests.items()) if _digest(path / name) != expected), None)
    return None if changed is None else (path / changed, "changed")


def _encoder_folder_files(folder: Path) -> list[str]:
    """The names of a model folder's files that decide what it embeds: ``config.json``, the weights (safetensors and
    ``pytorch_model`` files, with their shard indexes) and the tokenizer's files; not a training run's optimizer
    state, logs or card, which change without changing the encoder and may be large."""
    kept = []
    for file in sorted(folder.iterdir()):
        name = file.name
        weights = name.endswith((".safetensors", ".safetensors.index.json")) or (
            name.startswith("pytorch_model") and name.endswith((".bin", ".bin.index.json"))
        )
        if file.is_file() and (weights or name in MODEL_FILES or name in TOKENIZER_FILES):
            kept.append(name)
    return kept


def _saved_field_error(err: ValueError, spec: EncoderSpec, config_file: str) -> ScorerLoadError | None:
    """The encoder's refusal of a saved ``layer`` or ``max_length`` the model lacks, as config.json's: its message
    names ``--layer``, the flag of the commands that build an encoder, which a user loading a scorer never gave;
    None for any other error (a runtime choice of this machine's, such as the onnx backend on a GPU)."""
    text = str(err)
    flag = f"--layer {spec.layer}: "
    if text.startswith(flag):
        return ScorerLoadError(f"{config_file}: its encoder.layer {spec.layer} is out of range: {text[len(flag) :]}")
    if text.startswith(f"max_length {spec.max_length} "):
        return ScorerLoadError(f"{config_file}: its encoder.{text}")
    return None


def _local_folder(model: str) -> Path | None:
    """The absolute path of the local folder an encoder's model name means (as ``resolve_model`` reads it: a shipped
    name is the shipped model even beside a folder of that name), or None for a shipped model, a fine-tuned one
    (``LOCAL_ENCODER``, inside the scorer) or a Hub id with no such folder here."""
    if model == LOCAL_ENCODER or shipped_name(model) is not None or not Path(model).is_dir():
        return None
    return Path(model).resolve()


def _find_encoder_folder(
    model: str, recorded: Any, directory: str | Path | None, config_file: str
) -> tuple[str | None, list[str]]:
    """Where to load a saved encoder named ``model`` from: ``(folder, tried)``, the first folder of the scorer's record
    (``ENCODER_FOLDER``: relative to the scorer's ``directory``, then absolute) that exists, or None (the name as
    given: a folder from the working directory, else a Hub id); ``tried`` lists the places looked at, empty where
    the name needs no search (a shipped model, a fine-tuned one, a folder that is there and no record). The record
    comes first: another project's folder of the same relative name must not stand in for the scorer's own."""
    if model == LOCAL_ENCODER or shipped_name(model) is not None:
        return None, []
    if recorded is None:
        return None, [] if Path(model).is_dir() else [f"{model} (from the working directory {Path.cwd()})"]
    if not isinstance(recorded, dict) or not all(v is None or isinstance(v, str) for v in recorded.values()):
        raise ScorerLoadError(
            f"{config_file}: invalid field {ENCODER_FOLDER!r} (expected {{'from_scorer': path, 'absolute': path}})"
        )
    tried: list[str] = []
    from_scorer, absolute = recorded.get("from_scorer"), recorded.get("absolute")
    if from_scorer and directory is not None:
        candidate = Path(directory) / from_scorer
        tried.append(f"{candidate} (its from_scorer path)")
        if candidate.is_dir():
            short = os.path.normpath(candidate)  # scorer/../enc as enc, where that is the same folder (no symlink)
            return (short if Path(short).is_dir() and os.path.samefile(short, candidate) else str(candidate)), tried
    if absolute:
        tried.append(f"{absolute} (its absolute path)")
        if Path(absolute).is_dir():
            return absolute, tried
    if Path(model).is_dir():  # neither recorded place is here: the name as given, from the working directory
        return None, []
    if model != absolute:  # a name saved absolute was tried as its absolute path
        tried.append(f"{model} (from the working directory {Path.cwd()})")
    return None, tried


def _encoder_not_found(model: str, tried: list[str], config_file: str, err: OSError, config: dict) -> str:
    """The message for a saved encoder found nowhere: the scorer's config.json, the places tried, and the loader's
    own error (a Hub id that is not there, or no network); for a scorer saved before its encoder's folder was
    recorded, how to point it at the folder."""
    hub = ", and as a Hub id it did not load either" if hub_id_form(model) else ""
    message = f"{config_file}: its encoder.model {model!r} did not load: no folder at {'; '.join(tried)}{hub} ({err})"
    if config.get(ENCODER_FOLDER) is None and not Path(model).expanduser().is_absolute():  # saved before it was
        message += (  # recorded: a relative folder name is relative to where the scorer was trained
            ". If it is a local folder, config.json names it relative to the directory the scorer was trained in: "
            "run from that directory, or write the folder's path into config.json's encoder.model"
        )
    elif config.get(ENCODER_FOLDER) is None:
        message += ". If the folder moved, write its new path into config.json's encoder.model"
    return message


def _context_turns(config: dict) -> int | None:
    """The context-turn count of a config (version 1: the training data's, in the provenance)."""
    if config.get("version", 1) >= 2:
        turns = config.get("context_turns")
    else:
        turns = ((config.get("metadata") or {}).get("data") or {}).get("max_context_turns")
    return int(turns) if turns else None


_SETTLED_S = 2.0  # seconds after its last write from which a file's digest is kept (``_digest``)


def _digest(path: Path) -> str:
    """sha256 of a file, read in chunks (an encoder's weights may be gigabytes), once per process for a file whose
    device, inode, size and modification time are unchanged: the judges of a panel share one encoder folder, and
    each load of a scorer on it read all its weights again. A file modified in the last ``_SETTLED_S`` seconds is
    read each time, as git treats a "racy" entry: a write within the file system's timestamp granularity (a few ms)
    of the last one would keep its modification time."""
    st = os.stat(path)
    if time.time() - st.st_mtime < _SETTLED_S:
        return _digest_of.__wrapped__(str(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    return _digest_of(os.path.realpath(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=256)
def _digest_of(path: str, device: int, inode: int, size: int, mtime_ns: int) -> str:
    """``_digest``'s reading, keyed by the file's identity and state."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _write_json(path: Path, content: dict) -> None:
    # JSON has no NaN: non-finite values are written as null
    text = json.dumps(json_safe(content), indent=2, ensure_ascii=False, default=str, allow_nan=False)
    atomic_write(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))

"""Scorers on the Hugging Face Hub: a repo id resolved to a local snapshot, and a scorer directory uploaded.

``resolve`` goes through ``huggingface_hub.snapshot_download``, so a Hub scorer gets the Hub's cache
(``$HF_HUB_CACHE``), revisions (branch, tag or commit), tokens and offline mode (``HF_HUB_OFFLINE=1``: the cached
snapshot or a clear error, never a download). The whole repo is fetched, whatever files a scorer directory
holds. A scorer's encoder named by a Hub id is resolved the same way (``encoder_snapshot``: the same token, cache
and offline mode; its main branch, not the scorer's revision), fetching only the files transformers reads.
``upload`` creates the repo if needed and commits the directory.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

__all__ = ["resolve", "encoder_snapshot", "upload", "looks_like_repo_id", "HubError"]

_REPO_ID = re.compile(r"^(?:[A-Za-z0-9][\w.-]{0,95}/)?[A-Za-z0-9][\w.-]{0,95}$")


class HubError(ValueError):
    """A scorer that is neither a local directory nor reachable on the Hub (or in its cache)."""


def looks_like_repo_id(name: str) -> bool:
    """Whether ``name`` can be a Hub repo id (``org/name`` or ``name``), not a filesystem path."""
    return bool(_REPO_ID.match(name)) and ".." not in name and not name.endswith((".", "-"))


def _version() -> str:
    import pmi_reward

    return pmi_reward.__version__


def resolve(
    name_or_path: str | Path,
    revision: str | None = None,
    token: str | bool | None = None,
    hub_cache_dir: str | Path | None = None,
    local_files_only: bool = False,
) -> Path:
    """A local directory as it is; a Hub repo id as the path of its snapshot in the Hub cache (downloaded unless
    offline or ``local_files_only``). A HubError says which it was and what to do."""
    path = Path(name_or_path)
    if path.is_dir():
        return path
    name = str(name_or_path)
    if not looks_like_repo_id(name):
        raise HubError(f"{name}: not a directory (expected a saved pmi-reward scorer or a Hub repo id org/name)")
    return _snapshot(
        name,
        revision,
        token,
        hub_cache_dir,
        local_files_only,
        lead="not a local directory, and ",
        or_else=" or pass a local directory",
    )


# what transformers reads to load a model's config, tokenizer and weights: the repo's top-level files of these names
# (a sentence-transformers repo also holds ONNX, OpenVINO, TensorFlow and Rust copies of the weights, 10x the size)
ENCODER_FILES = (
    "config.json",
    "tokenizer*",  # tokenizer.json, tokenizer_config.json, tokenizer.model
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab*",  # vocab.txt, vocab.json
    "merges.txt",
    "spiece.model",
    "sentencepiece*.model",
    "chat_template.*",
)
SAFETENSORS_FILES = ("model.safetensors", "model.safetensors.index.json", "model-*-of-*.safetensors")
PYTORCH_FILES = ("pytorch_model.bin", "pytorch_model.bin.index.json", "pytorch_model-*-of-*.bin")


def encoder_snapshot(
    repo_id: str,
    token: str | bool | None = None,
    hub_cache_dir: str | Path | None = None,
    local_files_only: bool = False,
) -> Path:
    """The snapshot folder (``.../snapshots/<commit>``) of the model repo ``repo_id``'s main branch: a scorer's
    encoder named by its Hub id, read from the Hub cache like the scorer itself (the same token, cache and offline
    mode), so that loading it makes no request when offline and its commit can key its embeddings. Only the files
    transformers reads are fetched: config, tokenizer, and the safetensors weights (the PyTorch ones where the repo
    has none). A HubError says what failed."""
    snapshot = _snapshot(repo_id, None, token, hub_cache_dir, local_files_only, ENCODER_FILES + SAFETENSORS_FILES)
    if not any(snapshot.glob("*.safetensors")):  # an older repo: PyTorch weights, at the same commit
        snapshot = _snapshot(repo_id, snapshot.name, token, hub_cache_dir, local_files_only, PYTORCH_FILES)
    return snapshot


def _snapshot(
    name: str,
    revision: str | None,
    token: str | bool | None,
    hub_cache_dir: str | Path | None,
    local_files_only: bool,
    allow_patterns: Sequence[str] | None = None,
    lead: str = "",
    or_else: str = "",
) -> Path:
    """``snapshot_download``'s folder for the repo ``name``; its failures as HubErrors that say what happened
    (``lead`` opens each message after the name, ``or_else`` ends the advice)."""
    from huggingface_hub import constants, errors, snapshot_download

    offline = "HF_HUB_OFFLINE=1" if constants.HF_HUB_OFFLINE else "local_files_only=True" if local_files_only else ""
    cached = f"the Hugging Face cache ({hub_cache_dir or constants.HF_HUB_CACHE})"
    wanted = f"revision {revision or 'main'} of the Hub repo {name}"
    try:
        return Path(
            snapshot_download(
                name,
                revision=revision,
                cache_dir=hub_cache_dir,
                token=token,
                # offline: the cache alone (huggingface_hub 1.33 still lists a commit's files online, and fails)
                local_files_only=bool(offline),
                allow_patterns=list(allow_patterns) if allow_patterns is not None else None,
                library_name="pmi-reward",
                library_version=_version(),
            )
        )
    except errors.LocalEntryNotFoundError as err:
        incomplete = getattr(errors, "IncompleteSnapshotError", None)  # huggingface_hub >= 2
        if incomplete is not None and isinstance(err, incomplete):
            raise HubError(f"{name}: {lead}{wanted} is only partly in {cached} ({err})") from None
        if offline:
            raise HubError(
                f"{name}: {lead}{wanted} is not in {cached}; with {offline} nothing is downloaded. "
                f"Download it once online (e.g. `hf download {name}`){or_else}"
            ) from None
        # online: the Hub could not be reached (no network, a refused connection, a timeout, the Hub down)
        cause = err.__cause__ or err
        raise HubError(
            f"{name}: {lead}{wanted} is not in {cached}; the Hub ({constants.ENDPOINT}) could not be reached to "
            f"download it ({type(cause).__name__}: {cause}). Check the network (HF_ENDPOINT, proxies) and try "
            f"again{or_else}"
        ) from None
    except (errors.RepositoryNotFoundError, errors.RevisionNotFoundError) as err:
        raise HubError(f"{name}: {lead}not on the Hub ({type(err).__name__}: {err})") from None
    except errors.HfHubHTTPError as err:
        raise HubError(f"{name}: the Hub refused the download ({err})") from None


def upload(
    directory: str | Path,
    repo_id: str,
    private: bool | None = None,
    token: str | None = None,
    revision: str | None = None,
    commit_message: str = "Upload pmi-reward scorer",
    create_pr: bool = False,
) -> str:
    """Commit a saved scorer directory to the Hub model repo ``repo_id`` (created if missing); the commit's URL."""
    from huggingface_hub import HfApi

    api = HfApi(token=token, library_name="pmi-reward", library_version=_version())
    api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
    info = api.upload_folder(
        repo_id=repo_id,
        folder_path=str(directory),
        commit_message=commit_message,
        revision=revision,
        create_pr=create_pr,
        repo_type="model",
    )
    return str(getattr(info, "commit_url", info))

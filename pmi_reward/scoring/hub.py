"""Scorers on the Hugging Face Hub: a repo id resolved to a local snapshot, and a scorer directory uploaded.

``resolve`` goes through ``huggingface_hub.snapshot_download``, so a Hub scorer gets the Hub's cache
(``$HF_HUB_CACHE``), revisions (branch, tag or commit), tokens and offline mode (``HF_HUB_OFFLINE=1``: the cached
snapshot or a clear error, never a download). The whole repo is fetched, whatever files a scorer directory
holds. ``upload`` creates the repo if needed and commits the directory.
"""

from __future__ import annotations

import re
from pathlib import Path

__all__ = ["resolve", "upload", "looks_like_repo_id", "HubError"]

_REPO_ID = re.compile(r"^(?:[A-Za-z0-9][\w.-]{0,95}/)?[A-Za-z0-9][\w.-]{0,95}$")


class HubError(ValueError):
    """A scorer that is neither a local directory nor reachable on the Hub (or in its cache)."""


def looks_like_repo_id(name: str) -> bool:
    """Whether ``name`` can be a Hub repo id (``org/name`` or ``name``), not a filesystem path."""
    return bool(_REPO_ID.match(name)) and ".." not in name and "--" not in name and not name.endswith((".", "-"))


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
        if revision is not None:  # it would load the folder whatever its version: another scorer than the one pinned
            raise HubError(
                f"{path} is a local directory, and revision {revision!r} applies to Hub repo ids only: move the "
                "folder, or pass the snapshot's own folder without a revision"
            )
        return path
    name = str(name_or_path)
    if not looks_like_repo_id(name):
        raise HubError(f"{name}: not a directory (expected a saved pmi-reward scorer or a Hub repo id org/name)")
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import (
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    try:
        return Path(
            snapshot_download(
                name,
                revision=revision,
                cache_dir=hub_cache_dir,
                token=token,
                # offline: the cache alone (huggingface_hub 1.33 still lists a commit's files online, and fails)
                local_files_only=local_files_only or constants.HF_HUB_OFFLINE,
                library_name="pmi-reward",
                library_version=_version(),
            )
        )
    except LocalEntryNotFoundError as err:
        wanted = f"{name}: not a local directory, and revision {revision or 'main'} of the Hub repo {name} is not in "
        cached = f"the Hugging Face cache ({hub_cache_dir or constants.HF_HUB_CACHE})"
        if constants.HF_HUB_OFFLINE or local_files_only:
            offline = "HF_HUB_OFFLINE=1" if constants.HF_HUB_OFFLINE else "local_files_only=True"
            raise HubError(
                f"{wanted}{cached}; with {offline} nothing is downloaded. Download it once online (e.g. "
                f"`hf download {name}`) or pass a local directory"
            ) from None
        cause = err.__cause__ or err  # online: no network, a refused connection, a timeout, the Hub down
        raise HubError(
            f"{wanted}{cached}, and the Hub ({constants.ENDPOINT}) could not be reached to download it "
            f"({type(cause).__name__}: {cause}). Check the network (HF_ENDPOINT, proxies), or pass a local directory"
        ) from None
    except (RepositoryNotFoundError, RevisionNotFoundError) as err:
        raise HubError(f"{name}: not a local directory, and not on the Hub ({type(err).__name__}: {err})") from None
    except HfHubHTTPError as err:
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

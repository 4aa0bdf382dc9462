"""The control machine's view of a Hugging Face-compatible hub: which files a pinned commit holds.

One request per (endpoint, repo, revision), cached for the run: a commit sha
never changes what it lists, and every host of the rack asks the same.

    GET {endpoint}/api/models/{repo}/revision/{revision}?blobs=true

answers ``{"sha": "<full commit sha>", "siblings": [{"rfilename", "size",
"blobId", "lfs": {"sha256", "size", "pointerSize"}}, ...]}`` (the fields
huggingface_hub's ``HfApi.model_info(files_metadata=True)`` reads). LFS
files come with their sha256; small non-LFS files (config.json,
tokenizer_config.json) only with their git blob id, which is itself a hash
of the content, so the host checks those by blob id instead of fetching them
here to hash (see ``roles/model/files/model_fetch.py``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Optional
from urllib.parse import quote

from llamarack.errors import ModelSourceError


@dataclass(frozen=True)
class HubFile:
    """One file of a pinned commit: its size and the content hash the hub gives for it."""

    path: str
    size: int
    sha256: Optional[str]  # LFS files
    git_sha1: str  # every file: the git blob id

    @property
    def content_id(self) -> str:
        """The strongest content hash known, as ``algo:hex`` (what stamps are made of)."""
        return f"sha256:{self.sha256}" if self.sha256 else f"git-sha1:{self.git_sha1}"


@dataclass(frozen=True)
class HubListing:
    repo: str
    sha: str  # the full commit sha the hub resolved the revision to
    files: tuple[HubFile, ...]


@functools.lru_cache(maxsize=32)
def repo_files(endpoint: str, repo: str, revision: str, token: Optional[str] = None,
               timeout: float = 30.0) -> HubListing:  # fmt: skip
    """List the files of ``repo`` at ``revision`` with sizes and content hashes."""
    import requests  # here: a converged run and the audit never ask the hub, and requests costs 50 ms to import

    url = f"{endpoint.rstrip('/')}/api/models/{repo}/revision/{quote(revision, safe='')}"
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        r = requests.get(url, params={"blobs": "true"}, headers=headers, timeout=timeout)
    except requests.RequestException as e:
        raise ModelSourceError(f"cannot reach the hub at {endpoint}: {e.__class__.__name__}: {e}") from None
    if r.status_code in (401, 403):
        hint = "the token has no access" if token else "set model_hf_token_file"
        raise ModelSourceError(f"{repo}@{revision}: HTTP {r.status_code} from {endpoint}: "
                               f"a private or gated repository ({hint})")  # fmt: skip
    if r.status_code == 404:
        raise ModelSourceError(f"{repo}@{revision}: not found on {endpoint} (repository or revision)")
    if r.status_code != 200:
        raise ModelSourceError(f"{repo}@{revision}: HTTP {r.status_code} from {endpoint}")
    try:
        info = r.json()
        sha = info["sha"]
        siblings = info["siblings"]
    except (ValueError, KeyError, TypeError):
        raise ModelSourceError(f"{repo}@{revision}: {endpoint} answered without sha/siblings") from None
    if not sha.startswith(revision):
        raise ModelSourceError(f"{repo}: asked for revision {revision}, the hub resolved it to {sha}")
    files = []
    for s in siblings:
        if s.get("size") is None or not s.get("blobId"):
            raise ModelSourceError(f"{repo}@{revision}: {endpoint} gave no size/blobId for "
                                   f"{s.get('rfilename')} (blobs=true not supported?)")  # fmt: skip
        lfs = s.get("lfs") or {}
        files.append(HubFile(s["rfilename"], int(s["size"]), lfs.get("sha256"), s["blobId"]))
    return HubListing(repo, sha, tuple(files))

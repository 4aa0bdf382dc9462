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

One file is read here (``repo_config``): the checkpoint's ``config.json``, for preflight's
``awq-card-memory`` rule (``calibration.py``), from the resolve URL the hosts fetch from:

    GET {endpoint}/{repo}/resolve/{revision}/config.json
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Optional
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
    url = f"{endpoint.rstrip('/')}/api/models/{repo}/revision/{quote(revision, safe='')}"
    r = _get(url, endpoint, token, timeout, params={"blobs": "true"})
    _answered(r, f"{repo}@{revision}", endpoint, token, "repository or revision")
    try:
        info = r.json()
    except (ValueError, RecursionError):
        raise ModelSourceError(f"{repo}@{revision}: {endpoint} answered something that is not JSON") from None
    return listing_of(info, repo, revision, endpoint)


def _get(url: str, endpoint: str, token: Optional[str], timeout: float, **kwargs):
    """GET ``url`` with the token as the hub takes it (never shown); ModelSourceError when
    the hub cannot be reached."""
    import requests  # here: a converged run and the audit never ask the hub, and requests costs 50 ms to import

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        return requests.get(url, headers=headers, timeout=timeout, **kwargs)
    except requests.RequestException as e:
        raise ModelSourceError(f"cannot reach the hub at {endpoint}: {e.__class__.__name__}: {e}") from None


def _answered(r, where: str, endpoint: str, token: Optional[str], missing: str) -> None:
    """ModelSourceError, naming what the status says, unless the hub answered 200."""
    if r.status_code in (401, 403):
        hint = "the token has no access" if token else "set model_hf_token_file"
        raise ModelSourceError(f"{where}: HTTP {r.status_code} from {endpoint}: "
                               f"a private or gated repository ({hint})")  # fmt: skip
    if r.status_code == 404:
        raise ModelSourceError(f"{where}: not found on {endpoint} ({missing})")
    if r.status_code != 200:
        raise ModelSourceError(f"{where}: HTTP {r.status_code} from {endpoint}")


CONFIG_MAX_BYTES = 1 << 20  # a config.json is a few KiB; a bigger answer is not read


@dataclass(frozen=True)
class HubConfig:
    """A repository's ``config.json`` as the hub answered it: the parsed JSON object (read
    it, never change it: it is shared by every host that asks), or why there is none."""

    config: Optional[dict]
    problem: Optional[str] = None


@functools.lru_cache(maxsize=32)
def repo_config(endpoint: str, repo: str, revision: str, token: Optional[str] = None,
                git_sha1: Optional[str] = None, timeout: float = 30.0) -> HubConfig:  # fmt: skip
    """``config.json`` of ``repo`` at ``revision``, read once for the run (a problem too, never
    raised): at most ``CONFIG_MAX_BYTES`` within ``timeout`` seconds, the same bytes as the
    listing's blob id ``git_sha1`` where it is given, and a JSON object."""
    where = f"{repo}@{revision}: config.json"
    url = f"{endpoint.rstrip('/')}/{repo}/resolve/{quote(revision, safe='')}/config.json"
    try:
        data = _small_body(url, where, endpoint, token, timeout)
    except ModelSourceError as e:
        return HubConfig(None, str(e))
    if git_sha1 and hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest() != git_sha1:
        return HubConfig(None, f"{where}: {endpoint} sent {len(data)} bytes that are not the blob {git_sha1} "
                               "its listing names")  # fmt: skip
    try:
        config = json.loads(data)
    except (ValueError, RecursionError):
        return HubConfig(None, f"{where}: {endpoint} answered something that is not JSON")
    if not isinstance(config, dict):
        return HubConfig(None, f"{where}: {endpoint} answered {type(config).__name__}, not a JSON object")
    return HubConfig(config)


def _small_body(url: str, where: str, endpoint: str, token: Optional[str], timeout: float) -> bytes:
    """The body of a 200 answer to GET ``url``, read as it comes: ModelSourceError past
    ``CONFIG_MAX_BYTES`` or ``timeout`` seconds in all, or on any other status."""
    import requests

    deadline = time.monotonic() + timeout
    with _get(url, endpoint, token, timeout, stream=True) as r:
        _answered(r, where, endpoint, token, "no such file at that revision")
        data = bytearray()
        try:
            for chunk in r.iter_content(64 * 1024):
                data += chunk
                if len(data) > CONFIG_MAX_BYTES:
                    raise ModelSourceError(f"{where}: {endpoint} sent more than {CONFIG_MAX_BYTES} bytes")
                if time.monotonic() > deadline:
                    raise ModelSourceError(f"{where}: {endpoint} took more than {timeout:g} s to send it")
        except requests.RequestException as e:
            raise ModelSourceError(f"{where}: {endpoint} broke off: {e.__class__.__name__}") from None
    return bytes(data)


FULL_SHA = re.compile(r"[0-9a-f]{40}")
SHA256 = re.compile(r"[0-9a-f]{64}")
NAME_MAX = 255  # bytes of one path part, as Linux filesystems allow


def _shown(value: Any) -> str:
    """A value from the hub as a message shows it: its repr (control characters
    escaped), cut to 80 characters."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def repo_path_problem(path: Any) -> Optional[str]:
    """Why ``path`` cannot be a repository file put under a fetch directory, or None: a
    relative path of non-empty parts other than . and .., without control characters."""
    if not isinstance(path, str) or not path:
        return f"{_shown(path)} is not a file path"
    parts = path.split("/")
    if any(part in ("", ".", "..") for part in parts):
        return f"{_shown(path)} is not a relative path of named parts (no leading /, no //, no . or ..)"
    if any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F or c in "\u2028\u2029" for c in path):
        return f"{_shown(path)} holds a control character"
    if any(len(part.encode("utf-8", "replace")) > NAME_MAX for part in parts):
        return f"{_shown(path)} has a part longer than {NAME_MAX} bytes"
    return None


def listing_of(info: Any, repo: str, revision: str, endpoint: str) -> HubListing:
    """The listing from the hub's parsed answer; ModelSourceError, naming what is wrong,
    for an answer of another shape (a hostile or broken hub is refused, not a traceback)."""
    where = f"{repo}@{revision}: {endpoint}"
    if not isinstance(info, dict) or "sha" not in info or "siblings" not in info:
        raise ModelSourceError(f"{where} answered without sha/siblings")
    sha, siblings = info["sha"], info["siblings"]
    if not isinstance(sha, str) or not FULL_SHA.fullmatch(sha):
        raise ModelSourceError(f"{where} answered the commit sha {_shown(sha)}: not 40 lowercase hex digits")
    # A revision is 7 to 40 hex digits (model_revision): the full sha must begin with exactly it.
    if not FULL_SHA.fullmatch(revision.ljust(40, "0")) or sha[: len(revision)] != revision:
        raise ModelSourceError(f"{repo}: asked for revision {revision}, the hub resolved it to {sha}")
    if not isinstance(siblings, list):
        raise ModelSourceError(f"{where} answered siblings {_shown(siblings)}: not a list of files")
    files = tuple(_hub_file(s, where) for s in siblings)
    twice = sorted(path for path, n in Counter(f.path for f in files).items() if n > 1)
    if twice:
        raise ModelSourceError(f"{where} lists {_shown(twice[0])} more than once")
    return HubListing(repo, sha, files)


def _hub_file(sibling: Any, where: str) -> HubFile:
    """One sibling of the hub's answer, checked: a relative path, a byte count, the git
    blob id (40 hex digits) and, for an LFS file, a sha256 (64 hex digits)."""
    if not isinstance(sibling, dict):
        raise ModelSourceError(f"{where} listed a file that is not an object: {_shown(sibling)}")
    path = sibling.get("rfilename")
    problem = repo_path_problem(path)
    if problem:
        raise ModelSourceError(f"{where} listed a file path the hosts cannot take: {problem}")
    size, blob, lfs = sibling.get("size"), sibling.get("blobId"), sibling.get("lfs")
    if size is None or not blob:
        raise ModelSourceError(f"{where} gave no size/blobId for {path} (blobs=true not supported?)")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise ModelSourceError(f"{where} gave {path} the size {_shown(size)}: not a whole number of bytes")
    if not isinstance(blob, str) or not FULL_SHA.fullmatch(blob):
        raise ModelSourceError(f"{where} gave {path} the blobId {_shown(blob)}: not 40 lowercase hex digits")
    if lfs is not None and not isinstance(lfs, dict):
        raise ModelSourceError(f"{where} gave {path} the lfs entry {_shown(lfs)}: not an object")
    sha256 = (lfs or {}).get("sha256")
    if sha256 is not None and not (isinstance(sha256, str) and SHA256.fullmatch(sha256)):
        raise ModelSourceError(f"{where} gave {path} the sha256 {_shown(sha256)}: not 64 lowercase hex digits")
    return HubFile(path, size, sha256, blob)

# Runs on the host (standard library only, imports nothing from llamarack; run by llamarack.remote.command).
"""Fetch model files onto this host: resumable, verified, moved into place only when right.

Runs ON the target host with the system python3 (standard library only: a
fresh Debian has no ``requests``). The model role copies it to the host with
a JSON manifest and, for private repos, a token file of mode 600 that it
removes afterwards; it runs the fetch as an unprivileged user in a sandbox,
which reads that file on its standard input (``--token-file -``).

    python3 model_fetch.py fetch --manifest M.json --dest DIR [--token-file F|-] [--cache BLOBS]
    python3 model_fetch.py seal --stamp S.json --gguf DIR/model.gguf --out DIR/stamp.json
    python3 model_fetch.py prune-cache --cache BLOBS --models MODELS

Manifest::

    {"endpoint": "https://huggingface.co", "repo": "org/name", "revision": "<commit sha>",
     "files": [{"path": "model.safetensors", "size": 4976698672, "sha256": "<hex>"},
               {"path": "config.json", "size": 654, "git_sha1": "<hex>"},
               {"path": "model.gguf", "url": "https://mirror/x.gguf", "sha256": "<hex>"}]}

A file with ``url`` is fetched from there; the others from
``{endpoint}/{repo}/resolve/{revision}/{path}``. Each file is checked by the
content hash the pinned commit names: ``sha256`` for LFS files (the hub's
``lfs.sha256``), ``git_sha1`` (the git blob id) for small non-LFS files, whose
sha256 the hub does not publish.

Each file goes to ``DIR/<path>.partial`` and resumes from there with an HTTP
Range request, after a dropped connection (retried here) or in a later run.
Only a file whose size and hash match is renamed to ``DIR/<path>``; one that
does not is deleted and the run fails (exit 2), so a bad download never lands.
Free disk is checked before the first byte (exit 3). 401/403 exits 4.

With ``--cache BLOBS`` (``<root>/cache/blobs``) files are content-addressed
on the host: ``BLOBS/<algo>/<hex>``, algo ``sha256`` or ``git-sha1`` (the
names of the artifact records' content ids). A file the cache holds is
hardlinked into place (copied and verified when the destination is on
another filesystem) instead of downloaded; every file verified here goes into
the cache (a hardlink, so no second copy on disk). The cache never hands out
a corrupt blob:

- on insert, only a file whose hash was just verified goes in (a copy to
  another filesystem is hashed again once written), renamed into place whole;
  it is made read-only and its mtime set to ``BLOB_MTIME_NS``;
- on use, one ``stat``: a blob whose size is not the one the manifest names,
  or whose mtime is not ``BLOB_MTIME_NS`` any more (a write through any of its
  hardlinks, e.g. an artifact's model.gguf edited in place, moves it), is a
  miss: its cache name is removed and the file downloaded. Without a size in
  the manifest (source url) the blob is hashed in full instead.

``prune-cache`` removes the blobs that no artifact under MODELS names in its
``stamp.json`` (``files``) and no unfinished staging names in its
``manifest.json``; an unreadable record stops the prune (nothing removed).
Removing a cache name never frees a file something else links to.

The token is read from a file (never argv, never printed), the file must not
be readable by group or others, and it is sent only to the origin of the
URL it was meant for: a redirect to another host (a CDN with signed URLs)
does not carry it.
"""

from __future__ import annotations

import argparse
import errno
import hashlib
import http.client
import json
import os
import shutil
import stat
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

CHUNK = 1024 * 1024
# Every cache blob's mtime (2001-09-09T01:46:40Z): set on insert, moved by any later write.
BLOB_MTIME_NS = 1_000_000_000 * 1_000_000_000
EXIT_FAILED, EXIT_HASH, EXIT_DISK, EXIT_AUTH = 1, 2, 3, 4


class FetchError(Exception):
    def __init__(self, message: str, code: int = EXIT_FAILED):
        super().__init__(message)
        self.code = code


def log(message: str) -> None:
    print("model_fetch: " + message, flush=True)


def read_token(path: str) -> str:
    """The token from a private file, or for ``-`` from standard input: a file the caller
    opened (the model role's sandboxed fetch may not open root's file itself); refuses
    one that others could read."""
    st = os.fstat(0) if path == "-" else os.stat(path)
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise FetchError(f"token file {path} is readable by group or others (mode "
                         f"{stat.S_IMODE(st.st_mode):o}); it must be 600", EXIT_AUTH)  # fmt: skip
    if path == "-":
        token = sys.stdin.read().strip()
    else:
        with open(path) as f:
            token = f.read().strip()
        # Held in memory from here on: a fetch killed mid-file leaves no token on disk.
        os.unlink(path)
    if not token:
        raise FetchError(f"token file {path} is empty", EXIT_AUTH)
    return token


def origin(url: str) -> tuple:
    parts = urllib.parse.urlsplit(url)
    return (parts.scheme, parts.hostname, parts.port)


class _SameOriginAuthRedirect(urllib.request.HTTPRedirectHandler):
    """Follow redirects, but carry Authorization only to the origin it was meant for."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None and origin(newurl) != origin(req.full_url):
            new.headers.pop("Authorization", None)
            new.unredirected_hdrs.pop("Authorization", None)
        return new


_OPENER = urllib.request.build_opener(_SameOriginAuthRedirect())


class Hasher:
    """The hash a manifest entry names: sha256, or the git blob id for small hub files."""

    def __init__(self, entry: dict):
        self.size = entry.get("size")
        if entry.get("sha256"):
            self.kind, self.expected = "sha256", entry["sha256"].lower()
            self.h = hashlib.sha256()
        elif entry.get("git_sha1"):
            if self.size is None:
                raise FetchError(f"{entry['path']}: a git_sha1 check needs the size")
            self.kind, self.expected = "git_sha1", entry["git_sha1"].lower()
            self.h = hashlib.sha1(b"blob %d\0" % self.size)
        else:
            raise FetchError(f"{entry['path']}: the manifest gives no sha256 or git_sha1: "
                             "llamarack never installs an unpinned download")  # fmt: skip
        digits = 64 if self.kind == "sha256" else 40
        if len(self.expected) != digits or self.expected.strip("0123456789abcdef"):
            # Also what keeps a hostile listing's "hash" from naming a path in the cache.
            raise FetchError(f"{entry['path']}: the manifest's {self.kind} {self.expected!r} is not "
                             f"{digits} hex digits")  # fmt: skip

    def update(self, data: bytes) -> None:
        self.h.update(data)

    def hexdigest(self) -> str:
        return self.h.hexdigest()


# The cache's directory per hash kind: the prefixes of the artifact records' content ids.
CACHE_ALGOS = {"sha256": "sha256", "git_sha1": "git-sha1"}
# A hardlink is refused across filesystems (EXDEV), by some filesystems (EPERM) and
# past a file's link limit (EMLINK): then the file is copied, and the copy verified.
NO_LINK = (errno.EXDEV, errno.EPERM, errno.EMLINK)


def copy_verified(src: str, dst: str, entry: dict) -> None:
    """Copy ``src`` to ``dst``, then hash what landed; a copy that is not the pinned file is removed."""
    with open(src, "rb") as i, open(dst, "wb") as o:
        shutil.copyfileobj(i, o, CHUNK)
        o.flush()
        os.fsync(o.fileno())
    hasher = Hasher(entry)
    n = hash_file(dst, hasher)
    size = entry.get("size")
    if hasher.hexdigest() != hasher.expected or (size is not None and n != size):
        os.unlink(dst)
        raise FetchError(f"{entry['path']}: the copy of {src} is not the pinned file ({hasher.kind} "
                         f"{hasher.hexdigest()}, expected {hasher.expected}); removed", EXIT_HASH)  # fmt: skip


def place(src: str, dst: str, entry: dict) -> str:
    """A new name beside ``dst`` for ``src``'s file (a hardlink, or a verified copy where one
    cannot be made), for the caller to rename over ``dst``."""
    tmp = f"{dst}.tmp-{os.getpid()}"
    if os.path.lexists(tmp):
        os.unlink(tmp)
    try:
        os.link(src, tmp)
    except OSError as e:
        if e.errno not in NO_LINK:
            raise
        copy_verified(src, tmp, entry)
    return tmp


class BlobCache:
    """Verified files by content hash: ``<root>/<algo>/<hex>`` (mode 700 directories)."""

    def __init__(self, root: str):
        self.root = root

    def path(self, hasher: Hasher) -> str:
        return os.path.join(self.root, CACHE_ALGOS[hasher.kind], hasher.expected)

    def lookup(self, entry: dict):
        """The blob for ``entry`` when the cache holds a sound one, else None.

        Sound: the manifest's size and the mtime every blob gets on insert (one
        stat); without a size, the full hash. A blob that fails is dropped from
        the cache (its other links, if any, are not touched).
        """
        hasher = Hasher(entry)
        blob, size = self.path(hasher), entry.get("size")
        try:
            st = os.lstat(blob)
        except OSError:  # not there, or no cache to look in: a miss
            return None
        why = None
        if not stat.S_ISREG(st.st_mode):
            why = "is not a regular file"
        elif st.st_mtime_ns != BLOB_MTIME_NS:
            why = "was written to after it was cached (its mtime moved)"
        elif size is not None and st.st_size != size:
            why = f"has {st.st_size} bytes, not {size}"
        elif size is None:
            hash_file(blob, hasher)
            if hasher.hexdigest() != hasher.expected:
                why = f"has {hasher.kind} {hasher.hexdigest()}"
        if why is None:
            return blob
        log(f"{entry['path']}: the cached blob {blob} {why}: dropped from the cache")
        if stat.S_ISDIR(st.st_mode):
            shutil.rmtree(blob)
        else:
            os.unlink(blob)
        return None

    def put(self, entry: dict, verified: str) -> None:
        """Add ``verified`` (a file whose hash was just checked) under its hash, unless a sound blob is there."""
        hasher = Hasher(entry)
        blob = self.path(hasher)
        if self.lookup(entry) is not None:
            return
        tmp = None
        try:
            for d in (self.root, os.path.dirname(blob)):
                os.makedirs(d, mode=0o700, exist_ok=True)
            tmp = place(verified, blob, entry)
            # Shared with the hardlinked file: read-only, and the mtime a later write moves.
            os.chmod(tmp, 0o444)
            os.utime(tmp, ns=(BLOB_MTIME_NS, BLOB_MTIME_NS))
            os.rename(tmp, blob)
        except (OSError, FetchError) as e:
            # The cache saves downloads; a file it cannot take (a full disk under it) is still in place.
            log(f"{entry['path']}: not cached ({e.__class__.__name__}: {e})")
            if tmp and os.path.lexists(tmp):
                os.unlink(tmp)
            return
        log(f"{entry['path']}: cached as {blob}")

    def take(self, entry: dict, final: str) -> bool:
        """Put the cached blob of ``entry`` at ``final``; False when the cache has none."""
        blob = self.lookup(entry)
        if blob is None:
            return False
        tmp = place(blob, final, entry)
        os.rename(tmp, final)
        partial = final + ".partial"
        if os.path.exists(partial):
            os.unlink(partial)
        hasher = Hasher(entry)
        log(f"{entry['path']}: from the cache, not downloaded ({hasher.kind} {hasher.expected})")
        return True


def file_url(manifest: dict, entry: dict) -> str:
    """Where ``entry`` is fetched from; FetchError for a URL that cannot go on a request line
    (a character that is not ASCII: the settings refuse one, a manifest might not)."""
    if entry.get("url"):
        url = entry["url"]
    else:
        url = "{}/{}/resolve/{}/{}".format(
            manifest["endpoint"].rstrip("/"), manifest["repo"],
            urllib.parse.quote(manifest["revision"], safe=""),
            urllib.parse.quote(entry["path"]),
        )  # fmt: skip
    if not isinstance(url, str) or not url.isascii():
        raise FetchError(f"{entry['path']}: refusing the URL {url_shown(str(url))!a}: it holds characters that "
                         "are not ASCII; write them percent-encoded (UTF-8), a host name in its xn-- form")  # fmt: skip
    return url


def hash_file(path: str, hasher: Hasher) -> int:
    n = 0
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(CHUNK), b""):
            hasher.update(block)
            n += len(block)
    return n


def free_bytes(path: str) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def safe_join(dest: str, rel: str) -> str:
    """``dest/rel``, refusing a path that is not a file under ``dest`` (a hostile listing):
    absolute, empty, with an empty, ``.`` or ``..`` part, a control character (a NUL, a newline,
    C1, the Unicode line separators) or a part past NAME_MAX: as the control side's
    ``repo_path_problem``."""
    if not isinstance(rel, str) or any(part in ("", ".", "..") for part in rel.split("/")):
        raise FetchError(f"refusing file path {rel!r}: not a relative path of named parts under the destination")
    if any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F or c in "\u2028\u2029" for c in rel):
        raise FetchError(f"refusing file path {rel!a}: it holds a control character")
    if any(len(part.encode("utf-8", "replace")) > 255 for part in rel.split("/")):
        raise FetchError(f"refusing file path {rel[:80]!a}...: a part longer than 255 bytes (NAME_MAX)")
    return os.path.join(dest, *rel.split("/"))


class Progress:
    """Progress lines at a modest rate: at most one per ``interval`` seconds per file."""

    def __init__(self, name: str, total, interval: float, done: int):
        self.name, self.total, self.interval = name, total, interval
        self.start = self.last = time.monotonic()
        self.start_bytes = done

    def update(self, done: int, final: bool = False) -> None:
        now = time.monotonic()
        if not final and now - self.last < self.interval:
            return
        self.last = now
        rate = (done - self.start_bytes) / max(now - self.start, 1e-6) / 1e6
        if self.total:
            log(f"{self.name}: {done}/{self.total} bytes ({100.0 * done / self.total:.1f}%) "
                f"{rate:.1f} MB/s")  # fmt: skip
        else:
            log(f"{self.name}: {done} bytes {rate:.1f} MB/s")


def fetch_one(manifest: dict, entry: dict, dest: str, token, args, cache=None) -> None:
    path = entry["path"]
    final = safe_join(dest, path)
    partial = final + ".partial"
    os.makedirs(os.path.dirname(final), exist_ok=True)
    size = entry.get("size")

    if os.path.exists(final):
        hasher = Hasher(entry)
        n = hash_file(final, hasher)
        if (size is None or n == size) and hasher.hexdigest() == hasher.expected:
            log(f"{path}: already in place ({hasher.kind} {hasher.expected})")
            if cache:
                cache.put(entry, final)
            return
        raise FetchError(f"{path}: {final} exists but its {hasher.kind} is not the pinned "
                         f"{hasher.expected}; not overwriting it. Remove it to fetch again")  # fmt: skip
    if cache and cache.take(entry, final):
        return

    url = file_url(manifest, entry)
    attempt = 0
    while True:
        try:
            _download(url, entry, partial, token, args)
            break
        except FetchError:
            raise
        except ValueError as e:  # a URL urllib cannot request (no retry makes it one)
            raise FetchError(f"{path}: cannot request {url_shown(url)!a}: {e}") from None
        except (OSError, http.client.HTTPException) as e:  # URLError, timeouts, resets are OSErrors
            if isinstance(e, urllib.error.HTTPError) and e.code < 500 and e.code != 408:
                raise _http_error(path, e)
            attempt += 1
            if attempt > args.retries:
                raise FetchError(f"{path}: download failed after {attempt} attempt(s): {e}; "
                                 f"{_size(partial)} bytes kept in {partial} for the next run")  # fmt: skip
            wait = min(args.retry_wait * 2 ** (attempt - 1), 30)
            log(f"{path}: {e}; retrying from byte {_size(partial)} in {wait:g} s "
                f"(attempt {attempt + 1} of {args.retries + 1})")  # fmt: skip
            time.sleep(wait)

    hasher = Hasher(entry)
    n = hash_file(partial, hasher)
    got = hasher.hexdigest()
    if (size is not None and n != size) or got != hasher.expected:
        os.unlink(partial)
        raise FetchError(
            f"{path}: {hasher.kind} mismatch: expected {hasher.expected}, got {got} "
            f"({n} bytes{'' if size is None else f', expected {size}'}); the download was "
            "deleted and nothing was moved into place. The source does not hold the pinned "
            "file: check the revision/sha256 or the mirror", EXIT_HASH)  # fmt: skip
    with open(partial, "rb") as f:
        os.fsync(f.fileno())
    os.rename(partial, final)
    log(f"{path}: ok ({hasher.kind} {got})")
    if cache:
        cache.put(entry, final)


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def url_shown(url: str) -> str:
    """``url`` as it may be shown or kept where others read (output, a record): without the
    user and password before the host, the query and the fragment (a signed URL's signature)."""
    parts = urllib.parse.urlsplit(url)
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc.rpartition("@")[2], parts.path, "", ""))


def _http_error(path: str, e: "urllib.error.HTTPError") -> FetchError:
    if e.code in (401, 403):
        return FetchError(f"{path}: HTTP {e.code} from the hub: the repository needs a valid "
                          "token (model_hf_token_file) or the token has no access", EXIT_AUTH)  # fmt: skip
    return FetchError(f"{path}: HTTP {e.code} {e.reason} for {url_shown(e.url or '')}")


def _download(url: str, entry: dict, partial: str, token, args) -> None:
    """Append to ``partial`` from where it ends; raises OSError-like errors to retry."""
    path, size = entry["path"], entry.get("size")
    have = _size(partial)
    if size is not None and have > size:
        os.unlink(partial)  # longer than the file can be: not ours to resume
        have = 0
    if size is not None and have == size:
        return
    req = urllib.request.Request(url, headers={"User-Agent": "llamarack-model-fetch/1"})
    if token:
        req.add_header("Authorization", "Bearer " + token)
    if have:
        req.add_header("Range", f"bytes={have}-")
    try:
        resp = _OPENER.open(req, timeout=args.timeout)
    except urllib.error.HTTPError as e:
        if e.code == 416 and have:
            # The partial file claims to be complete or longer: verify decides.
            return
        raise
    with resp:
        if have and resp.status == 206:
            content_range = resp.headers.get("Content-Range", "")
            if not content_range.startswith(f"bytes {have}-"):
                raise FetchError(f"{path}: asked for bytes {have}- and got {content_range!r}")
            mode = "ab"
        else:
            if have:
                log(f"{path}: the server ignored the range request; starting again")
            have, mode = 0, "wb"
        length = resp.headers.get("Content-Length")
        total = size if size is not None else (have + int(length) if length else None)
        if length is not None:
            need = int(length) + args.reserve_bytes
            free = free_bytes(os.path.dirname(partial))
            if need > free:
                raise FetchError(f"{path}: not enough disk: {int(length)} bytes to fetch plus "
                                 f"{args.reserve_bytes} kept free, {free} free", EXIT_DISK)  # fmt: skip
        progress = Progress(path, total, args.progress_interval, have)
        with open(partial, mode) as out:
            done = have
            while True:
                block = resp.read(CHUNK)
                if not block:
                    break
                out.write(block)
                done += len(block)
                progress.update(done)
            out.flush()
        progress.update(done, final=True)
        if length is not None and done - have != int(length):
            raise ConnectionError(f"connection closed after {done - have} of {length} bytes")


def check_disk(manifest: dict, dest: str, reserve: int, cache=None) -> None:
    """Refuse before the first byte when the known sizes cannot fit (a cached file costs nothing)."""
    need = 0
    for entry in manifest["files"]:
        if entry.get("size") is None:
            continue
        final = safe_join(dest, entry["path"])
        if not os.path.exists(final) and not (cache and cache.lookup(entry)):
            need += max(entry["size"] - _size(final + ".partial"), 0)
    free = free_bytes(dest)
    if need + reserve > free:
        raise FetchError(f"not enough disk under {dest}: {need} bytes to fetch plus {reserve} "
                         f"kept free, {free} free", EXIT_DISK)  # fmt: skip


def cmd_fetch(args) -> None:
    with open(args.manifest) as f:
        manifest = json.load(f)
    os.makedirs(args.dest, exist_ok=True)
    token = read_token(args.token_file) if args.token_file else None
    cache = BlobCache(args.cache) if args.cache else None
    for entry in manifest["files"]:
        safe_join(args.dest, entry["path"])  # every path and URL checked before the first byte
        file_url(manifest, entry)
    check_disk(manifest, args.dest, args.reserve_bytes, cache)
    for entry in manifest["files"]:
        fetch_one(manifest, entry, args.dest, token, args, cache)
    log(f"all {len(manifest['files'])} file(s) in place under {args.dest}")


def _named_ids(path: str, manifest: bool) -> set:
    """The content ids (``algo:hex``) a stamp.json's ``files`` or a manifest.json's entries name."""
    with open(path) as f:
        data = json.load(f)
    if not manifest:
        return {str(cid) for cid in data["files"].values()}
    ids = set()
    for entry in data["files"]:
        hasher = Hasher(entry)
        ids.add(f"{CACHE_ALGOS[hasher.kind]}:{hasher.expected}")
    return ids


def cmd_prune_cache(args) -> None:
    """Remove the blobs no artifact record nor unfinished staging under ``--models`` names."""
    keep: set = set()
    staging = os.path.join(args.models, ".staging")
    records = [(os.path.join(args.models, n, "stamp.json"), False) for n in _listdir(args.models)
               if n not in ("current", ".staging")]  # fmt: skip
    for n in _listdir(staging):
        records += [(os.path.join(staging, n, "stamp.json"), False), (os.path.join(staging, n, "manifest.json"), True)]
    for path, is_manifest in records:
        if not os.path.isfile(path):
            continue  # a directory without a record names no file
        try:
            keep |= _named_ids(path, is_manifest)
        except (OSError, ValueError, KeyError, TypeError, AttributeError, FetchError) as e:
            log(f"cache: {path} cannot be read ({e.__class__.__name__}: {e}); nothing is pruned")
            return
    kept = removed = freed = 0
    for algo in sorted(set(CACHE_ALGOS.values()) & set(_listdir(args.cache))):
        d = os.path.join(args.cache, algo)
        for name in _listdir(d):
            blob = os.path.join(d, name)
            if f"{algo}:{name}" in keep:
                kept += 1
                continue
            st = os.lstat(blob)
            # Only the cache's name goes: a file an artifact still links to keeps its data.
            if stat.S_ISDIR(st.st_mode):
                shutil.rmtree(blob)
            else:
                os.unlink(blob)
            removed += 1
            freed += st.st_size if st.st_nlink == 1 else 0
    log(f"cache {args.cache}: kept {kept} blob(s), removed {removed} that no artifact names "
        f"({freed} bytes freed)")  # fmt: skip


def _listdir(path: str) -> list:
    try:
        return sorted(os.listdir(path))
    except FileNotFoundError:
        return []


def cmd_seal(args) -> None:
    """Write the artifact's stamp: the plan's record plus the GGUF's size and sha256."""
    with open(args.stamp) as f:
        stamp = json.load(f)
    hasher = hashlib.sha256()
    with open(args.gguf, "rb") as f:
        for block in iter(lambda: f.read(CHUNK), b""):
            hasher.update(block)
    st = os.stat(args.gguf)
    # The signature (size, mtime, inode) is what every later run compares, cheaply: a
    # GGUF written to in place, or replaced, after its seal is not this artifact any more.
    stamp["gguf"] = {"size": st.st_size, "sha256": hasher.hexdigest(),
                     "signature": {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "inode": st.st_ino}}
    stamp["sealed_at"] = time.time()
    tmp = args.out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(stamp, f, indent=1, sort_keys=True)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.rename(tmp, args.out)
    log(f"sealed {args.gguf}: {stamp['gguf']['size']} bytes, sha256 {stamp['gguf']['sha256']}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Fetch and verify model files (llamarack).")
    sub = parser.add_subparsers(dest="command", required=True)
    fetch = sub.add_parser("fetch", help="download the manifest's files into --dest")
    fetch.add_argument("--manifest", required=True)
    fetch.add_argument("--dest", required=True)
    fetch.add_argument("--token-file", help="file holding the hub token (mode 600); - for standard input")
    fetch.add_argument("--retries", type=int, default=5)
    fetch.add_argument("--retry-wait", type=float, default=2.0)
    fetch.add_argument("--timeout", type=float, default=60.0)
    fetch.add_argument("--progress-interval", type=float, default=10.0)
    fetch.add_argument("--reserve-bytes", type=int, default=1 << 30,
                       help="bytes to leave free on the destination's filesystem")  # fmt: skip
    fetch.add_argument("--cache", help="the blob cache: files taken from it and verified ones added")
    seal = sub.add_parser("seal", help="write the stamp of a finished artifact")
    seal.add_argument("--stamp", required=True)
    seal.add_argument("--gguf", required=True)
    seal.add_argument("--out", required=True)
    prune = sub.add_parser("prune-cache", help="remove the cached blobs no artifact names")
    prune.add_argument("--cache", required=True)
    prune.add_argument("--models", required=True)
    args = parser.parse_args(argv)
    try:
        {"fetch": cmd_fetch, "seal": cmd_seal, "prune-cache": cmd_prune_cache}[args.command](args)
    except FetchError as e:
        print(f"model_fetch: error: {e}", file=sys.stderr, flush=True)
        return e.code
    return 0


if __name__ == "__main__":
    sys.exit(main())

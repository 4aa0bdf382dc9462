# Runs on the host (standard library only, imports nothing from llamarack; run by llamarack.remote.command).
"""Fetch model files onto this host: resumable, verified, moved into place only when right.

Runs ON the target host with the system python3 (standard library only: a
fresh Debian has no ``requests``). The model role copies it to the host with
a JSON manifest and, for private repos, a token file of mode 600 that it
removes afterwards.

    python3 model_fetch.py fetch --manifest M.json --dest DIR [--token-file F]
    python3 model_fetch.py seal --stamp S.json --gguf DIR/model.gguf --out DIR/stamp.json

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

The token is read from a file (never argv, never printed), the file must not
be readable by group or others, and it is sent only to the origin of the
URL it was meant for: a redirect to another host (a CDN with signed URLs)
does not carry it.
"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import json
import os
import stat
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

CHUNK = 1024 * 1024
EXIT_FAILED, EXIT_HASH, EXIT_DISK, EXIT_AUTH = 1, 2, 3, 4


class FetchError(Exception):
    def __init__(self, message: str, code: int = EXIT_FAILED):
        super().__init__(message)
        self.code = code


def log(message: str) -> None:
    print("model_fetch: " + message, flush=True)


def read_token(path: str) -> str:
    """The token from a private file; refuses one that others could read."""
    st = os.stat(path)
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise FetchError(f"token file {path} is readable by group or others (mode "
                         f"{stat.S_IMODE(st.st_mode):o}); it must be 600", EXIT_AUTH)  # fmt: skip
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

    def update(self, data: bytes) -> None:
        self.h.update(data)

    def hexdigest(self) -> str:
        return self.h.hexdigest()


def file_url(manifest: dict, entry: dict) -> str:
    if entry.get("url"):
        return entry["url"]
    return "{}/{}/resolve/{}/{}".format(
        manifest["endpoint"].rstrip("/"), manifest["repo"],
        urllib.parse.quote(manifest["revision"], safe=""),
        urllib.parse.quote(entry["path"]),
    )  # fmt: skip


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
    """``dest/rel``, refusing paths that would leave ``dest`` (a hostile listing)."""
    if rel.startswith("/") or ".." in rel.split("/"):
        raise FetchError(f"refusing file path {rel!r}: it leaves the destination")
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


def fetch_one(manifest: dict, entry: dict, dest: str, token, args) -> None:
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
            return
        raise FetchError(f"{path}: {final} exists but its {hasher.kind} is not the pinned "
                         f"{hasher.expected}; not overwriting it. Remove it to fetch again")  # fmt: skip

    url = file_url(manifest, entry)
    attempt = 0
    while True:
        try:
            _download(url, entry, partial, token, args)
            break
        except FetchError:
            raise
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


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _http_error(path: str, e: "urllib.error.HTTPError") -> FetchError:
    if e.code in (401, 403):
        return FetchError(f"{path}: HTTP {e.code} from the hub: the repository needs a valid "
                          "token (model_hf_token_file) or the token has no access", EXIT_AUTH)  # fmt: skip
    return FetchError(f"{path}: HTTP {e.code} {e.reason} for {e.url}")


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


def check_disk(manifest: dict, dest: str, reserve: int) -> None:
    """Refuse before the first byte when the known sizes cannot fit."""
    need = 0
    for entry in manifest["files"]:
        if entry.get("size") is None:
            continue
        final = safe_join(dest, entry["path"])
        if not os.path.exists(final):
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
    check_disk(manifest, args.dest, args.reserve_bytes)
    for entry in manifest["files"]:
        fetch_one(manifest, entry, args.dest, token, args)
    log(f"all {len(manifest['files'])} file(s) in place under {args.dest}")


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
    fetch.add_argument("--token-file", help="file holding the hub token (mode 600)")
    fetch.add_argument("--retries", type=int, default=5)
    fetch.add_argument("--retry-wait", type=float, default=2.0)
    fetch.add_argument("--timeout", type=float, default=60.0)
    fetch.add_argument("--progress-interval", type=float, default=10.0)
    fetch.add_argument("--reserve-bytes", type=int, default=1 << 30,
                       help="bytes to leave free on the destination's filesystem")  # fmt: skip
    seal = sub.add_parser("seal", help="write the stamp of a finished artifact")
    seal.add_argument("--stamp", required=True)
    seal.add_argument("--gguf", required=True)
    seal.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    try:
        {"fetch": cmd_fetch, "seal": cmd_seal}[args.command](args)
    except FetchError as e:
        print(f"model_fetch: error: {e}", file=sys.stderr, flush=True)
        return e.code
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A local stand-in for a Hugging Face-compatible hub: exactly what llamarack uses.

    server = HubServer({"tiny/llama": "/path/to/checkpoint"}, token="hf_x", host="127.0.0.1")
    server.start()          # server.url -> "http://127.0.0.1:PORT"
    ...
    server.stop()

Endpoints, in the format of huggingface.co (the fields huggingface_hub's
``HfApi.model_info(files_metadata=True)`` reads, in ``hf_api.py``):

- ``GET /api/models/{repo}/revision/{rev}[?blobs=true]``: JSON ``{"id", "modelId",
  "sha", "siblings": [{"rfilename"}, ...]}``; with ``blobs=true`` each sibling
  also has ``size``, ``blobId`` (git blob sha1) and, for LFS files,
  ``lfs: {"sha256", "size", "pointerSize"}``.
- ``GET``/``HEAD /{repo}/resolve/{rev}/{path}``: the file, with ``Range`` support
  (206 + ``Content-Range``; 416 past the end), ``ETag`` (the LFS sha256 or the
  git blob id, quoted), ``X-Repo-Commit`` and ``Accept-Ranges: bytes``.

``rev`` is the repository's commit sha (derived from its content, like a
git commit), a prefix of it of 7 or more hex digits (a short sha, which
``model_revision`` accepts), or ``main``. With a token set, a request without
``Authorization: Bearer <token>`` gets 401 (huggingface.co answers 401 for
private and gated repos). The server binds where the caller says: tests use
127.0.0.1; lab hosts reach this machine at 10.77.0.1.

Faults for tests (each applies to the next matching download only once,
unless said otherwise):

- ``drop_after(path, n, times=1)``: send the headers and the file up to byte ``n``,
  then cut the connection (the next ``times`` downloads).
- ``corrupt(path)``: serve the right length of wrong bytes (every time).
- ``redirects[path] = url``: answer 302 to ``url`` (another server: a CDN).

The hub process takes the same faults as options (``--drop-after PATH=BYTES[xTIMES]``,
``--corrupt PATH``).

``requests`` records what was asked and sent (method, path, range, whether
auth was present and right, bytes of body sent); never the token itself. The
hub process also prints each record, once answered, as a JSON line (``hub.log``
in the lab's state dir): what a bench counts the hub's bytes from.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
import threading
from dataclasses import asdict, dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Callable, Mapping, Optional
from urllib.parse import parse_qs, unquote, urlsplit

# huggingface.co's default .gitattributes sends these to LFS; bigger files go there too.
LFS_SUFFIXES = (
    ".safetensors", ".bin", ".gguf", ".model", ".pt", ".pth", ".ckpt", ".h5", ".msgpack",
    ".onnx", ".ot", ".pb", ".tflite", ".npy", ".npz", ".zip", ".tar", ".gz", ".zst",
)  # fmt: skip
LFS_MIN_SIZE = 10 * 1024 * 1024
CHUNK = 1024 * 1024


def git_blob_sha1(data: bytes) -> str:
    """The id git gives a file's content (what the hub calls ``blobId``)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass(frozen=True)
class RepoFile:
    path: str  # relative, with "/"
    local: Path
    size: int
    blob_id: str
    sha256: Optional[str]  # set for LFS files only, as on the hub


@dataclass
class Repo:
    """One repository served from a directory, at one commit derived from its content."""

    repo_id: str
    root: Path
    files: dict = field(default_factory=dict)
    sha: str = ""

    @classmethod
    def scan(cls, repo_id: str, root: Path) -> "Repo":
        repo = cls(repo_id, Path(root))
        for local in sorted(p for p in repo.root.rglob("*") if p.is_file()):
            rel = local.relative_to(repo.root).as_posix()
            data = local.read_bytes()
            lfs = local.suffix in LFS_SUFFIXES or len(data) >= LFS_MIN_SIZE
            repo.files[rel] = RepoFile(
                rel, local, len(data), git_blob_sha1(data),
                hashlib.sha256(data).hexdigest() if lfs else None,
            )  # fmt: skip
        listing = json.dumps([[f.path, f.blob_id] for f in repo.files.values()]).encode()
        repo.sha = hashlib.sha1(b"commit " + repo_id.encode() + b"\0" + listing).hexdigest()
        return repo

    def info(self, blobs: bool) -> dict:
        siblings = []
        for f in self.files.values():
            sibling: dict = {"rfilename": f.path}
            if blobs:
                sibling.update(size=f.size, blobId=f.blob_id)
                if f.sha256:
                    sibling["lfs"] = {"sha256": f.sha256, "size": f.size, "pointerSize": 134}
            siblings.append(sibling)
        return {
            "_id": self.sha[:24], "id": self.repo_id, "modelId": self.repo_id,
            "sha": self.sha, "private": False, "siblings": siblings,
        }  # fmt: skip


@dataclass
class Logged:
    method: str
    path: str
    range: Optional[str]
    auth: str  # "none", "ok" or "bad": never the token
    status: int = 0
    sent: int = 0
    user_agent: str = ""


class HubServer:
    """The hub, in a thread. ``repos`` maps a repo id to the directory holding its files."""

    def __init__(self, repos: Mapping[str, "str | Path"], token: Optional[str] = None,
                 host: str = "127.0.0.1", port: int = 0):  # fmt: skip
        self.repos = {rid: Repo.scan(rid, Path(d)) for rid, d in repos.items()}
        self.token = token
        self.requests: list[Logged] = []
        self._drops: dict[str, int] = {}
        self._corrupt: set[str] = set()
        # path -> absolute URL: answer 302 there (huggingface.co sends LFS files to a CDN)
        self.redirects: dict[str, str] = {}
        # called with each request's record once it is answered (the process prints it)
        self.answered: Optional[Callable[[Logged], None]] = None
        self._lock = threading.Lock()
        hub = self

        class Handler(_Handler):
            server_hub = hub

        self.httpd = ThreadingHTTPServer((host, port), Handler)
        self.httpd.daemon_threads = True
        self._thread: Optional[threading.Thread] = None

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}"

    def repo(self, repo_id: str) -> Repo:
        return self.repos[repo_id]

    def drop_after(self, path: str, nbytes: int, times: int = 1) -> None:
        """Cut the next ``times`` downloads of ``path`` (repo-relative) after ``nbytes`` of
        the file (a resumed download, asked from a byte past it, is cut at once)."""
        with self._lock:
            self._drops[path] = (nbytes, times)

    def corrupt(self, path: str) -> None:
        """Serve wrong bytes (of the right length) for ``path`` from now on."""
        with self._lock:
            self._corrupt.add(path)

    def downloads(self, path: str) -> list[Logged]:
        """The logged GET requests for a repo-relative file path."""
        return [r for r in self.requests if r.method == "GET" and r.path.endswith("/" + path)
                and "/resolve/" in r.path]  # fmt: skip

    def start(self) -> "HubServer":
        self._thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self) -> "HubServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _take_drop(self, path: str) -> Optional[int]:
        """Bytes of the file after which this download is cut, or None."""
        with self._lock:
            nbytes, times = self._drops.pop(path, (None, 0))
            if times > 1:
                self._drops[path] = (nbytes, times - 1)
            return nbytes


_RESOLVE = re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<path>.+)$")
_INFO = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)/revision/(?P<rev>[^/]+)$")


class _Handler(BaseHTTPRequestHandler):
    server_hub: HubServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format, *args):  # quiet: tests read hub.requests instead
        pass

    def handle_one_request(self):
        self._entry = None
        super().handle_one_request()
        if self._entry is not None and self.server_hub.answered:
            self.server_hub.answered(self._entry)

    def _auth(self) -> str:
        given = self.headers.get("Authorization")
        if given is None:
            return "none"
        return "ok" if self.server_hub.token and given == f"Bearer {self.server_hub.token}" else "bad"

    def do_HEAD(self):
        self._serve(head=True)

    def do_GET(self):
        self._serve(head=False)

    def _serve(self, head: bool) -> None:
        hub = self.server_hub
        split = urlsplit(self.path)
        path = unquote(split.path)
        entry = Logged(self.command, path, self.headers.get("Range"), self._auth(),
                       user_agent=self.headers.get("User-Agent", ""))  # fmt: skip
        with hub._lock:
            hub.requests.append(entry)
        self._entry = entry
        if hub.token and entry.auth != "ok":
            return self._json(entry, 401, {"error": "Invalid credentials in Authorization header"})

        m = _INFO.match(path)
        if m:
            repo = self._repo(m["repo"], m["rev"])
            if repo is None:
                return self._json(entry, 404, {"error": "Repository or revision not found"})
            blobs = parse_qs(split.query).get("blobs", ["false"])[0].lower() == "true"
            return self._json(entry, 200, repo.info(blobs), head=head)

        m = _RESOLVE.match(path)
        if not m:
            return self._json(entry, 404, {"error": "not found"})
        repo = self._repo(m["repo"], m["rev"])
        f = repo.files.get(m["path"]) if repo else None
        if f is None:
            return self._json(entry, 404, {"error": "Entry not found"})
        if f.path in hub.redirects:
            entry.status = 302
            self.send_response(302)
            self.send_header("Location", hub.redirects[f.path])
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self._file(entry, repo, f, head)

    def _repo(self, repo_id: str, rev: str) -> Optional[Repo]:
        repo = self.server_hub.repos.get(repo_id)
        short = len(rev) >= 7 and repo is not None and repo.sha.startswith(rev)
        if repo is None or not (short or rev == "main"):
            return None
        return repo

    def _json(self, entry: Logged, status: int, body: dict, head: bool = False) -> None:
        data = json.dumps(body).encode()
        entry.status = status
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if not head:
            self.wfile.write(data)
            entry.sent = len(data)

    def _file(self, entry: Logged, repo: Repo, f: RepoFile, head: bool) -> None:
        hub = self.server_hub
        start, end = 0, f.size - 1
        status = 200
        if entry.range:
            m = re.fullmatch(r"bytes=(\d+)-(\d*)", entry.range.strip())
            if not m or int(m[1]) >= f.size:
                entry.status = 416
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{f.size}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            start = int(m[1])
            end = min(int(m[2]), f.size - 1) if m[2] else f.size - 1
            status = 206
        length = end - start + 1
        entry.status = status
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(length))
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("ETag", f'"{f.sha256 or f.blob_id}"')
        self.send_header("X-Repo-Commit", repo.sha)
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{end}/{f.size}")
        self.end_headers()
        if head:
            return
        drop = hub._take_drop(f.path)
        if drop is not None:  # counted in bytes of the body: a resumed download is cut at once
            drop = max(0, drop - start)
        with hub._lock:
            corrupt = f.path in hub._corrupt
        with open(f.local, "rb") as src:
            src.seek(start)
            remaining = length
            while remaining:
                chunk = src.read(min(CHUNK, remaining))
                if corrupt:
                    chunk = bytes(b ^ 0x5A for b in chunk)
                if drop is not None and entry.sent + len(chunk) >= drop:
                    chunk = chunk[: drop - entry.sent]
                    self.wfile.write(chunk)
                    self.wfile.flush()
                    entry.sent += len(chunk)
                    # Cut the TCP connection mid-body, as a flaky link would.
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return
                self.wfile.write(chunk)
                entry.sent += len(chunk)
                remaining -= len(chunk)


_PRINTING = threading.Lock()


def print_record(entry: "Logged") -> None:
    """One answered request's record as one JSON line, in one write: the hub's threads answer at
    once, and print()'s separate newline let two records share a line of hub.log."""
    line = json.dumps(asdict(entry)) + "\n"
    with _PRINTING:
        sys.stdout.write(line)
        sys.stdout.flush()


def main(argv=None) -> None:
    """Serve directories as repos: ``hub_server.py --bind 127.0.0.1 --port 8765 org/name=DIR ...``."""
    import argparse
    import os

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--bind", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--token-env", help="name of an environment variable holding the token")
    parser.add_argument("--drop-after", action="append", default=[], metavar="PATH=BYTES[xTIMES]",
                        help="cut the next TIMES (1) downloads of PATH at byte BYTES")
    parser.add_argument("--corrupt", action="append", default=[], metavar="PATH",
                        help="serve other bytes of the right length for PATH (its sha256 is then wrong)")
    parser.add_argument("repos", nargs="+", metavar="REPO=DIR")
    args = parser.parse_args(argv)
    repos = dict(item.split("=", 1) for item in args.repos)
    token = os.environ.get(args.token_env) if args.token_env else None
    server = HubServer(repos, token=token, host=args.bind, port=args.port)
    for item in args.drop_after:
        path, _, spec = item.rpartition("=")
        nbytes, _, times = spec.partition("x")
        server.drop_after(path, int(nbytes), int(times or 1))
    for path in args.corrupt:
        server.corrupt(path)
    for repo in server.repos.values():
        print(f"{server.url}/api/models/{repo.repo_id}/revision/{repo.sha}", flush=True)
    server.answered = print_record
    server.httpd.serve_forever()


if __name__ == "__main__":
    main()

"""A local package index for tests: real wheels, cached, served as a PEP 503 simple index.

    house = wheelhouse(["torch==2.13.0", "transformers==4.44.2"], constraints=["numpy<2"])
    index = PypiIndex([house], host="127.0.0.1")   # lab hosts reach this machine at 10.77.0.1
    index.start()                                  # index.url -> "http://127.0.0.1:PORT/simple"
    ...
    index.stop()

or, for the lab:  python3 tests/support/pypi_index.py --host 10.77.0.1 --port 8765 REQ...

``wheelhouse`` runs ``pip download`` once per requirement set into
``<cache>/wheels/<hash>/`` (the machine's pip configuration applies, so torch
comes from the local wheel of these machines); a set is complete only once its
``.done`` marker exists. Only wheels are served: nothing is built on a host.
"""

from __future__ import annotations

import argparse
import hashlib
import html
import re
import shutil
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Iterable, Optional
from urllib.parse import unquote

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cache import CACHE, digest, locked  # noqa: E402


def wheelhouse(
    requirements: Iterable[str], constraints: Iterable[str] = (), no_deps: bool = False
) -> Path:
    """A directory of the wheels ``requirements`` resolve to, downloaded once and cached."""
    requirements, constraints = list(requirements), list(constraints)
    key = digest(requirements, constraints, no_deps, sys.version_info[:2])
    house = CACHE / "wheels" / key
    done = house / ".done"
    if done.exists():
        return house
    with locked(house):
        if done.exists():
            return house
        shutil.rmtree(house, ignore_errors=True)
        house.mkdir(parents=True)
        started = time.monotonic()
        args = [sys.executable, "-m", "pip", "download", "--quiet", "--only-binary", ":all:",
                "-d", str(house)]  # fmt: skip
        if no_deps:
            args.append("--no-deps")
        if constraints:
            (house / "constraints.txt").write_text("".join(c + "\n" for c in constraints))
            args += ["-c", str(house / "constraints.txt")]
        subprocess.run(args + requirements, check=True)
        done.write_text(f"{' '.join(requirements)}\n{time.monotonic() - started:.1f} s\n")
    return house


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _project(filename: str) -> str:
    """The PEP 503 project name of a wheel file (``typing_extensions-4.12...`` -> ``typing-extensions``)."""
    return _canonical(filename.split("-", 1)[0])


class PypiIndex:
    """Serves the wheels of some directories as ``<url>/<project>/`` pages (PEP 503)."""

    def __init__(self, houses: Iterable[Path], host: str = "127.0.0.1", port: int = 0):
        self.files: dict[str, Path] = {}
        for house in houses:
            for wheel in sorted(Path(house).glob("*.whl")):
                self.files[wheel.name] = wheel
        self.host, self.port = host, port
        self.requests: list[str] = []
        self._server: Optional[ThreadingHTTPServer] = None
        self._sha: dict[str, str] = {}

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/simple"

    def sha256(self, name: str) -> str:
        if name not in self._sha:
            digest_ = hashlib.sha256()
            with open(self.files[name], "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    digest_.update(block)
            self._sha[name] = digest_.hexdigest()
        return self._sha[name]

    def page(self, project: Optional[str]) -> Optional[str]:
        if project is None:
            names = sorted({_project(n) for n in self.files})
            links = "".join(f'<a href="{n}/">{n}</a>\n' for n in names)
        else:
            wheels = sorted(n for n in self.files if _project(n) == project)
            if not wheels:
                return None
            links = "".join(
                f'<a href="../../files/{html.escape(n)}#sha256={self.sha256(n)}">{html.escape(n)}</a>\n'
                for n in wheels
            )
        return f"<!DOCTYPE html><html><body>\n{links}</body></html>\n"

    def start(self) -> "PypiIndex":
        index = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet: tests read index.requests instead
                pass

            def do_GET(self):
                index.requests.append(self.path)
                parts = [unquote(p) for p in self.path.split("?")[0].split("/") if p]
                if parts[:1] == ["simple"] and len(parts) <= 2:
                    body = index.page(_canonical(parts[1]) if len(parts) == 2 else None)
                    if body is None:
                        return self.send_error(404)
                    return self._send(body.encode(), "text/html")
                if parts[:1] == ["files"] and len(parts) == 2 and parts[1] in index.files:
                    return self._send(index.files[parts[1]].read_bytes(), "application/octet-stream")
                self.send_error(404)

            def _send(self, body: bytes, kind: str):
                self.send_response(200)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self._server = ThreadingHTTPServer((self.host, self.port), Handler)
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--constraint", action="append", default=[])
    parser.add_argument("--no-deps", action="append", default=[], help="a requirement fetched alone")
    parser.add_argument("requirements", nargs="*")
    args = parser.parse_args()
    houses = [wheelhouse(args.requirements, args.constraint)]
    if args.no_deps:
        houses.append(wheelhouse(args.no_deps, no_deps=True))
    index = PypiIndex(houses, args.host, args.port).start()
    print(index.url, flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        index.stop()


if __name__ == "__main__":
    main()

"""A local package index for tests: real wheels, cached, served as a PEP 503 simple index.

    house = wheelhouse(["torch==2.13.0", "transformers==4.44.2"], constraints=["numpy<2"])
    index = PypiIndex([house], host="127.0.0.1")   # lab hosts reach this machine at 10.77.0.1
    index.start()                                  # index.url -> "http://127.0.0.1:PORT/simple"
    ...
    index.stop()

or, for the lab:  python3 tests/support/pypi_index.py --host 10.77.0.1 --port 8765 REQ...

``wheelhouse`` is the lab's (lab/llamarack_lab/wheels.py), in the test cache: ``pip
download`` once per requirement set into ``<cache>/wheels/<hash>/``. Only
wheels are served: nothing is built on a host. The lab itself serves the same
pages as static files (``wheels.write_index``); this server is for tests that
want to see the requests.
"""

from __future__ import annotations

import argparse
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Iterable, Optional
from urllib.parse import unquote

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from llamarack_lab import wheels  # noqa: E402
from tests.support.cache import CACHE  # noqa: E402


def wheelhouse(
    requirements: Iterable[str], constraints: Iterable[str] = (), no_deps: bool = False
) -> Path:
    """A directory of the wheels ``requirements`` resolve to, downloaded once and cached."""
    return wheels.wheelhouse(requirements, constraints, no_deps, cache=CACHE)


_canonical = wheels.canonical
_project = wheels.project


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
            self._sha[name] = wheels.sha256_file(self.files[name])
        return self._sha[name]

    def page(self, project: Optional[str]) -> Optional[str]:
        if project is None:
            return wheels.root_page(_project(n) for n in self.files)
        names = sorted(n for n in self.files if _project(n) == project)
        if not names:
            return None
        return wheels.project_page({n: self.sha256(n) for n in names})

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

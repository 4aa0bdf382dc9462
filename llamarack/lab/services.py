"""The lab's stand-ins for the outside sources a real rack reaches.

Lab hosts cannot reach GitHub, Hugging Face or conda channels (nor can this
machine), so the lab serves local copies of real artifacts from the machine
at the bridge address, and the lab inventory points the settings there:

    http://10.77.0.1:8470/llama.cpp.git   llama.cpp, from the PyPI sdist (mirror.py)

The file server is a detached ``python3 -m http.server`` (git's "dumb" HTTP
protocol needs nothing more); its PID is recorded so ``lab down`` stops it.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from . import mirror, paths

SERVICES_PORT = 8470


def srv_dir() -> Path:
    return paths.cache_dir() / "srv"


def sources_dir() -> Path:
    return paths.cache_dir().parent / "sources"


def prepare() -> mirror.Mirror:
    """Make what the file server serves (cached across racks)."""
    return mirror.ensure_mirror(sources_dir(), srv_dir())


def start(bind: str) -> int:
    """Start the file server on ``bind``:SERVICES_PORT; return its PID once it answers."""
    log = open(paths.state_dir() / "services.log", "ab")
    proc = subprocess.Popen(
        [sys.executable, "-m", "http.server", "--bind", bind, "--directory", str(srv_dir()),
         str(SERVICES_PORT)],
        stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((bind, SERVICES_PORT), timeout=0.5):
                return proc.pid
        except OSError:
            if proc.poll() is not None:
                raise RuntimeError(f"lab file server exited: see {log.name}")
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"lab file server did not answer on {bind}:{SERVICES_PORT}")


def stop(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        pass


def url(bind: str, path: str) -> str:
    return f"http://{bind}:{SERVICES_PORT}/{path}"

"""Slow lab inputs, built once and cached by their inputs.

Every entry lives under one cache root (``/var/cache/llamarack``: the lab
passes ``paths.cache_dir().parent``, the tests ``LLAMARACK_TEST_CACHE``):

    venvs/<name>-<hash>/     virtual environments for tools (the tiny model's maker)
    wheels/<hash>/           wheelhouses (wheels.py)
    tiny-model/<hash>/       the tiny real checkpoint (tiny_model.py)

An entry is complete only once its ``.done`` marker exists; it is built
under a lock, so two processes never build the same entry at once. The
system python stays light: torch and friends only ever go into these venvs.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Iterable, Iterator, Optional


def digest(*parts) -> str:
    """A short stable hash of JSON-able parts (the cache key of an entry)."""
    text = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(str(path) + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _stderr(message: str) -> None:
    print(f"[cache] {message}", file=sys.stderr, flush=True)


def venv(cache: Path, name: str, requirements: Iterable[str],
         log: Optional[Callable[[str], None]] = _stderr) -> Path:  # fmt: skip
    """A venv with ``requirements`` installed, cached by the requirement list; returns its python."""
    requirements = list(requirements)
    root = Path(cache) / "venvs" / f"{name}-{digest(requirements, sys.version_info[:2])}"
    python = root / "bin" / "python"
    done = root / ".done"
    if done.exists():
        return python
    with locked(root):
        if done.exists():
            return python
        # A venv is not relocatable (absolute shebangs), so it is built in place;
        # a half-built one (no .done) is thrown away and built again.
        shutil.rmtree(root, ignore_errors=True)
        started = time.monotonic()
        if log:
            log(f"building venv {root.name}: {' '.join(requirements)}")
        subprocess.run([sys.executable, "-m", "venv", str(root)], check=True)
        subprocess.run(
            [str(python), "-m", "pip", "install", "--quiet", "--no-input", *requirements],
            check=True,
        )
        freeze = subprocess.run([str(python), "-m", "pip", "freeze"], check=True,
                                capture_output=True, text=True).stdout  # fmt: skip
        (root / "freeze.txt").write_text(freeze)
        done.write_text(f"{time.monotonic() - started:.1f} s\n")
        if log:
            log(f"built venv {root.name} in {time.monotonic() - started:.0f} s")
    return python


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()

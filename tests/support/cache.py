"""Slow test inputs, built once and cached by their inputs under one directory.

``LLAMARACK_TEST_CACHE`` (default ``/var/cache/llamarack``) holds:

    venvs/<name>-<hash>/          virtual environments for test-only tools
    sources/                      the llama-cpp-python sdist and its llama.cpp tree
    tiny-model/<hash>/            tiny real checkpoints (tests/support/tiny_model.py)

A cache entry is complete only once its ``.done`` marker exists; it is built
under a lock, so two test processes never build the same entry at once.
The system python (pyinfra and the tests) stays light: torch, transformers
and friends only ever go into these venvs.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Iterable, Iterator

CACHE = Path(os.environ.get("LLAMARACK_TEST_CACHE", "/var/cache/llamarack"))

# The version whose sdist vendors llama.cpp 0c1e57098 (the settings' pinned commit).
LLAMA_CPP_PYTHON_VERSION = "0.3.36"
LLAMA_CPP_COMMIT = "0c1e57098"

# torch comes from the local wheel of these machines (pip's find-links), never a CUDA build.
TORCH = "torch==2.13.0"

# The tiny-model maker's tools: the versions the vendored converter pins where it pins.
MODEL_TOOLS = (
    TORCH,
    "transformers==4.57.6",
    "sentencepiece>=0.1.98,<0.3.0",
    "tokenizers",
    "safetensors",
    "protobuf>=4.21.0,<5.0.0",
    "numpy~=2.2.6",
)


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


def _log(message: str) -> None:
    print(f"[test cache] {message}", file=sys.stderr, flush=True)


def venv(name: str, requirements: Iterable[str]) -> Path:
    """A venv with ``requirements`` installed, cached by the requirement list; returns its python."""
    requirements = list(requirements)
    root = CACHE / "venvs" / f"{name}-{digest(requirements, sys.version_info[:2])}"
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
        _log(f"building {root.name}: {' '.join(requirements)}")
        subprocess.run([sys.executable, "-m", "venv", str(root)], check=True)
        subprocess.run(
            [str(python), "-m", "pip", "install", "--quiet", "--no-input", *requirements],
            check=True,
        )
        freeze = subprocess.run([str(python), "-m", "pip", "freeze"], check=True,
                                capture_output=True, text=True).stdout  # fmt: skip
        (root / "freeze.txt").write_text(freeze)
        done.write_text(f"{time.monotonic() - started:.1f} s\n")
        _log(f"built {root.name} in {time.monotonic() - started:.0f} s")
    return python


def model_tools_python() -> Path:
    """Python of the tiny-model maker's venv (torch, transformers, sentencepiece...)."""
    return venv("model-tools", MODEL_TOOLS)


def llama_cpp_source() -> Path:
    """The llama.cpp tree vendored by the pinned llama-cpp-python sdist (from PyPI, cached)."""
    sources = CACHE / "sources"
    tree = sources / f"llama.cpp-{LLAMA_CPP_COMMIT}"
    done = tree / ".done"
    if done.exists():
        return tree
    with locked(tree):
        if done.exists():
            return tree
        sdist = sources / f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}.tar.gz"
        if not sdist.exists():
            _log(f"downloading llama-cpp-python {LLAMA_CPP_PYTHON_VERSION} sdist")
            subprocess.run(
                [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                 "--no-binary", ":all:", f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}",
                 "-d", str(sources)],
                check=True,
            )  # fmt: skip
        shutil.rmtree(tree, ignore_errors=True)
        prefix = f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}/vendor/llama.cpp/"
        staging = sources / f".{tree.name}.tmp"
        shutil.rmtree(staging, ignore_errors=True)
        with tarfile.open(sdist) as tar:
            members = [m for m in tar.getmembers() if m.name.startswith(prefix)]
            for m in members:
                m.name = m.name[len(prefix):]
            tar.extractall(staging, members=members, filter="data")
        staging.rename(tree)
        done.write_text(LLAMA_CPP_COMMIT + "\n")
    return tree


def converter_requirements(tree: Path) -> list[str]:
    """The converter's own requirements file, with torch swapped for the local CPU wheel.

    The file pins a torch from the PyTorch CPU index, which these machines cannot
    reach; every other line is kept as written (``-r`` includes are inlined).
    """
    out: list[str] = []

    def read(path: Path) -> None:
        for raw in path.read_text().splitlines():
            line = raw.split("#", 1)[0].strip()
            if not line or line.startswith("--extra-index-url"):
                continue
            if line.startswith("-r"):
                read((path.parent / line[2:].strip()).resolve())
            elif line.split("=")[0].split("<")[0].split(">")[0].split("~")[0].strip() == "torch":
                out.append(TORCH)
            else:
                out.append(line)

    read(tree / "requirements" / "requirements-convert_hf_to_gguf.txt")
    return out


def converter_python(tree: Path) -> Path:
    """Python of a venv made from the converter's requirements file."""
    return venv("convert", converter_requirements(tree))

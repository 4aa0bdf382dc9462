"""Slow test inputs, built once and cached by their inputs under one directory
(the helpers are the lab's: lab/llamarack_lab/cache.py).

``LLAMARACK_TEST_CACHE`` (default ``/var/cache/llamarack``) holds:

    venvs/<name>-<hash>/          virtual environments for test-only tools
    sources/                      the llama-cpp-python sdist and its llama.cpp tree
    tiny-model/<hash>/            tiny real checkpoints (lab/llamarack_lab/tiny_model.py)
    wheels/<hash>/                wheelhouses (lab/llamarack_lab/wheels.py)

A cache entry is complete only once its ``.done`` marker exists; it is built
under a lock, so two test processes never build the same entry at once.
The system python (pyinfra and the tests) stays light: torch, transformers
and friends only ever go into these venvs.
"""

from __future__ import annotations

import os
import shutil
import sys
import tarfile
from pathlib import Path
from typing import Iterable

from llamarack_lab import cache as _cache
from llamarack_lab import mirror
from llamarack_lab.cache import digest, locked  # noqa: F401
from llamarack_lab.tiny_model import MODEL_TOOLS, TORCH  # noqa: F401

CACHE = Path(os.environ.get("LLAMARACK_TEST_CACHE", "/var/cache/llamarack"))

LLAMA_CPP_COMMIT = "0c1e57098"


def _log(message: str) -> None:
    print(f"[test cache] {message}", file=sys.stderr, flush=True)


def venv(name: str, requirements: Iterable[str]) -> Path:
    """A venv with ``requirements`` installed, cached by the requirement list; returns its python."""
    return _cache.venv(CACHE, name, requirements, log=_log)


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
        # Downloaded once and checked against its pinned sha256 (the lab's mirror uses it too).
        sdist = mirror.sdist_path(sources)
        shutil.rmtree(tree, ignore_errors=True)
        prefix = mirror.VENDOR_PREFIX
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

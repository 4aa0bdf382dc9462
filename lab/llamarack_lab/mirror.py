"""A local git mirror of llama.cpp for the lab, made from a PyPI sdist.

The lab cannot reach GitHub, but the PyPI source distribution of
llama-cpp-python vendors a complete llama.cpp tree. We turn that tree into
a git repository with one commit whose author, committer and dates are
fixed, so its sha is the same on every machine: the lab inventory can pin
it like a real commit. The bare repository is served over HTTP ("dumb"
protocol, after ``git update-server-info``) by the lab's file server.

Tests add commits on top (a changed commit, a broken one) with
``add_commit``; those are deterministic too. ``add_named_commit`` names the
branch by a hash of its changes, so a mirror kept in the cache never serves
an older commit under the name of a changed one. ``GOOD_BUMP`` is a second
good commit (a harmless change): what an upgrade test bumps to.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .cache import sha256_file
from .util import LabError

SDIST_NAME = "llama-cpp-python"
SDIST_VERSION = "0.3.36"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
# The submodule HEAD recorded in the sdist (.git/modules/vendor/llama.cpp/HEAD).
UPSTREAM_COMMIT = "0c1e57098bba43ac29e6e3b677cdceebdd22334f"
VENDOR_PREFIX = f"llama_cpp_python-{SDIST_VERSION}/vendor/llama.cpp/"
# What ensure_mirror makes from that sdist, everywhere (fixed identity and dates).
LAB_COMMIT = "dccad28c67854048fcdf644803b3f54e152d99a8"

# Fixed identity and dates: the same tree always gives the same commit sha.
_GIT_ENV = {
    "GIT_AUTHOR_NAME": "llamarack lab",
    "GIT_AUTHOR_EMAIL": "lab@llamarack.invalid",
    "GIT_COMMITTER_NAME": "llamarack lab",
    "GIT_COMMITTER_EMAIL": "lab@llamarack.invalid",
    "GIT_AUTHOR_DATE": "2026-01-01T00:00:00+0000",
    "GIT_COMMITTER_DATE": "2026-01-01T00:00:00+0000",
    "GIT_CONFIG_NOSYSTEM": "1",
    "HOME": "/nonexistent",
}


# A later commit that builds, proves and serves like the base: only its README differs.
GOOD_BUMP = {"README.md": "\nA later commit for the llamarack lab's upgrade tests: it runs like the one before.\n"}


@dataclass(frozen=True)
class Mirror:
    bare: Path
    """The bare repository served to hosts (``<srv>/llama.cpp.git``)."""
    commit: str
    """Full sha of the commit holding the vendored tree."""


def _git(*args, cwd=None, check=True) -> str:
    env = {**os.environ, **_GIT_ENV}
    result = subprocess.run(
        ["git", *args], cwd=cwd, env=env, capture_output=True, text=True, check=False
    )
    if check and result.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} failed: {result.stderr.strip()}")
    return result.stdout.strip()


def sdist_path(cache: Path) -> Path:
    """Download (once) and verify the pinned sdist; return its path."""
    cache.mkdir(parents=True, exist_ok=True)
    path = cache / f"llama_cpp_python-{SDIST_VERSION}.tar.gz"
    if not path.exists() or sha256_file(path) != SDIST_SHA256:
        with tempfile.TemporaryDirectory(dir=cache) as tmp:
            subprocess.run(
                ["python3", "-m", "pip", "download", "--quiet", "--no-deps",
                 "--no-binary", ":all:", f"{SDIST_NAME}=={SDIST_VERSION}", "-d", tmp],
                check=True,
            )  # fmt: skip
            downloaded = Path(tmp) / path.name
            digest = sha256_file(downloaded)
            if digest != SDIST_SHA256:
                raise RuntimeError(
                    f"{path.name}: sha256 {digest}, expected {SDIST_SHA256}; refusing it"
                )
            downloaded.rename(path)
    return path


def ensure_mirror(cache: Path, srv: Path) -> Mirror:
    """Make (once) the bare repository ``<srv>/llama.cpp.git`` from the sdist."""
    bare = srv / "llama.cpp.git"
    if (bare / "info" / "llamarack-base").exists():
        return Mirror(bare, (bare / "info" / "llamarack-base").read_text().strip())

    sdist = sdist_path(cache)
    srv.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=srv) as tmp:
        work = Path(tmp) / "work"
        work.mkdir()
        with tarfile.open(sdist) as tar:
            members = []
            for member in tar.getmembers():
                # The tree's own .git is a submodule link into the sdist's .git: skip it.
                if member.name.startswith(VENDOR_PREFIX) and member.name != VENDOR_PREFIX + ".git":
                    member.name = member.name[len(VENDOR_PREFIX):]
                    members.append(member)
            tar.extractall(work, members=members, filter="tar")
        _git("init", "--quiet", "--initial-branch=main", cwd=work)
        # -f: keep every file of the sdist, even those upstream's .gitignore names.
        _git("add", "--all", "--force", ".", cwd=work)
        _git("commit", "--quiet", "--no-verify", "-m",
             f"llama.cpp {UPSTREAM_COMMIT} as vendored by {SDIST_NAME} {SDIST_VERSION}", cwd=work)  # fmt: skip
        commit = _git("rev-parse", "HEAD", cwd=work)
        if commit != LAB_COMMIT:
            # The lab inventory pins LAB_COMMIT: a different sha means the tree differs.
            raise RuntimeError(f"mirror commit {commit} is not the expected {LAB_COMMIT}")
        staging = Path(tmp) / "llama.cpp.git"
        _git("clone", "--quiet", "--bare", "--no-local", str(work), str(staging))
        _git("update-server-info", cwd=staging)
        (staging / "info" / "llamarack-base").write_text(commit + "\n")
        if bare.exists():
            shutil.rmtree(bare)
        staging.rename(bare)
    return Mirror(bare, commit)


def add_commit(mirror: Mirror, branch: str, message: str, changes: dict) -> str:
    """Commit ``changes`` on top of the base as ``branch``; return its sha.

    ``changes``: {path: text to append} or {path: (old, new)}, a replacement of
    text that must occur exactly once in the file.

    Deterministic like the base commit, so a test can pin it.
    """
    existing = _git("rev-parse", "--verify", "--quiet", f"refs/heads/{branch}", cwd=mirror.bare, check=False)
    if existing:
        return existing
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp) / "work"
        _git("clone", "--quiet", "--shared", "--no-checkout", str(mirror.bare), str(work))
        _git("checkout", "--quiet", "-b", branch, mirror.commit, cwd=work)
        for path, change in changes.items():
            if isinstance(change, tuple):
                old, new = change
                text = (work / path).read_text()
                if text.count(old) != 1:
                    raise LabError(f"{path}: the text to replace occurs {text.count(old)} times, not once")
                (work / path).write_text(text.replace(old, new))
            else:
                with open(work / path, "a") as f:
                    f.write(change)
            _git("add", path, cwd=work)
        _git("commit", "--quiet", "--no-verify", "-m", message, cwd=work)
        _git("push", "--quiet", "origin", f"HEAD:refs/heads/{branch}", cwd=work)
        commit = _git("rev-parse", "HEAD", cwd=work)
    _git("update-server-info", cwd=mirror.bare)
    return commit


def add_named_commit(mirror: Mirror, name: str, message: str, changes: dict) -> str:
    """``add_commit`` on the branch ``<name>-<12 hex of the changes' sha256>``; return its sha."""
    digest = hashlib.sha256(json.dumps(changes, sort_keys=True).encode()).hexdigest()[:12]
    return add_commit(mirror, f"{name}-{digest}", message, changes)

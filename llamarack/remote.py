"""How code that runs on the hosts gets there, and how values get into shell commands.

``command(name, *args)`` runs a role's host module (``roles/<role>/files/<name>.py``,
standard library only) with the host's ``python3 -c``: nothing installed on the host drifts
from the control machine's copy (docs/ARCHITECTURE.md, "The code that runs on a host").
"""

from __future__ import annotations

import shlex
from functools import lru_cache
from pathlib import Path

# The folders whose ``*/files/*.py`` are host modules: the roles add theirs (``add_scripts``).
_FOLDERS: list = []

# A command given to ``sudo sh -c`` is one argv string, which Linux caps at
# 128 KiB (MAX_ARG_STRLEN): every host script must stay well under it.
MAX_SCRIPT_BYTES = 96 * 1024


def add_scripts(folder: Path) -> None:
    """Find host modules in ``folder``'s ``*/files/`` too (the roles' folder adds itself)."""
    if folder not in _FOLDERS:
        _FOLDERS.append(folder)
        path.cache_clear()
        source.cache_clear()


def _found(pattern: str) -> list:
    return sorted(f for folder in _FOLDERS for f in folder.glob(pattern))


def names() -> list[str]:
    """Every host module of every role, by name."""
    return sorted(f.stem for f in _found("*/files/*.py") if f.stem != "__init__")


@lru_cache(maxsize=None)
def path(name: str) -> Path:
    """The file of host module ``name`` (e.g. ``"llamacpp_proof"``), in the ``files/`` of
    the role that runs it; names are unique across the roles."""
    found = [f for f in _found(f"*/files/{name}.py") if name.isidentifier()]
    if len(found) != 1:
        raise FileNotFoundError(f"no host module {name!r} (or more than one) under {_FOLDERS}/*/files")
    return found[0]


@lru_cache(maxsize=None)
def source(name: str) -> str:
    """Host module ``name``'s source, as ``python3 -c`` runs it."""
    text = path(name).read_text()
    if len(text.encode()) > MAX_SCRIPT_BYTES:
        raise ValueError(f"host module {name} is over {MAX_SCRIPT_BYTES} bytes: too long for one command")
    return text


def argv(*words) -> str:
    """The shell command that runs exactly ``words``, each quoted: the one way a command
    line is built from values (settings, facts, paths), which makes an odd one harmless."""
    return " ".join(shlex.quote(str(w)) for w in words)


def command(name: str, *args: str, python: str = "python3", flags: tuple = ()) -> str:
    """The shell command that runs host module ``name`` with ``args`` (each quoted);
    ``flags`` go to the interpreter (``-I -S``: no environment, no site-packages)."""
    return argv(python, *flags, "-c", source(name), *args)

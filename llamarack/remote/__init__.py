"""Code that runs on the hosts, not on the control machine.

Every module here uses the standard library only, imports nothing from
llamarack, and says so in its first line. One mechanism takes it to a host:
``command(name, *args)`` is the shell command that runs the module's source
with the host's ``python3 -c`` (facts and operations alike), so nothing is
installed on the host to drift from the control machine's copy, and a
changed script is what the next run uses. The control machine may import
these modules to share their definitions (the llama-server flag record, for
one), never the other way round.
"""

from __future__ import annotations

import shlex
from functools import lru_cache
from pathlib import Path

HERE = Path(__file__).resolve().parent

# A command given to ``sudo sh -c`` is one argv string, which Linux caps at
# 128 KiB (MAX_ARG_STRLEN): every host script must stay well under it.
MAX_SCRIPT_BYTES = 96 * 1024


def path(name: str) -> Path:
    """The file of host module ``name`` (e.g. ``"llamacpp_proof"``)."""
    file = HERE / f"{name}.py"
    if not file.is_file():
        raise FileNotFoundError(f"no host module {name!r} under {HERE}")
    return file


@lru_cache(maxsize=None)
def source(name: str) -> str:
    """Host module ``name``'s source, as ``python3 -c`` runs it."""
    text = path(name).read_text()
    if len(text.encode()) > MAX_SCRIPT_BYTES:
        raise ValueError(f"host module {name} is over {MAX_SCRIPT_BYTES} bytes: too long for one command")
    return text


def argv(*words) -> str:
    """The shell command that runs exactly ``words``, each quoted: the one way a
    command line is built from values (settings, facts, paths). Values are
    validated for shape as well (``llamarack.settings``); this is what makes an
    odd one harmless."""
    return " ".join(shlex.quote(str(w)) for w in words)


def command(name: str, *args: str, python: str = "python3", flags: tuple = ()) -> str:
    """The shell command that runs host module ``name`` with ``args`` (each quoted);
    ``flags`` go to the interpreter (``-I -S``: no environment, no site-packages)."""
    return argv(python, *flags, "-c", source(name), *args)

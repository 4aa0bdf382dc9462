"""Code that runs on the hosts, not on the control machine.

Every module here uses the standard library only, imports nothing from
llamarack, and says so in its first line; its second line may name the host
modules it includes (``INCLUDES``). One mechanism takes it to a host:
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


# A host module's second line may name host modules it includes ("# Includes: json_text"):
# their sources go first, in that order, so that each module is still one source, run
# alone by ``python3 -c``. An included module defines names, runs nothing and includes nothing.
INCLUDES = "# Includes: "


def _fitting(name: str, text: str) -> str:
    if len(text.encode()) > MAX_SCRIPT_BYTES:
        raise ValueError(f"host module {name} is over {MAX_SCRIPT_BYTES} bytes: too long for one command")
    return text


@lru_cache(maxsize=None)
def own_source(name: str) -> str:
    """Host module ``name``'s own source, what it includes left out."""
    return _fitting(name, path(name).read_text())


@lru_cache(maxsize=None)
def includes(name: str) -> tuple:
    """The host modules that ``name`` includes (its ``# Includes:`` line)."""
    lines = own_source(name).split("\n", 2)
    if len(lines) < 3 or not lines[1].startswith(INCLUDES):
        return ()
    found = tuple(w.strip() for w in lines[1][len(INCLUDES):].split(","))
    if name in found or any(includes(n) for n in found):
        raise ValueError(f"host module {name}: an included module includes nothing ({', '.join(found)})")
    return found


@lru_cache(maxsize=None)
def source(name: str) -> str:
    """Host module ``name``'s source as it runs alone: the modules it includes first, then its own."""
    return _fitting(name, "".join(own_source(n) for n in includes(name)) + own_source(name))


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

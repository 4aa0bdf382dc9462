"""The one way a value gets into a systemd unit file: escaped for what systemd does with it.

A unit file is parsed line by line: a newline in a value starts a new
setting (``[Service]`` then ``ExecStartPre=+...`` runs as root), a trailing
backslash joins the next line, ``%`` starts a specifier (``%h`` is a home
directory), and ``ExecStart=`` splits words on spaces, unquotes ``"..."``
and ``'...'``, undoes C escapes, and replaces ``$NAME`` from the
environment (``$$`` is one ``$``). Values come from settings, facts and
model files (a GGUF's ``general.architecture``), so each kind of line gets
its own function here, and the template writes nothing else.

See systemd.syntax(7), systemd.unit(5) "Specifiers" and systemd.service(5)
"Command lines".
"""

from __future__ import annotations

import re
from typing import Sequence

# Words ExecStart= takes as they are (no quoting, no escape, no expansion).
_PLAIN_WORD = re.compile(r"[A-Za-z0-9_+=:,./@-]+")
# The executable of ExecStart=: an absolute path systemd accepts (it refuses
# "special characters" there, and a leading @ - : + ! changes how it runs).
_EXECUTABLE = re.compile(r"/[A-Za-z0-9_+.,/-]+")


class UnitValueError(ValueError):
    """A value that cannot be written into a unit file as it is."""


def _control(value: str) -> bool:
    return any(ord(c) < 0x20 or ord(c) == 0x7F for c in value)


def text(value: str) -> str:
    """Free text that systemd only shows (``Description=``): every control
    character and backslash spelled visibly as ``\\xNN``, ``%`` doubled,
    outer spaces dropped (systemd would drop them too)."""
    shown = "".join(f"\\x{ord(c):02x}" if _control(c) or c == "\\" else c for c in value)
    return shown.strip().replace("%", "%%")


def value(setting: str, value: str) -> str:
    """A value systemd must read back exactly (``User=``, ``WorkingDirectory=``):
    one line, no outer spaces, ``%`` doubled. Raises UnitValueError otherwise."""
    if _control(value) or value != value.strip() or not value or value.endswith("\\"):
        raise UnitValueError(f"{setting}={value!r} cannot be written into a unit file: "
                             "it must be one line, not empty, without outer spaces or a trailing \\")  # fmt: skip
    return value.replace("%", "%%")


def comment(line: str) -> str:
    """A comment line (``# ...``), checked to stay one line."""
    if _control(line) or line.endswith("\\") or not line.startswith("#"):
        raise UnitValueError(f"{line!r} cannot be written into a unit file as one comment line")
    return line


def exec_word(word: str) -> str:
    """One argument of ``ExecStart=`` (not the executable), so that systemd's
    splitting, unescaping, specifiers and ``$`` expansion give back ``word``."""
    if _control(word):
        raise UnitValueError(f"ExecStart argument {word!r}: a control character (newline, tab...) "
                             "has no place in llama-server's command line")  # fmt: skip
    if _PLAIN_WORD.fullmatch(word):
        return word
    escaped = word.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%").replace("$", "$$")
    return f'"{escaped}"'


def exec_line(argv: Sequence[str]) -> str:
    """The value of ``ExecStart=`` that runs ``argv`` exactly."""
    if not argv or not _EXECUTABLE.fullmatch(argv[0]) or "/../" in argv[0] + "/":
        raise UnitValueError(f"ExecStart executable {argv[0] if argv else None!r}: an absolute path "
                             "of letters, digits and _ + . , - is what systemd runs")  # fmt: skip
    return " ".join([argv[0], *(exec_word(a) for a in argv[1:])])

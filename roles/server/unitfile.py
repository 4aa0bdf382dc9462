"""The one way a value gets into a systemd unit file: escaped for what systemd does with it.

A unit file is parsed line by line: a newline starts a new setting, a trailing backslash
joins the next line, ``%`` starts a specifier, and ``ExecStart=`` splits, unquotes, unescapes
and expands ``$NAME``. Each kind of line gets its own function here, and the template writes
nothing else (docs/ARCHITECTURE.md, "Untrusted values"; systemd.syntax(7), systemd.unit(5)
"Specifiers", systemd.service(5) "Command lines").
"""

from __future__ import annotations

import itertools
import re
from typing import Sequence

# Words ExecStart= takes as they are (no quoting, no escape, no expansion).
_PLAIN_WORD = re.compile(r"[A-Za-z0-9_+=:,./@-]+")
# The executable of ExecStart=: an absolute path systemd accepts (it refuses
# "special characters" there, and a leading @ - : + ! changes how it runs).
_EXECUTABLE = re.compile(r"/[A-Za-z0-9_+.,/-]+")


class UnitValueError(ValueError):
    """A value that cannot be written into a unit file as it is."""


# What ends a line for someone: the C0 controls (newline, and the \v \f \x1c-\x1e Python's
# str.splitlines splits on), DEL, the C1 controls (\x85, NEL) and the line and paragraph
# separators. systemd splits a unit only on \n, but a reader that splits on more would see
# another line (a second ExecStart=) where systemd sees one.
_LINE_BREAKING = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
# The longest free text written (``Description=``): a GGUF's metadata is the model file's own
# text, and systemd refuses a line of a megabyte ("No buffer space available").
TEXT_MAX = 512


def _spelled(c: str) -> str:
    if not (_LINE_BREAKING.match(c) or c == "\\"):
        return c
    return f"\\x{ord(c):02x}" if ord(c) <= 0xFF else f"\\u{ord(c):04x}"


def text(value: str, limit: int = TEXT_MAX) -> str:
    """Free text that systemd only shows (``Description=``): every control character
    (``_LINE_BREAKING``) and backslash spelled visibly as ``\\xNN`` (``\\uNNNN`` past
    \\xff), ``%`` doubled, outer spaces dropped (systemd would drop them too), and
    at most ``limit`` characters before doubling: a longer text is cut, ending in ``...``."""
    pieces = [_spelled(c) for c in value[: limit + 1]]  # each character is spelled in one or more
    if sum(map(len, pieces)) > limit:
        cut = next(n for n, size in enumerate(itertools.accumulate(map(len, pieces))) if size > limit - 3)
        pieces = pieces[:cut] + ["..."]
    return "".join(pieces).strip().replace("%", "%%")


def clipped(value: str, limit: int) -> str:
    """``value``, cut to ``limit`` characters with ``...`` when longer (a model file's
    name for something, where a unit line shows it)."""
    return value if len(value) <= limit else value[: limit - 3] + "..."


def value(setting: str, value: str) -> str:
    """A value systemd must read back exactly (``User=``, ``WorkingDirectory=``):
    one line, no outer spaces, ``%`` doubled. Raises UnitValueError otherwise."""
    if _LINE_BREAKING.search(value) or value != value.strip() or not value or value.endswith("\\"):
        raise UnitValueError(f"{setting}={value!r} cannot be written into a unit file: "
                             "it must be one line, not empty, without outer spaces or a trailing \\")  # fmt: skip
    return value.replace("%", "%%")


def comment(line: str) -> str:
    """A comment line (``# ...``), checked to stay one line."""
    if _LINE_BREAKING.search(line) or line.endswith("\\") or not line.startswith("#"):
        raise UnitValueError(f"{line!r} cannot be written into a unit file as one comment line")
    return line


def exec_word(word: str) -> str:
    """One argument of ``ExecStart=`` (not the executable), so that systemd's
    splitting, unescaping, specifiers and ``$`` expansion give back ``word``."""
    if _LINE_BREAKING.search(word):
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

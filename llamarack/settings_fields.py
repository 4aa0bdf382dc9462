"""What every settings section is made of: ``setting`` fields, the ``Section`` base,
and the value checks more than one section uses.

A section (``llamarack/settings.py``'s general one, each ``roles/<role>/settings.py``)
imports from here and from nothing else of llamarack, so the loader can import
every section without a cycle.

A check returns None when the value is fine, else a phrase saying what is
allowed ("a positive integer"); the loader puts it in the error.
"""

from __future__ import annotations

import re
import urllib.parse
from dataclasses import field
from typing import Any, Callable, ClassVar, Optional


def setting(default: Any, doc: str, check: Optional[Callable[[Any], Optional[str]]] = None,
            choices: Optional[tuple] = None):  # fmt: skip
    """A settings field: its default, a one-line meaning and an optional value check.

    ``check`` returns None when the value is fine, else a phrase saying what is
    allowed ("a positive integer"). It is applied to every element of a tuple.
    ``choices`` restricts a value to a fixed set beyond what a Literal type says.
    """
    return field(default=default, metadata={"doc": doc, "check": check, "choices": choices})


class Section:
    """One section of a host's settings: a frozen dataclass of ``setting`` fields whose
    host-data keys are ``<prefix>_<field name>``."""

    prefix: ClassVar[str]

    def problems(self) -> list[str]:
        """Problems that involve more than one of the section's settings (none here)."""
        return []


def dotted_version(value: str) -> Optional[str]:
    if not re.fullmatch(r"\d+(\.\d+)*", value):
        return "a dotted numeric version such as 520.61.05"
    return None


def git_revision(value: str) -> Optional[str]:
    if not re.fullmatch(r"[0-9a-f]{7,40}", value):
        return "a commit sha (7 to 40 lowercase hex digits); branches move, so they are not pins"
    return None


def sha256_hex(value: str) -> Optional[str]:
    if not re.fullmatch(r"[0-9a-f]{64}", value):
        return "a sha256 hex digest (64 lowercase hex digits)"
    return None


# Shapes of the values that reach a host: every one is quoted where it is used
# (``llamarack.remote.argv``), and refused here when it is no such thing, so a
# typo or a pasted command never gets as far as a quoting rule.

# One component of a host path: letters, digits, and . _ + - (no leading -; . and .. are
# refused where it is used).
PATH_PART = r"[A-Za-z0-9_+.][A-Za-z0-9._+-]*"


def host_path(value: str) -> Optional[str]:
    """An absolute, normalized path on a host, spelled in characters that need
    no quoting in a shell, a unit file or a systemd specifier."""
    parts = value.split("/")
    if (not value.startswith("/") or value == "/" or value.endswith("/")
            or not all(re.fullmatch(PATH_PART, part) for part in parts[1:])
            or any(part in (".", "..") for part in parts)):  # fmt: skip
        return ("an absolute path other than /, of names made of letters, digits, . _ + - "
                "(no spaces, no .., no trailing /), e.g. /opt/llamarack")
    return None


def control_file(value: str) -> Optional[str]:
    # A file on the control machine: opened there, never put in a command.
    if not value.strip() or value != value.strip():
        return "a file name on the control machine (not empty, no leading or trailing space)"
    return None


# Characters a shell, a unit file or a URL parser treat specially, never part of an
# address llamarack fetches from (percent-escapes such as %20 are allowed).
URL_FORBIDDEN = frozenset(" \t'\"`$;|&<>(){}\\!*^")


def remote_url(value: str) -> Optional[str]:
    """An http(s) URL of a server the hosts download from."""
    allowed = "an http:// or https:// URL of a server, without spaces or shell characters (' \" ` $ ; | & < > ( ) { } \\ ! * ^)"
    if not re.fullmatch(r"https?://[^/?#]+(?:[/?#]\S*)?", value) or set(value) & URL_FORBIDDEN:
        return allowed
    try:
        parts = urllib.parse.urlsplit(value)
        parts.port  # noqa: B018 - raises on a port that is no number
    except ValueError:
        return allowed
    if not parts.hostname or not re.fullmatch(r"[A-Za-z0-9.-]+|[0-9a-fA-F:.]+", parts.hostname) \
            or parts.hostname.startswith(("-", ".")):  # fmt: skip
        return allowed
    if "%" in value and not re.fullmatch(r"(%[0-9A-Fa-f]{2}|[^%])*", value):
        return allowed + "; % only as an escape such as %20"
    return None


def conda_channel_name(value: str) -> Optional[str]:
    if re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)*", value) and ".." not in value:
        return None
    if value.startswith(("http://", "https://")) and not remote_url(value):
        return None
    return "a conda channel name (conda-forge, nvidia/label/cuda-11.8.0) or an http(s) URL of one"


def positive(value: int) -> Optional[str]:
    if value <= 0:
        return "a positive integer"
    return None


def non_negative(value: int) -> Optional[str]:
    if value < 0:
        return "0 or a positive integer"
    return None

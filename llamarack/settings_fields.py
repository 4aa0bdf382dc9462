"""What every settings section is made of: ``setting`` fields, the ``Section`` base,
and the value checks more than one section uses.

A section imports from here and from nothing else of llamarack, so the loader
can import every section without a cycle.
"""

from __future__ import annotations

import ipaddress
import re
import urllib.parse
from dataclasses import field
from typing import Any, Callable, ClassVar, Optional


def setting(default: Any, doc: str, check: Optional[Callable[[Any], Optional[str]]] = None,
            choices: Optional[tuple] = None, between: Optional[tuple] = None,
            formerly: Optional[dict] = None):  # fmt: skip
    """A settings field: its default, a one-line meaning and an optional value check.

    ``check`` returns None when the value is fine, else a phrase saying what is
    allowed ("a dotted numeric version"), which the loader puts in the error; it is
    applied to every element of a tuple. ``choices`` restricts a value to a fixed set
    beyond what a Literal type says. ``between`` is the (lowest, highest) value of a
    number, both included: every int and float setting has one, so no absurd count,
    size or time reaches a host. ``formerly`` maps the values an earlier llamarack took
    to those they are now (a switch that became a choice: {True: "on", False: "off"}),
    so an inventory written for it still loads, meaning what it meant."""
    return field(default=default, metadata={"doc": doc, "check": check, "choices": choices, "between": between,
                                            "formerly": tuple(formerly.items()) if formerly else None})  # fmt: skip


def number_range(between: tuple, integer: bool) -> str:
    """What a number setting allows: "an integer from 1 to 65535"."""
    low, high = (f"{n:g}" if isinstance(n, float) else str(n) for n in between)
    return f"{'an integer' if integer else 'a number'} from {low} to {high}"


def out_of_range(value: Any, between: tuple, integer: bool) -> Optional[str]:
    """None when ``value`` lies in ``between``, else what is allowed (NaN compares false
    with everything, so it is refused as the infinities are)."""
    return None if between[0] <= value <= between[1] else number_range(between, integer)


class Section:
    """One section of a host's settings: a frozen dataclass of ``setting`` fields whose
    host-data keys are ``<prefix>_<field name>``."""

    prefix: ClassVar[str]

    def problems(self) -> list[str]:
        """Problems that involve more than one of the section's settings."""
        return []


def _matching(pattern: str, allowed: str) -> Callable[[str], Optional[str]]:
    """A check that passes a value ``pattern`` matches whole and answers ``allowed`` to any other."""
    return lambda value: None if re.fullmatch(pattern, value) else allowed


dotted_version = _matching(r"\d+(\.\d+)*", "a dotted numeric version such as 520.61.05")
git_revision = _matching(r"[0-9a-f]{7,40}",
                         "a commit sha (7 to 40 lowercase hex digits); branches move, so they are not pins")
sha256_hex = _matching(r"[0-9a-f]{64}", "a sha256 hex digest (64 lowercase hex digits)")


# Shapes of the values that reach a host: every one is quoted where it is used
# (``llamarack.remote.argv``), and refused here when it is no such thing, so a
# typo or a pasted command never gets as far as a quoting rule.

# One component of a host path: letters, digits, and . _ + - (no leading -; . and .. are
# refused where it is used).
PATH_PART = r"[A-Za-z0-9_+.][A-Za-z0-9._+-]*"


# Longest host path, and longest name in one, a setting may give (Linux's NAME_MAX is 255;
# a root leaves room for what llamarack builds under it, well within PATH_MAX).
PATH_MAX_CHARS = 1024
NAME_MAX_CHARS = 255


def host_path(value: str) -> Optional[str]:
    """An absolute, normalized path on a host, spelled in characters that need
    no quoting in a shell, a unit file or a systemd specifier. Where it is a
    directory root runs or builds from, the loader also refuses one under a
    directory other users can write to (``SHARED_DIRS``)."""
    parts = value.split("/")
    if len(value) > PATH_MAX_CHARS or any(len(part) > NAME_MAX_CHARS for part in parts):
        return (f"an absolute path of at most {PATH_MAX_CHARS} characters, each name at most "
                f"{NAME_MAX_CHARS} (given {len(value)} characters)")
    if (not value.startswith("/") or value == "/" or value.endswith("/")
            or not all(re.fullmatch(PATH_PART, part) for part in parts[1:])
            or any(part in (".", "..") for part in parts)):  # fmt: skip
        return ("an absolute path other than /, of names made of letters, digits, . _ + - "
                "(no spaces, no .., no trailing /), e.g. /opt/llamarack")
    return None


# Directories every local user may write to (sticky or not), and the trees of users' own
# files: a user can make or replace a path under one before root runs what is there.
SHARED_DIRS = ("/tmp", "/var/tmp", "/dev/shm", "/run/shm", "/run/lock", "/var/lock", "/dev/mqueue",
               "/var/crash", "/var/mail", "/var/spool/mail", "/home", "/run/user")  # fmt: skip


def under(path: str, dirs: tuple) -> Optional[str]:
    """The directory of ``dirs`` that ``path`` is (or is under), else None."""
    return next((d for d in dirs if path == d or path.startswith(d + "/")), None)


def control_file(value: str) -> Optional[str]:
    # A file on the control machine: opened there, never put in a command.
    if not value.strip() or value != value.strip():
        return "a file name on the control machine (not empty, no leading or trailing space)"
    return None


# Characters a shell, a unit file or a URL parser treat specially, never part of an
# address llamarack fetches from (percent-escapes such as %20 are allowed).
URL_FORBIDDEN = frozenset(" \t'\"`$;|&<>(){}\\!*^")


# A server's name where a URL or a git address names it: DNS labels of letters, digits,
# - and _ (none begins or ends with - or .), never an option (-oProxyCommand), nor user@.
HOST_NAME = r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?(?:\.[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?)*"
URL_MAX_CHARS = 2048


def server_name(value: str) -> bool:
    """Whether ``value`` is a host name (``HOST_NAME``, at most 253 characters) or an IP
    address without a %scope."""
    if len(value) <= 253 and re.fullmatch(HOST_NAME, value):
        return True
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return False
    return "%" not in value


def listen_address(value: str) -> Optional[str]:
    """An IP address a server listens on (llama-server, the gateway's frontend)."""
    # An IPv6 %scope is no part of it: "::1%$(id)" parses as an address of scope "$(id)".
    try:
        ipaddress.ip_address(value)
        if "%" not in value:
            return None
    except ValueError:
        pass
    return ("an IP address to listen on: 127.0.0.1 (this host only), 0.0.0.0 (every IPv4 interface), :: "
            "or one interface's address (no %scope)")


def remote_url(value: str) -> Optional[str]:
    """An http(s) URL of a server the hosts download from, with no credentials in it.
    Plain http:// is refused later, unless the network is trusted (``llamarack.settings``)."""
    allowed = "an http:// or https:// URL of a server, without spaces or shell characters (' \" ` $ ; | & < > ( ) { } \\ ! * ^)"
    if len(value) > URL_MAX_CHARS:
        return f"an http:// or https:// URL of at most {URL_MAX_CHARS} characters"
    if not value.isascii():
        odd = next(c for c in value if not c.isascii())
        return (f"an http:// or https:// URL of ASCII characters only ({odd!r} is not): a path's characters "
                f"percent-encoded as UTF-8 ({urllib.parse.quote(odd)}), a host name in its xn-- form")
    if not re.fullmatch(r"https?://[^/?#]+(?:[/?#]\S*)?", value) or set(value) & URL_FORBIDDEN:
        return allowed
    try:
        parts = urllib.parse.urlsplit(value)
        parts.port  # noqa: B018 - raises on a port that is no number
    except ValueError:
        return allowed
    if "@" in parts.netloc:
        return ("an http:// or https:// URL with nothing before its host: user@ or user:pass@ there is "
                "refused (https://huggingface.co@evil.example is a URL of evil.example, and the token "
                "would go there); a hub token belongs in model_hf_token_file")
    if not parts.hostname or not server_name(parts.hostname):
        return allowed + "; the server a host name or an IP address (no option such as -oProxyCommand)"
    if "%" in value and not re.fullmatch(r"(%[0-9A-Fa-f]{2}|[^%])*", value):
        return allowed + "; % only as an escape such as %20"
    return None


def loopback_url(url: str) -> bool:
    """Whether ``url``'s server is this host's loopback (localhost, 127.0.0.0/8, ::1):
    what is sent there never crosses a network."""
    host = urllib.parse.urlsplit(url).hostname or ""
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def conda_channel_name(value: str) -> Optional[str]:
    if re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)*", value) and ".." not in value:
        return None
    if value.startswith(("http://", "https://")):
        return remote_url(value)
    return "a conda channel name (conda-forge, nvidia/label/cuda-11.8.0) or an http(s) URL of one"

"""Facts about llama.cpp on a host: source checkout, builds, the built server's flags."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from typing import Optional

from pyinfra.api import FactBase
from pyinfra.api.exceptions import FactProcessError


class GitHead(FactBase[Optional[str]]):
    """
    Returns the full sha checked out in a git work tree, or None when there is
    no repository there (or no commit checked out).

    .. code:: python

        "dccad28c67854048fcdf644803b3f54e152d99a8"
    """

    def command(self, path: str) -> str:
        return f"git -C {shlex.quote(path)} rev-parse --verify --quiet HEAD 2>/dev/null || true"

    def process(self, output) -> Optional[str]:
        text = "\n".join(output).strip()
        if not text:
            return None
        if not re.fullmatch(r"[0-9a-f]{40}", text):
            raise FactProcessError(f"unexpected git rev-parse output: {text!r}")
        return text


@dataclass(frozen=True)
class Builds:
    current: Optional[str]
    """The stamp ``builds/current`` points to, None when there is none."""
    verified: dict
    """``{stamp: unix time of verification}`` for every build that passed its checks."""
    partial: tuple = ()
    """Build directories without a record: failed or interrupted builds."""

    def newest_first(self) -> list[str]:
        return sorted(self.verified, key=lambda s: (self.verified[s], s), reverse=True)


class LlamacppBuilds(FactBase[Builds]):
    """
    Returns the verified llama.cpp builds under ``<root>/builds`` and the one
    ``current`` points to. A build counts only once its ``build-info.json``
    exists: the build step writes it last, after verification, so a failed
    or interrupted build is never taken for a good one.

    .. code:: python

        Builds(current="3f1c0a9e52d7b6e4", verified={"3f1c0a9e52d7b6e4": 1764441600},
               partial=("9d0e4b1c2a3f5e6d",))
    """

    def command(self, root: str) -> str:
        builds = shlex.quote(f"{root}/builds")
        return (
            f"cd {builds} 2>/dev/null || exit 0; "
            'echo "current $(readlink current 2>/dev/null)"; '
            'for d in */; do d=${d%/}; [ "$d" = current ] && continue; '
            'if [ -f "$d/build-info.json" ]; then echo "verified $d $(stat -c %Y "$d/build-info.json")"; '
            'else echo "partial $d"; fi; done; true'
        )

    def default(self) -> Builds:
        return Builds(None, {})

    def process(self, output) -> Builds:
        current = None
        verified = {}
        partial = []
        for line in output:
            words = line.split()
            if words[:1] == ["current"]:
                current = words[1] if len(words) > 1 else None
            elif words[:1] == ["verified"] and len(words) == 3 and words[2].isdigit():
                verified[words[1]] = int(words[2])
            elif words[:1] == ["partial"] and len(words) == 2:
                partial.append(words[1])
            else:
                raise FactProcessError(f"unexpected builds line: {line!r}")
        return Builds(current, verified, tuple(partial))


@dataclass(frozen=True)
class ServerFlags:
    """How the built ``llama-server`` spells the options the unit needs.

    Flags change between llama.cpp versions and a wrong one stops the server
    (``error: invalid argument: --no-mmap``), so the unit is written from
    what the built binary's ``--help`` says, not from a version table.
    """

    mmap_off: tuple
    """Arguments that turn mmap off: ``("--no-mmap",)`` or ``("--load-mode", "none")``."""
    flash_attn_takes_value: bool
    """``--flash-attn on|off|auto`` (True) or a bare switch (False)."""
    has_api_key_file: bool
    has_metrics: bool

    def flash_attn(self, on: bool) -> tuple:
        if self.flash_attn_takes_value:
            return ("--flash-attn", "on" if on else "off")
        return ("--flash-attn",) if on else ()


def parse_server_help(text: str) -> ServerFlags:
    """Read ``llama-server --help`` into a ServerFlags record."""
    if "--load-mode" in text:
        mmap_off: tuple = ("--load-mode", "none")
    elif "--no-mmap" in text:
        mmap_off = ("--no-mmap",)
    else:
        raise ValueError("llama-server --help names neither --load-mode nor --no-mmap")
    fa = re.search(r"--flash-attn( \[?[A-Za-z|]+\]?| FA)?", text)
    if not fa:
        raise ValueError("llama-server --help does not name --flash-attn")
    return ServerFlags(
        mmap_off=mmap_off,
        flash_attn_takes_value=bool(fa.group(1)),
        has_api_key_file="--api-key-file" in text,
        has_metrics="--metrics" in text,
    )


class LlamaServerFlags(FactBase[Optional[ServerFlags]]):
    """
    Returns the flags record of the current build, read from the
    ``llama-server --help`` output saved next to it at build time; None
    when there is no current build.
    """

    def command(self, root: str) -> str:
        return f"cat {shlex.quote(f'{root}/builds/current/server-help.txt')} 2>/dev/null || true"

    def process(self, output) -> Optional[ServerFlags]:
        text = "\n".join(output)
        if not text.strip():
            return None
        try:
            return parse_server_help(text)
        except ValueError as e:
            raise FactProcessError(str(e)) from e

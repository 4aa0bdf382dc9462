"""Facts about apt: the deb822 sources."""

from __future__ import annotations

from pyinfra.api import FactBase
from pyinfra.api.exceptions import FactProcessError

from llamarack import remote


class DebianSources(FactBase[tuple]):
    """Returns the stanzas of the host's deb822 ``/etc/apt/sources.list.d/debian.sources``
    (Debian 12's default), each a dict of its fields; ``()`` when the file is absent."""

    def command(self, path: str = "/etc/apt/sources.list.d/debian.sources") -> str:
        return f"cat {remote.argv(path)} 2>/dev/null || true"

    def default(self) -> tuple:
        return ()

    def process(self, output) -> tuple:
        stanzas: list[dict] = []
        current: dict = {}
        key = None
        for line in [*output, ""]:
            if not line.strip():
                if current:
                    stanzas.append(current)
                current, key = {}, None
            elif line.startswith("#"):
                continue
            elif line[0] in " \t":
                if key is None:
                    raise FactProcessError(f"deb822 continuation without a field: {line!r}")
                current[key] += "\n" + line.strip()
            else:
                key, sep, value = line.partition(":")
                if not sep:
                    raise FactProcessError(f"unexpected deb822 line: {line!r}")
                current[key.strip()] = value.strip()
        return tuple(stanzas)

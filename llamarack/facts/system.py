"""The free disk space, which preflight, the model role and the audit read."""

from __future__ import annotations

import shlex

from pyinfra.api import FactBase
from pyinfra.api.exceptions import FactProcessError


class FreeDiskBytes(FactBase[int]):
    """Returns the bytes free for an unprivileged writer on the filesystem that
    holds ``path``, or would hold it once created (the nearest existing parent
    is measured): its available blocks times its block size, as ``statvfs``
    gives them (``stat -f``; ``df`` rounds to KiB)."""

    def command(self, path: str) -> str:
        return (f"p={shlex.quote(path)}; "
                # a dirname that fails (none on the PATH) ends the loop instead of spinning on ""
                'while [ ! -e "$p" ]; do p=$(dirname "$p") || break; done; stat -f -c "%a %S" "$p"')

    def process(self, output) -> int:
        fields = output[-1].split() if output else []
        try:
            available, block = (int(f) for f in fields)
        except ValueError as e:
            raise FactProcessError(f"unexpected stat -f output: {output!r}") from e
        return available * block

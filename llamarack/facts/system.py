"""Facts about the host itself that the stock pyinfra facts do not cover."""

from __future__ import annotations

import shlex

from pyinfra.api import FactBase
from pyinfra.api.exceptions import FactProcessError


class FreeDiskBytes(FactBase[int]):
    """
    Returns the bytes free for an unprivileged writer on the filesystem that
    holds ``path``, or would hold it once created (the nearest existing parent
    is measured).

    .. code:: python

        53687091200
    """

    def command(self, path: str) -> str:
        return (
            f"p={shlex.quote(path)}; "
            'while [ ! -e "$p" ]; do p=$(dirname "$p"); done; df -Pk "$p" | tail -n 1'
        )

    def process(self, output) -> int:
        fields = output[-1].split() if output else []
        try:
            return int(fields[3]) * 1024
        except (IndexError, ValueError) as e:
            raise FactProcessError(f"unexpected df output: {output!r}") from e

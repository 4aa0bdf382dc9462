"""llamarack's own pyinfra operations (generators, in pyinfra's style)."""

from __future__ import annotations

import shlex

from pyinfra.api import StringCommand, operation


@operation(is_idempotent=False)
def refuse(reason: str):
    """
    Stop this host: print why on stderr and fail, before anything is changed.

    + reason: the message, naming the host, what was found, what is needed and the fix

    pyinfra then drops the host from the run; the other hosts go on.
    """
    yield StringCommand(f"printf '%s\\n' {shlex.quote(reason)} >&2; exit 1")

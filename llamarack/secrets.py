"""Secrets on the control machine: the hub token and the server's API key, each read from a file.

A secret is read here, sent to a host only as an uploaded file
(``llamarack.operations.secret_upload``), and never printed, logged or put
on a command line.
"""

from __future__ import annotations

import os
import stat
from typing import Optional

from .errors import ModelSourceError


def read_token(path: Optional[str], setting: str = "model_hf_token_file") -> Optional[str]:
    """The secret in file ``path`` (named by ``setting`` in errors). A file that its
    group or others may read is refused: the secret is already out there."""
    if not path:
        return None
    try:
        with open(path) as f:
            # Checked on the file opened, so a swapped path cannot pass the check.
            mode = stat.S_IMODE(os.fstat(f.fileno()).st_mode)
            if mode & 0o077:
                raise ModelSourceError(f"{setting}: {path} has mode {mode:04o}: others on this machine may read the "
                                       f"secret; allowed: mode 600 or 400 (the owner only); the fix: chmod 600 {path}")
            token = f.read().strip()
    except OSError as e:
        raise ModelSourceError(f"{setting}: cannot read {path}: {e.strerror}") from None
    if not token:
        raise ModelSourceError(f"{setting}: {path} is empty")
    return token

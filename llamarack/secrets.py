"""Secrets on the control machine: the hub token and the server's API key, each read from a file.

A secret is read here, sent to a host only as an uploaded file
(``llamarack.operations.secret_upload``), and never printed, logged or put
on a command line.
"""

from __future__ import annotations

from typing import Optional

from .errors import ModelSourceError


def read_token(path: Optional[str], setting: str = "model_hf_token_file") -> Optional[str]:
    """A secret (the hub token, the server's API key) from a file on the control
    machine, named by ``setting`` in errors; never printed or logged."""
    if not path:
        return None
    try:
        with open(path) as f:
            token = f.read().strip()
    except OSError as e:
        raise ModelSourceError(f"{setting}: cannot read {path}: {e.strerror}") from None
    if not token:
        raise ModelSourceError(f"{setting}: {path} is empty")
    return token

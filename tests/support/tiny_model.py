"""The tiny real Llama checkpoint (lab/llamarack_lab/tiny_model.py), in the test cache.

    from tests.support.tiny_model import tiny_model
    path = tiny_model()     # a directory: config.json, model.safetensors, tokenizer.model, ...
"""

from __future__ import annotations

from pathlib import Path

from llamarack_lab import tiny_model as _tiny
from llamarack_lab.tiny_model import PARAMS, TINY_MODEL_REVISION  # noqa: F401

from .cache import CACHE, _log


def tiny_model(**overrides) -> Path:
    """The checkpoint directory (built on first use, then reused)."""
    return _tiny.tiny_model(CACHE, log=_log, **overrides)

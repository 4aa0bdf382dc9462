"""Where the lab keeps things.

The state dir holds everything of a running rack (host overlays, keys,
rack.json, inventory) on a tmpfs the lab mounts itself: the disk is slow
for many small files and /run here is not a tmpfs. The tmpfs may have 75% of
the machine's memory: a rack bigger than that holds (16 converged hosts are
about 30 GB) keeps its state on disk instead, with ``LLAMARACK_LAB_TMPFS=0``
and ``LLAMARACK_LAB_DIR`` a directory there. The cache dir is on persistent
disk and keeps the packed image and the shared ccache.
"""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_STATE_DIR = "/run/llamarack-lab"
DEFAULT_CACHE_DIR = "/var/cache/llamarack/lab"
# One llama.cpp compile shared by all hosts: bound read-write into guests.
CCACHE_DIR = Path("/var/cache/llamarack/ccache")
GUEST_CCACHE_DIR = "/var/cache/llamarack-ccache"


def state_dir() -> Path:
    return Path(os.environ.get("LLAMARACK_LAB_DIR", DEFAULT_STATE_DIR))


def state_on_tmpfs() -> bool:
    """False with ``LLAMARACK_LAB_TMPFS=0``: the state dir is used where it is, on its own filesystem."""
    return os.environ.get("LLAMARACK_LAB_TMPFS", "1") != "0"


def cache_dir() -> Path:
    return Path(os.environ.get("LLAMARACK_LAB_CACHE", DEFAULT_CACHE_DIR))

"""python -m llamarack: the llamarack command."""

from .entry import entry

entry()

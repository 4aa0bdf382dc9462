"""The read store and the facts several roles share.

Each role's own facts are in its folder (``roles/<role>/reads.py``); here are
the store every role reads through (``read``, ``read_together``: one remote
command for many facts) and the host facts no one role owns. OS release comes
from pyinfra's own ``server.LinuxDistribution``.
"""

from .ownership import PathOwners
from .packages import DebianSources
from .reading import FactRead, read, read_together
from .system import FreeDiskBytes

__all__ = ["DebianSources", "FactRead", "FreeDiskBytes", "PathOwners", "read", "read_together"]

"""The read store every role reads through and the host facts no one role owns.

Each role's own facts are in ``roles/<role>/reads.py``; OS release comes from
pyinfra's own ``server.LinuxDistribution``.
"""

from .ownership import PathOwners
from .packages import DebianSources
from .reading import FactRead, read, read_together
from .system import FreeDiskBytes

__all__ = ["DebianSources", "FactRead", "FreeDiskBytes", "PathOwners", "read", "read_together"]

"""Who owns the directories root runs or builds from, and every directory above them,
which preflight reads before anything on a host is touched (``rules.rule_dirs_private``)."""

from __future__ import annotations

from dataclasses import dataclass

from pyinfra.api import FactBase
from pyinfra.api.exceptions import FactProcessError

from .. import remote
from .value import FactValue


@dataclass(frozen=True)
class DirOwner(FactValue):
    """One existing directory (or file) as ``stat`` gives it: uid, owner name, and
    permission bits in octal as ``stat -c %a`` prints them ("755", "1777")."""

    path: str
    uid: int
    owner: str
    mode: str

    def writable_by_others(self) -> bool:
        """Whether its group or every user may write to it (the sticky bit stops no one
        from making a new name in it, so it counts as writable)."""
        return bool(int(self.mode, 8) & 0o022)


@dataclass(frozen=True)
class PathChain(FactValue):
    """One path asked about: as given, with links resolved, and each existing directory
    from it (or its nearest existing parent) up to /."""

    path: str
    resolved: str
    dirs: tuple[DirOwner, ...]


@dataclass(frozen=True)
class PathOwnership(FactValue):
    """The deploying user (``SUDO_UID`` under sudo, else the login's uid) and each path's chain."""

    deployer_uid: int
    paths: tuple[PathChain, ...]


class PathOwners(FactBase[PathOwnership]):
    """Returns the owner and mode of each path and of every existing directory above it,
    links resolved (``readlink -m``: a link into /tmp is judged where it leads), and the
    uid of the user who deploys (``SUDO_UID`` under sudo)."""

    def command(self, paths: tuple) -> str:
        walk = (f"for p in {remote.argv(*paths)}; do "
                'r=$(readlink -m -- "$p") || r=$p; echo "path $p $r"; q=$r; '
                'while :; do if [ -e "$q" ]; then stat -c "dir %u %U %a %n" -- "$q"; fi; '
                '[ "$q" = / ] && break; q=$(dirname -- "$q") || break; done; done')
        return 'echo "deployer ${SUDO_UID:-$(id -u)}"' + (f"; {walk}" if paths else "")

    def process(self, output) -> PathOwnership:
        lines = list(output)
        try:
            kind, uid = lines[0].split()
            if kind != "deployer":
                raise ValueError(lines[0])
            return PathOwnership(int(uid), _chains(lines[1:]))
        except (IndexError, ValueError) as e:
            raise FactProcessError(f"unexpected path ownership output: {e} in {lines[:3]!r}") from e


def _chains(lines: list) -> tuple[PathChain, ...]:
    """Each ``path GIVEN RESOLVED`` line with the ``dir UID OWNER MODE NAME`` lines after it."""
    chains: list = []
    for line in lines:
        kind, _, rest = line.partition(" ")
        if kind == "path":
            path, _, resolved = rest.partition(" ")
            chains.append((path, resolved, []))
        elif kind == "dir" and chains:
            uid, owner, mode, name = rest.split(" ", 3)
            int(mode, 8)  # octal, or a ValueError
            chains[-1][2].append(DirOwner(name, int(uid), owner, mode))
        else:
            raise ValueError(line)
    return tuple(PathChain(path, resolved, tuple(dirs)) for path, resolved, dirs in chains)

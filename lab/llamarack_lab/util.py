"""Small helpers shared by the lab modules: running tools and saying clearly
which Debian package provides a missing one."""

from __future__ import annotations

import shutil
import subprocess
import sys
from typing import Sequence

# tool -> Debian package that provides it (for "apt install" hints)
TOOL_PACKAGES = {
    "mmdebstrap": "mmdebstrap",
    "systemd-nspawn": "systemd-container",
    "zstd": "zstd",
    "lxcfs": "lxcfs",
    "iptables": "iptables",
    "ip": "iproute2",
    "ssh": "openssh-client",
    "ssh-keygen": "openssh-client",
    "dpkg-deb": "dpkg",
    "tar": "tar",
    "mount": "mount",
    "umount": "mount",
}


class LabError(RuntimeError):
    """A lab operation failed in a way the user can act on."""


def require_tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pkg = TOOL_PACKAGES.get(name, name)
        raise LabError(f"'{name}' not found: apt-get install {pkg}")
    return path


def run(
    cmd: Sequence[str],
    *,
    check: bool = True,
    capture: bool = True,
    input: bytes | str | None = None,
    timeout: float | None = None,
) -> subprocess.CompletedProcess:
    """Run a command given as a list (never through a shell)."""
    require_tool(cmd[0]) if "/" not in cmd[0] else None
    res = subprocess.run(
        list(cmd),
        input=input.encode() if isinstance(input, str) else input,
        stdout=subprocess.PIPE if capture else None,
        stderr=subprocess.PIPE if capture else None,
        timeout=timeout,
    )
    if check and res.returncode != 0:
        err = (res.stderr or b"").decode(errors="replace").strip()
        out = (res.stdout or b"").decode(errors="replace").strip()
        raise LabError(
            f"command failed ({res.returncode}): {' '.join(cmd)}\n{err or out}"
        )
    return res


def progress(msg: str) -> None:
    """Progress line for long steps (image build, boot)."""
    print(f"lab: {msg}", file=sys.stderr, flush=True)


def is_mountpoint(path) -> bool:
    """True if path is a mount point, bind mounts of the same filesystem
    included (os.path.ismount misses those)."""
    import os
    target = os.path.realpath(path)
    with open("/proc/self/mountinfo") as f:
        for line in f:
            mnt = line.split()[4].encode().decode("unicode_escape")
            if mnt == target:
                return True
    return False

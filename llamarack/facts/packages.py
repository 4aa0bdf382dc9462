"""Facts about apt: the NVIDIA driver packages and their holds, the deb822 sources."""

from __future__ import annotations

import re
from dataclasses import dataclass

from pyinfra.api import FactBase
from pyinfra.api.exceptions import FactProcessError

from .. import remote
from .value import FactValue

# Packages that make up an NVIDIA driver on Debian (nvidia-driver, libnvidia-*,
# nvidia-kernel-dkms, libcuda1...), Ubuntu (nvidia-driver-550, nvidia-dkms-550,
# nvidia-utils-550, libnvidia-compute-550, linux-modules-nvidia-550-*...) and
# NVIDIA's CUDA repository (cuda-drivers-550, nvidia-open...). The toolkit's
# packages (nvidia-cuda-toolkit, nvidia-cuda-dev...) are not the driver and
# stay out: holding them would block toolkit updates for no reason.
DRIVER_PACKAGE = re.compile(
    r"nvidia-driver.*|nvidia-kernel-.*|nvidia-dkms-.*|nvidia-utils-.*|nvidia-compute-utils-.*"
    r"|nvidia-smi|nvidia-alternative|nvidia-persistenced|nvidia-modprobe|nvidia-firmware-.*"
    r"|nvidia-open(-[0-9].*)?|nvidia-headless-.*|libnvidia-.*|libcuda1|libnvcuvid1|cuda-drivers.*"
    r"|firmware-nvidia-.*|xserver-xorg-video-nvidia.*"
    r"|linux-(modules|objects|signatures)-nvidia-.*"
)


@dataclass(frozen=True)
class DebPackage(FactValue):
    name: str
    version: str
    held: bool
    """dpkg's selection is ``hold`` (what ``apt-mark hold`` sets)."""


class NvidiaDriverPackages(FactBase[tuple]):
    """
    Returns the installed NVIDIA driver packages with their version and hold state.

    .. code:: python

        (DebPackage(name="nvidia-driver", version="550.127.05-1", held=True),)

    dpkg's selection state is the first word of ``${Status}``: ``hold`` after
    ``apt-mark hold``, ``install`` otherwise, so one query answers both.
    """

    def requires_command(self) -> str:
        return "dpkg-query"

    def command(self) -> str:
        # ${binary:Package}: "libnvidia-ml1:i386" for a foreign architecture's copy (and
        # ":amd64" on a Multi-Arch: same package), so each copy is held by its own name
        return "dpkg-query -W -f='${binary:Package}\\t${Version}\\t${Status}\\n'"

    def default(self) -> tuple:
        return ()

    def process(self, output) -> tuple:
        packages = []
        for line in output:
            # Tabs between fields: a package known but never installed has no version.
            fields = line.split("\t")
            if len(fields) != 3 or len(fields[2].split()) != 3:
                raise FactProcessError(f"unexpected dpkg-query line: {line!r}")
            name, version, (want, _, status) = fields[0], fields[1], fields[2].split()
            # -dev packages (libnvidia-ml-dev) come with the toolkit, not the driver.
            base = name.split(":", 1)[0]
            if status == "installed" and DRIVER_PACKAGE.fullmatch(base) and not base.endswith("-dev"):
                packages.append(DebPackage(name, version, want == "hold"))
        return tuple(sorted(packages, key=lambda p: p.name))


class DebianSources(FactBase[tuple]):
    """
    Returns the stanzas of the host's deb822 ``/etc/apt/sources.list.d/debian.sources``
    (Debian 12's default), each a dict of its fields; ``()`` when the file is absent.

    .. code:: python

        ({"Types": "deb", "URIs": "http://deb.debian.org/debian",
          "Suites": "bookworm bookworm-updates", "Components": "main",
          "Signed-By": "/usr/share/keyrings/debian-archive-keyring.gpg"},)
    """

    def command(self, path: str = "/etc/apt/sources.list.d/debian.sources") -> str:
        return f"cat {remote.argv(path)} 2>/dev/null || true"

    def default(self) -> tuple:
        return ()

    def process(self, output) -> tuple:
        stanzas: list[dict] = []
        current: dict = {}
        key = None
        for line in [*output, ""]:
            if not line.strip():
                if current:
                    stanzas.append(current)
                current, key = {}, None
            elif line.startswith("#"):
                continue
            elif line[0] in " \t":
                if key is None:
                    raise FactProcessError(f"deb822 continuation without a field: {line!r}")
                current[key] += "\n" + line.strip()
            else:
                key, sep, value = line.partition(":")
                if not sep:
                    raise FactProcessError(f"unexpected deb822 line: {line!r}")
                current[key.strip()] = value.strip()
        return tuple(stanzas)

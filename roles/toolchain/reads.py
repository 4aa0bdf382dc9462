"""Facts about the build toolchain: gcc, CUDA toolkits, cmake."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

from pyinfra.api import FactBase
from pyinfra.api.exceptions import FactProcessError

from pyinfra.facts.deb import DebPackages
from llamarack import remote
from llamarack.facts.value import FactValue
from llamarack.facts import FactRead


@dataclass(frozen=True)
class GccInstall(FactValue):
    default: Optional[str]
    """Full version of ``gcc`` on PATH (e.g. ``12.2.0``), None when absent."""
    versioned: dict
    """``{major: full version}`` of every ``/usr/bin/gcc-N`` with its ``g++-N``."""


class GccVersions(FactBase[GccInstall]):
    """Returns the default gcc's version and every versioned gcc-N installed
    (only those with a matching g++-N: CUDA needs the C++ compiler)."""

    def command(self) -> str:
        return ("command -v gcc >/dev/null 2>&1 && echo \"gcc $(gcc -dumpfullversion)\"; "
                "for p in /usr/bin/gcc-[0-9]*; do "
                '[ -x "$p" ] || continue; n=${p#/usr/bin/gcc-}; '
                '[ -x "/usr/bin/g++-$n" ] || continue; '
                'echo "gcc-$n $($p -dumpfullversion)"; done; true')

    def process(self, output) -> GccInstall:
        default, versioned = None, {}
        for line in output:
            name, _, version = line.strip().partition(" ")
            if not re.fullmatch(r"\d+(\.\d+)*", version):
                raise FactProcessError(f"unexpected gcc version line: {line!r}")
            if name == "gcc":
                default = version
            elif re.fullmatch(r"gcc-\d+", name):
                versioned[int(name[4:])] = version
        return GccInstall(default, versioned)

    def default(self) -> GccInstall:
        return GccInstall(None, {})


@dataclass(frozen=True)
class CudaToolkit(FactValue):
    home: str
    nvcc: str
    version: str
    """``major.minor`` as nvcc prints after "release" (``11.8``)."""
    full_version: str
    """As nvcc prints after "V" (``11.8.89``)."""
    max_gcc: Optional[int]
    """Newest gcc major the toolkit accepts, from its ``crt/host_config.h``."""


class CudaToolkits(FactBase[list]):
    """Returns every CUDA toolkit found on the host (``/usr/local/cuda*``, ``/usr``
    for Debian's nvidia-cuda-toolkit, conda envs under the llamarack root),
    each with its version and the newest gcc its ``crt/host_config.h`` accepts.

    The header is read rather than a table kept here: the toolkit on the host
    is the authority on which gcc it takes."""

    def command(self, extra_homes: tuple = ()) -> str:
        # The first glob is the shell's to expand; the homes given are values, quoted.
        homes = " ".join(["/usr/local/cuda-*", remote.argv("/usr/local/cuda", "/usr", *extra_homes)])
        return ("seen=; "
                f"for home in {homes}; do "
                'nvcc="$home/bin/nvcc"; [ -x "$nvcc" ] || continue; '
                'real=$(readlink -f "$nvcc"); case " $seen " in *" $real "*) continue;; esac; '
                'seen="$seen $real"; '
                'echo "toolkit $home"; "$nvcc" --version | grep "release"; '
                'for h in "$home/include/crt/host_config.h" '
                '"$home/targets/x86_64-linux/include/crt/host_config.h" '
                '"$home/include/x86_64-linux-gnu/crt/host_config.h"; do '
                '[ -f "$h" ] && grep -m1 -o "gcc versions later than [0-9]*" "$h" && break; done; '
                "done; true")

    def process(self, output) -> list:
        found: list[dict] = []
        for line in output:
            line = line.strip()
            if line.startswith("toolkit "):
                home = line[len("toolkit ") :]
                found.append({"home": home, "nvcc": f"{home}/bin/nvcc", "max_gcc": None})
            elif found and "release" in line:
                match = re.search(r"release (\d+\.\d+), V(\d+(?:\.\d+)+)", line)
                if not match:
                    raise FactProcessError(f"unexpected nvcc --version line: {line!r}")
                found[-1]["version"], found[-1]["full_version"] = match.groups()
            elif found and line.startswith("gcc versions later than"):
                found[-1]["max_gcc"] = int(line.split()[-1])
        return [_toolkit(values) for values in found]

    def default(self) -> list:
        return []


def _toolkit(values: dict) -> CudaToolkit:
    if "version" not in values:
        raise FactProcessError(f"nvcc in {values['home']} printed no release line")
    return CudaToolkit(**values)


class CmakeVersion(FactBase[Optional[str]]):
    """Returns the installed cmake version (``3.25.1``), None when absent."""

    requires_command = "cmake"

    def command(self) -> str:
        return "cmake --version"

    def process(self, output) -> Optional[str]:
        for line in output:
            match = re.match(r"cmake version (\d+(?:\.\d+)+)", line)
            if match:
                return match.group(1)
        raise FactProcessError(f"unexpected cmake --version output: {output!r}")


class InstallableGccMajors(FactBase[tuple]):
    """Returns the majors N for which apt knows a ``gcc-N`` package, newest first."""

    def command(self) -> str:
        return "apt-cache pkgnames gcc- 2>/dev/null | grep -E '^gcc-[0-9]+$' || true"

    def default(self) -> tuple:
        return ()

    def process(self, output) -> tuple:
        return tuple(sorted((int(line.strip()[4:]) for line in output if line.strip()), reverse=True))


def reads(settings) -> tuple:
    """What the toolchain role reads on a converged host: its part of preflight's one read."""
    return (FactRead.of(CmakeVersion), FactRead.of(DebPackages)) if settings.general.runs("toolchain") else ()

"""The toolchain role's compatibility rules: the CUDA toolkit for the build's archs, and a
host compiler that toolkit takes (preflight runs them, ``roles/preflight/rules.py``). The
numbers come from the toolkits' headers; where the host can tell (the gcc ceiling), its
fact wins over any table."""

from __future__ import annotations

from typing import Optional

from llamarack.errors import Failure
from roles.settings import Settings

from ..llamacpp.rules import arch_digits, build_archs
from ..preflight.facts import HostFacts
from .reads import CudaToolkit, GccInstall

# CUDA 13 dropped code generation for compute capability < 7.5.
TOOLKIT_13_MIN_CAP = (7, 5)

# Oldest toolkit able to target a compute capability.
TOOLKIT_MIN_FOR_CAP = (
    ((9, 0), (11, 8)),
    ((8, 9), (11, 8)),
    ((8, 6), (11, 1)),
    ((8, 0), (11, 0)),
)


def toolkit_version(s: Settings) -> tuple[int, int]:
    """The wanted CUDA version as (major, minor)."""
    parts = s.toolchain.cuda_version.split(".") + ["0"]
    return int(parts[0]), int(parts[1])


def find_toolkit(toolkits, version: str, home: Optional[str] = None) -> Optional[CudaToolkit]:
    """The first toolkit of ``version`` (``major.minor``), in ``home`` if one is given."""
    return next((t for t in toolkits if t.version == version and (not home or t.home == home)), None)


def toolkit_for(s: Settings, facts: HostFacts) -> Optional[CudaToolkit]:
    """The host's toolkit matching the wanted CUDA version (and home, if set)."""
    return find_toolkit(facts.toolkits, s.toolchain.cuda_version, s.toolchain.cuda_home)


def choose_host_compiler(max_gcc: Optional[int], gcc: GccInstall,
                         installable: tuple = ()) -> tuple[Optional[int], bool]:
    """Pick the gcc major nvcc should use: (major or None for the default gcc, must install).

    The system's default gcc is never changed; a versioned gcc-N at or below the toolkit's ceiling
    is used instead, installed from apt if need be. LookupError when none exists or can be installed."""
    if max_gcc is None or (gcc.default and int(gcc.default.split(".")[0]) <= max_gcc):
        return None, False
    if installed := [m for m in gcc.versioned if m <= max_gcc]:
        return max(installed), False
    if candidates := [m for m in installable if m <= max_gcc]:
        return max(candidates), True
    raise LookupError(max_gcc)


def rule_toolkit_targets_archs(s: Settings, facts: HostFacts) -> Optional[Failure]:
    """The toolkit can generate code for every build arch (13+ cannot below 7.5)."""
    if s.llamacpp.backend != "cuda":
        return None
    toolkit = toolkit_version(s)
    for arch in build_archs(s, facts):
        digits = arch_digits(arch)
        cap = int(digits[:-1]), int(digits[-1])
        oldest = next((f"{t[0]}.{t[1]}" for c, t in TOOLKIT_MIN_FOR_CAP if cap >= c and toolkit < t), None)
        if toolkit >= (13, 0) and cap < TOOLKIT_13_MIN_CAP:
            needed = "a CUDA 11.x or 12.x toolkit (CUDA 13 cannot build for Volta or Pascal)"
            fix = "set toolchain_cuda_version = '11.8' (or 12.x) for this host's group"
        elif oldest:
            needed, fix = f"CUDA {oldest} or newer for sm_{arch}", f"set toolchain_cuda_version to {oldest} or newer"
        else:
            continue
        return Failure("toolkit-arch", f"CUDA {s.toolchain.cuda_version} for sm_{arch}", needed, fix)
    return None


def rule_toolkit_present(s: Settings, facts: HostFacts) -> Optional[Failure]:
    """With a system toolkit, the wanted version is installed."""
    if s.llamacpp.backend != "cuda" or s.toolchain.cuda_source != "system" or toolkit_for(s, facts):
        return None
    version, home = s.toolchain.cuda_version, s.toolchain.cuda_home
    return Failure(
        "toolkit-present", ", ".join(f"{t.version} in {t.home}" for t in facts.toolkits) or "no CUDA toolkit",
        f"CUDA {version}" + (f" in {home}" if home else ""),
        f"install CUDA {version} (e.g. /usr/local/cuda-{version}), or set toolchain_cuda_source = 'conda' or 'debian'",
    )


def rule_gcc_for_toolkit(s: Settings, facts: HostFacts) -> Optional[Failure]:
    """A host compiler the toolkit accepts exists or can be installed."""
    toolkit = toolkit_for(s, facts)
    # No apt lists yet (a fresh host): what apt could install is unknown until
    # the toolchain role refreshes them; it stops the host if nothing fits.
    if s.llamacpp.backend != "cuda" or toolkit is None or toolkit.max_gcc is None or (
            s.toolchain.install_gcc and not facts.gcc_installable):
        return None
    try:
        choose_host_compiler(toolkit.max_gcc, facts.gcc, facts.gcc_installable if s.toolchain.install_gcc else ())
    except LookupError:
        found = f"gcc {facts.gcc.default}" if facts.gcc.default else "no gcc"
        if facts.gcc.versioned:
            found += " and gcc-" + ", gcc-".join(str(m) for m in sorted(facts.gcc.versioned))
        return Failure("gcc-for-toolkit", found,
                       f"gcc {toolkit.max_gcc} or older (CUDA {toolkit.version}'s crt/host_config.h)",
                       f"install gcc-{toolkit.max_gcc} and g++-{toolkit.max_gcc} "
                       "(apt-get update first; llamarack does it when toolchain_install_gcc is on)")
    return None


RULES = (rule_toolkit_targets_archs, rule_toolkit_present, rule_gcc_for_toolkit)

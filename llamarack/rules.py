"""Compatibility rules: driver, toolkit, gcc and GPU architecture.

Each rule is a small pure function of one host's settings and facts that
returns None (pass) or a ``Failure`` naming the value found, the value
needed and the fix. ``RULES`` is the table the preflight role runs, in order,
before anything on the host is changed. The numbers come from NVIDIA's
release notes and the toolkits' own headers (see docs/FIELD-NOTES in the
project history); where the host can tell us (the gcc ceiling), the fact
read from the host wins over any table here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

from packaging.version import Version

from .facts import CudaToolkit, DriverState, GccInstall, KernelModule
from .settings import Settings

# Minimum driver per CUDA toolkit (major, minor), newest first. CUDA 11.8
# ships with 520.61.05; older 11.x drivers (>= 450.80.02) only run 11.8 code
# in the limited minor-version compatibility mode, so we ask for the full one.
DRIVER_FLOOR_BY_TOOLKIT = (
    ((13, 0), "580.65.06"),
    ((12, 0), "525.60.13"),
    ((11, 8), "520.61.05"),
    ((11, 0), "450.80.02"),
)

# The 580 branch is the last to support Maxwell, Pascal and Volta: newer
# drivers ignore those GPUs. Turing (7.5) and later have no ceiling yet.
LEGACY_DRIVER_LAST_BRANCH = 580
LEGACY_BELOW_CAP = (7, 5)

# CUDA 13 dropped code generation for compute capability < 7.5.
TOOLKIT_13_MIN_CAP = (7, 5)

# Oldest toolkit able to target a compute capability.
TOOLKIT_MIN_FOR_CAP = (
    ((9, 0), (11, 8)),
    ((8, 9), (11, 8)),
    ((8, 6), (11, 1)),
    ((8, 0), (11, 0)),
)


@dataclass(frozen=True)
class HostFacts:
    """What the rules need to know about one host, read by the preflight role."""

    driver: DriverState
    module: Optional[KernelModule]
    toolkits: tuple = ()
    gcc: GccInstall = field(default_factory=lambda: GccInstall(None, {}))
    gcc_installable: tuple = ()
    """Majors N for which apt can install gcc-N (from ``apt-cache``)."""
    recorded_gpus: tuple = ()
    """GPUs seen at the last run where the driver answered (llamarack's state file)."""

    @property
    def gpus(self) -> tuple:
        """The host's cards for this run, the one list every role plans from: those
        the driver lists, else (a driver that hides them: an upgrade waiting for
        its reboot, a dropped card) those recorded at the last run where it answered."""
        return self.driver.gpus or self.recorded_gpus


@dataclass(frozen=True)
class Failure:
    rule: str
    found: str
    needed: str
    fix: str

    def message(self, host: str) -> str:
        return f"{host}: {self.rule}: found {self.found}; needed {self.needed}. Fix: {self.fix}"


def _cap(text: str) -> tuple[int, int]:
    major, minor = text.split(".")
    return int(major), int(minor)


def arch_digits(arch: str) -> str:
    """The compute capability digits of a build arch: "90a" and "80-real" give "90" and "80"."""
    return arch.split("-")[0].rstrip("af")


def _arch_cap(arch: str) -> tuple[int, int]:
    digits = arch_digits(arch)
    return int(digits[:-1]), int(digits[-1])


def _major(version: str) -> int:
    return int(version.split(".")[0])


def _toolkit_version(s: Settings) -> tuple[int, int]:
    parts = s.toolchain.cuda_version.split(".") + ["0"]
    return int(parts[0]), int(parts[1])


def build_archs(s: Settings, facts: HostFacts) -> tuple[str, ...]:
    """The CUDA architectures the build targets: the setting, else the host's GPUs'."""
    if s.llamacpp.cuda_archs:
        return s.llamacpp.cuda_archs
    return tuple(sorted({gpu.arch for gpu in facts.gpus if gpu.arch}))


def driver_floor(s: Settings) -> str:
    """The lowest driver accepted: the setting, raised to the toolkit's floor on CUDA builds."""
    floor = s.driver.min_version
    if s.llamacpp.backend == "cuda":
        wanted = _toolkit_version(s)
        for toolkit, minimum in DRIVER_FLOOR_BY_TOOLKIT:
            if wanted >= toolkit:
                floor = max(floor, minimum, key=Version)
                break
    return floor


def find_toolkit(toolkits, version: str, home: Optional[str] = None) -> Optional[CudaToolkit]:
    """The first toolkit of ``version`` (``major.minor``), in ``home`` if one is given."""
    for toolkit in toolkits:
        if toolkit.version == version and (not home or toolkit.home == home):
            return toolkit
    return None


def toolkit_for(s: Settings, facts: HostFacts) -> Optional[CudaToolkit]:
    """The host's toolkit matching the wanted CUDA version (and home, if set)."""
    return find_toolkit(facts.toolkits, s.toolchain.cuda_version, s.toolchain.cuda_home)


def choose_host_compiler(
    max_gcc: Optional[int], gcc: GccInstall, installable: tuple = ()
) -> tuple[Optional[int], bool]:
    """Pick the gcc major nvcc should use: (major or None for the default gcc, must install).

    The system's default gcc is never changed; a versioned gcc-N at or below
    the toolkit's ceiling is used instead, installed from apt if need be.
    Returns (None, False) when the default gcc is fine; raises LookupError
    when nothing at or below the ceiling exists or can be installed.
    """
    if max_gcc is None or (gcc.default and _major(gcc.default) <= max_gcc):
        return None, False
    installed = gcc.majors_at_most(max_gcc)
    if installed:
        return installed[0], False
    candidates = sorted((m for m in installable if m <= max_gcc), reverse=True)
    if candidates:
        return candidates[0], True
    raise LookupError(max_gcc)


# --- the rules -------------------------------------------------------------


def rule_driver_loaded(s: Settings, facts: HostFacts) -> Optional[Failure]:
    """The driver answers: installed, module loaded, library and module of one version."""
    driver = facts.driver
    if driver.state in ("ok", "no_devices"):
        return None
    if driver.state == "missing":
        if s.llamacpp.backend != "cuda":
            return None
        return Failure(
            "driver-installed",
            "no nvidia-smi (no NVIDIA driver installed)",
            f"an NVIDIA driver >= {driver_floor(s)}",
            "install the NVIDIA driver for this GPU, or set llamacpp_backend = 'cpu'",
        )
    if driver.state == "no_module":
        return Failure(
            "driver-module-loaded",
            "the NVIDIA kernel module is not loaded (nvidia-smi cannot reach the driver)",
            "a loaded nvidia module",
            "rebuild the module for the running kernel (dkms autoinstall) or boot the kernel "
            "it was built for, then reboot",
        )
    if driver.state == "mismatch":
        if s.driver.reboot_on_mismatch:
            return None
        loaded = facts.module.version if facts.module else "unknown"
        return Failure(
            "driver-reboot-needed",
            f"NVML library {driver.library_version} but loaded kernel module {loaded} "
            "(Driver/library version mismatch)",
            "library and module of the same version",
            "reboot the host (or set driver_reboot_on_mismatch = True to let llamarack do it)",
        )
    return Failure(
        "driver-answers", f"nvidia-smi failed: {driver.message}", "a working nvidia-smi",
        "look at the driver's state on the host (dmesg, nvidia-smi)",
    )  # fmt: skip


def rule_driver_floor(s: Settings, facts: HostFacts) -> Optional[Failure]:
    """The driver is new enough for the toolkit and for the configured minimum."""
    version = facts.driver.driver_version
    if version is None:
        return None
    floor = driver_floor(s)
    if Version(version) >= Version(floor):
        return None
    return Failure(
        "driver-floor",
        f"driver {version}",
        f"driver >= {floor} (CUDA {s.toolchain.cuda_version} / driver_min_version)",
        f"upgrade the driver to {floor} or newer (580 branch at most on Volta/Pascal)",
    )


def rule_driver_ceiling(s: Settings, facts: HostFacts) -> Optional[Failure]:
    """No driver past the 580 branch on GPUs older than Turing (it drops them).

    A driver that dropped the card lists no GPU, and after an upgrade without
    reboot nvidia-smi lists none either; the GPUs recorded at the last good
    run stand in then. In the mismatch state the library's version is the
    one the next boot loads, so it is the one checked: refusing now keeps the
    host serving on the old module.
    """
    legacy = [g for g in facts.gpus if g.compute_cap and _cap(g.compute_cap) < LEGACY_BELOW_CAP]
    if facts.driver.state == "mismatch":
        version = facts.driver.library_version
    else:
        version = facts.driver.driver_version or (facts.module.version if facts.module else None)
    if not version or not legacy or _major(version) <= LEGACY_DRIVER_LAST_BRANCH:
        return None
    names = ", ".join(sorted({g.name for g in legacy}))
    return Failure(
        "driver-ceiling",
        f"driver {version} with {names} (compute capability {legacy[0].compute_cap})",
        f"a driver of the {LEGACY_DRIVER_LAST_BRANCH} branch or older "
        f"(the last that supports GPUs below compute capability 7.5)",
        f"install a {LEGACY_DRIVER_LAST_BRANCH}.xx driver and apt-mark hold it",
    )


def rule_gpus_present(s: Settings, facts: HostFacts) -> Optional[Failure]:
    """A CUDA build needs at least one GPU the driver sees."""
    if s.llamacpp.backend != "cuda" or facts.driver.state not in ("ok", "no_devices"):
        return None
    if facts.driver.gpus:
        return None
    return Failure(
        "gpus-present", "no GPU listed by nvidia-smi", "at least one NVIDIA GPU",
        "check the GPU is seated and bound to the nvidia driver, or set llamacpp_backend = 'cpu'",
    )  # fmt: skip


def rule_build_covers_gpus(s: Settings, facts: HostFacts) -> Optional[Failure]:
    """Every GPU's architecture is in the build (else: no kernel image at run time)."""
    if s.llamacpp.backend != "cuda" or not s.llamacpp.cuda_archs:
        return None
    gpu_archs = {g.arch for g in facts.gpus if g.arch}
    missing = sorted(gpu_archs - set(arch_digits(a) for a in s.llamacpp.cuda_archs))
    if not missing:
        return None
    return Failure(
        "build-covers-gpus",
        f"llamacpp_cuda_archs {list(s.llamacpp.cuda_archs)} with GPUs of arch {sorted(gpu_archs)}",
        f"every GPU arch in the build (missing {missing})",
        "add the missing archs to llamacpp_cuda_archs, or unset it to build for the host's GPUs",
    )


def rule_toolkit_targets_archs(s: Settings, facts: HostFacts) -> Optional[Failure]:
    """The toolkit can generate code for every build arch (13+ cannot below 7.5)."""
    if s.llamacpp.backend != "cuda":
        return None
    toolkit = _toolkit_version(s)
    for arch in build_archs(s, facts):
        cap = _arch_cap(arch)
        if toolkit >= (13, 0) and cap < TOOLKIT_13_MIN_CAP:
            return Failure(
                "toolkit-arch",
                f"CUDA {s.toolchain.cuda_version} for sm_{arch}",
                "a CUDA 11.x or 12.x toolkit (CUDA 13 cannot build for Volta or Pascal)",
                "set toolchain_cuda_version = '11.8' (or 12.x) for this host's group",
            )
        for min_cap, min_toolkit in TOOLKIT_MIN_FOR_CAP:
            if cap >= min_cap and toolkit < min_toolkit:
                return Failure(
                    "toolkit-arch",
                    f"CUDA {s.toolchain.cuda_version} for sm_{arch}",
                    f"CUDA {min_toolkit[0]}.{min_toolkit[1]} or newer for sm_{arch}",
                    f"set toolchain_cuda_version to {min_toolkit[0]}.{min_toolkit[1]} or newer",
                )
    return None


def rule_toolkit_present(s: Settings, facts: HostFacts) -> Optional[Failure]:
    """With a system toolkit, the wanted version is installed."""
    if s.llamacpp.backend != "cuda" or s.toolchain.cuda_source != "system":
        return None
    if toolkit_for(s, facts):
        return None
    found = ", ".join(f"{t.version} in {t.home}" for t in facts.toolkits) or "no CUDA toolkit"
    return Failure(
        "toolkit-present",
        found,
        f"CUDA {s.toolchain.cuda_version}"
        + (f" in {s.toolchain.cuda_home}" if s.toolchain.cuda_home else ""),
        f"install CUDA {s.toolchain.cuda_version} (e.g. /usr/local/cuda-{s.toolchain.cuda_version}), "
        "or set toolchain_cuda_source = 'conda' or 'debian'",
    )


def rule_gcc_for_toolkit(s: Settings, facts: HostFacts) -> Optional[Failure]:
    """A host compiler the toolkit accepts exists or can be installed."""
    if s.llamacpp.backend != "cuda":
        return None
    toolkit = toolkit_for(s, facts)
    if toolkit is None or toolkit.max_gcc is None:
        return None
    if s.toolchain.install_gcc and not facts.gcc_installable:
        # No apt lists yet (a fresh host): what apt could install is unknown until
        # the toolchain role refreshes them; it stops the host if nothing fits.
        return None
    installable = facts.gcc_installable if s.toolchain.install_gcc else ()
    try:
        choose_host_compiler(toolkit.max_gcc, facts.gcc, installable)
    except LookupError:
        found = f"gcc {facts.gcc.default}" if facts.gcc.default else "no gcc"
        if facts.gcc.versioned:
            found += " and gcc-" + ", gcc-".join(str(m) for m in sorted(facts.gcc.versioned))
        return Failure(
            "gcc-for-toolkit",
            found,
            f"gcc {toolkit.max_gcc} or older (CUDA {toolkit.version}'s crt/host_config.h)",
            f"install gcc-{toolkit.max_gcc} and g++-{toolkit.max_gcc} "
            "(apt-get update first; llamarack does it when toolchain_install_gcc is on)",
        )
    return None


Rule = Callable[[Settings, HostFacts], Optional[Failure]]

RULES: tuple[Rule, ...] = (
    rule_driver_loaded,
    rule_driver_floor,
    rule_driver_ceiling,
    rule_gpus_present,
    rule_build_covers_gpus,
    rule_toolkit_targets_archs,
    rule_toolkit_present,
    rule_gcc_for_toolkit,
)


def evaluate(s: Settings, facts: HostFacts) -> list[Failure]:
    """Run every rule; return the failures in table order."""
    return [failure for rule in RULES if (failure := rule(s, facts)) is not None]

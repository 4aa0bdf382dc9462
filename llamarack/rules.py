"""Compatibility rules: driver, toolkit, gcc and GPU architecture.

Each rule is a pure function of one host's settings and facts that returns None
(pass) or a ``Failure`` naming the value found, the value needed and the fix.
``RULES`` is the table the preflight role runs, in order, before anything on the
host is changed. The numbers come from NVIDIA's release notes and the toolkits'
headers; where the host can tell (the gcc ceiling), its fact wins over any table.
"""

from __future__ import annotations

import collections
import re
from dataclasses import dataclass, field
from typing import Callable, Optional

from packaging.version import Version

from llamarack import gpu_table
from llamarack.facts.ownership import PathOwnership
from roles.driver.reads import DriverState, KernelLog, KernelModule
from roles.model.calibration import HubCounts, calibrates, card_shortfall
from roles.model.reads import ArtifactState
from roles.server.reads import SERVICE_USER_MARK, PasswdEntry
from roles.toolchain.reads import CudaToolkit, GccInstall

from .settings import Settings, private_dirs

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
    driver_packages: tuple = ()
    """The installed NVIDIA driver packages (``NvidiaDriverPackages``): the driver the
    next boot loads, which nvidia-smi cannot say when the module is not bound."""
    pci_cards: Optional[tuple] = None
    """The NVIDIA cards on the PCI bus (``NvidiaPciCards``), whatever the driver says; None if not read."""
    kernel_log: Optional[KernelLog] = None
    """What the kernel said of the driver this boot (``NvidiaKernelLog``)."""
    mig: tuple = ()
    """Each card's MIG mode and instances (``MigStates``)."""
    path_owners: Optional[PathOwnership] = None
    """Owner and mode of each directory root runs or builds from and those above (``PathOwners``); None if not read."""
    service_user: Optional[PasswdEntry] = None
    """The account named ``llamarack_service_user`` (``SystemUser``); None if none or no server role runs."""
    service_group: Optional[int] = None
    """The gid of the group of that name (``SystemGroup``), None where there is none."""
    served_model: Optional[ArtifactState] = None
    """The artifact ``models/current`` points at (``ModelArtifact``), read where route awq
    calibrates on the host's cards (``roles/model/calibration.py``); None elsewhere."""
    served_shape: Optional[dict] = None
    """Its GGUF's shape (``GgufShape``), read where that GGUF is the one sealed; None elsewhere."""
    hub_config: Optional[HubCounts] = None
    """The counts of the checkpoint's ``config.json``, read from the hub by preflight's deploy where route
    awq calibrates on the cards a checkpoint the served GGUF does not give the shape of
    (``calibration.hub_counts``), or why they could not be; None elsewhere (the audit never asks the hub)."""

    @property
    def gpus(self) -> tuple:
        """The host's cards for this run, the one list every role plans from: those the driver lists,
        else (a driver that hides them: an upgrade waiting for its reboot, a dropped card) those it
        listed at the last run where it answered, less those the record keeps as missing since."""
        return self.driver.gpus or tuple(g for g in self.recorded_gpus if not g.missing)


@dataclass(frozen=True)
class Failure:
    rule: str
    found: str
    needed: str
    fix: str

    def message(self, host: str) -> str:
        return f"{host}: {self.rule}: found {self.found}; needed {self.needed}. Fix: {self.fix}"


def parse_compute_cap(text: Optional[str]) -> Optional[tuple[int, int]]:
    """(7, 0) from "7.0"; None for no value or one that is no number ("[N/A]")."""
    major, _, minor = (text or "").partition(".")
    return (int(major), int(minor)) if major.isdigit() and minor.isdigit() else None


_DRIVER_VERSION = re.compile(r"(?:\d+:)?(\d{3}\.\d+(?:\.\d+)?)(?:[-~+].*)?")


def package_driver_version(packages) -> Optional[str]:
    """The driver version the installed packages carry ("590.44.01-1" gives "590.44.01"): the newest,
    which is what the next boot loads during an upgrade or beside a stray older package (nvidia-persistenced)."""
    versions = [m.group(1) for p in packages if (m := _DRIVER_VERSION.fullmatch(p.version))]
    return max(versions, key=Version) if versions else None


def all_known_gpus(facts: HostFacts) -> tuple:
    """The cards the driver lists plus the recorded ones it no longer lists (by UUID), plus
    the cards on the PCI bus that neither names (a first run, a driver that ignores them)."""
    listed = {g.uuid for g in facts.driver.gpus}
    known = tuple(facts.driver.gpus) + tuple(g for g in facts.recorded_gpus if g.uuid not in listed)
    counted = collections.Counter(gpu_table.device_id(g.pci_device_id) for g in known)
    unnamed = []
    for card in facts.pci_cards or ():
        dev = gpu_table.device_id(card.pci_device_id)
        if counted[dev] > 0:
            counted[dev] -= 1
        else:
            unnamed.append(card)
    return known + tuple(unnamed)


def coming_driver_version(facts: HostFacts) -> Optional[str]:
    """The driver the host runs, or will run after its next boot when nvidia-smi cannot say.

    Answering: the live one. A mismatch: the NVML library's (older drivers print none: the
    packages'). Module not bound or no GPU listed: the packages', else the loaded module's.
    """
    driver, packaged = facts.driver, package_driver_version(facts.driver_packages)
    if driver.state == "ok" and driver.driver_version:
        return driver.driver_version
    if driver.state == "mismatch":
        return driver.library_version or packaged
    return packaged or (facts.module.version if facts.module else None)


def driver_warnings(driver) -> tuple[str, ...]:
    """What nvidia-smi warned about while it answered (``DriverState.message`` in the ok
    state: "WARNING: infoROM is corrupted at gpu 0000:00:1E.0"): the cards still serve,
    so no rule refuses, but the operator is told (preflight's output, the audit's driver item)."""
    if driver.state != "ok":
        return ()
    return tuple(line.strip() for line in driver.message.splitlines() if line.strip())


def legacy_gpus_past_ceiling(facts: HostFacts) -> tuple[Optional[str], tuple]:
    """(driver version, pre-Turing cards) when the driver is past the last branch
    that supports them; (version, ()) when it is not."""
    version = coming_driver_version(facts)
    if not version or _major(version) <= LEGACY_DRIVER_LAST_BRANCH:
        return version, ()
    return version, tuple(g for g in all_known_gpus(facts)
                          if (c := parse_compute_cap(g.compute_cap)) and c < LEGACY_BELOW_CAP)  # fmt: skip


def arch_digits(arch: str) -> str:
    """The compute capability digits of a build arch: "90a" and "80-real" give "90" and "80"."""
    return arch.split("-")[0].rstrip("af")


def _major(version: str) -> int:
    return int(version.split(".")[0])


def _toolkit_version(s: Settings) -> tuple[int, int]:
    parts = s.toolchain.cuda_version.split(".") + ["0"]
    return int(parts[0]), int(parts[1])


def build_archs(s: Settings, facts: HostFacts) -> tuple[str, ...]:
    """The CUDA architectures the build targets: the setting, else the host's GPUs'."""
    return s.llamacpp.cuda_archs or tuple(sorted({gpu.arch for gpu in facts.gpus if gpu.arch}))


def driver_floor(s: Settings) -> str:
    """The lowest driver accepted: the setting, raised to the toolkit's floor on CUDA builds."""
    if s.llamacpp.backend != "cuda":
        return s.driver.min_version
    wanted = _toolkit_version(s)
    minimum = next((m for toolkit, m in DRIVER_FLOOR_BY_TOOLKIT if wanted >= toolkit), "0")
    return max(s.driver.min_version, minimum, key=Version)


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
    is used instead, installed from apt if need be. LookupError when none exists or can be installed.
    """
    if max_gcc is None or (gcc.default and _major(gcc.default) <= max_gcc):
        return None, False
    if installed := gcc.majors_at_most(max_gcc):
        return installed[0], False
    if candidates := [m for m in installable if m <= max_gcc]:
        return max(candidates), True
    raise LookupError(max_gcc)


# --- the rules -------------------------------------------------------------


# llama.cpp's CUDA backend builds for compute 5.0 (Maxwell) and newer.
OLDEST_CAP = (5, 0)


def rule_gpus_supported(s: Settings, facts: HostFacts) -> Optional[Failure]:
    """No card older than Maxwell on a CUDA build: Kepler's last driver branch is 470,
    older than CUDA 11.8's floor, and llama.cpp builds for nothing before 5.0. No
    driver, toolkit or arch setting fixes that, so this rule alone is reported."""
    old = [g for g in all_known_gpus(facts) if (c := parse_compute_cap(g.compute_cap)) and c < OLDEST_CAP]
    if s.llamacpp.backend != "cuda" or not old:
        return None
    return Failure(
        "gpu-supported", ", ".join(sorted({f"{g.name} (compute capability {g.compute_cap})" for g in old})),
        "GPUs of compute capability 5.0 or newer (llama.cpp's CUDA backend; CUDA 11.8 needs driver 520.61.05, "
        "and 470 is the last driver branch for Kepler cards)",
        "no driver or toolkit serves these cards: set llamacpp_backend = 'cpu' for this host to serve "
        "from its CPU, or move the model to a host with a newer card",
    )


def rule_driver_loaded(s: Settings, facts: HostFacts) -> Optional[Failure]:
    """The driver answers: installed, module loaded, library and module of one version."""
    driver = facts.driver
    if driver.state in ("ok", "no_devices") or (driver.state == "missing" and s.llamacpp.backend != "cuda"):
        return None
    if driver.state == "missing":
        return Failure("driver-installed", "no nvidia-smi (no NVIDIA driver installed)",
                       f"an NVIDIA driver >= {driver_floor(s)}",
                       "install the NVIDIA driver for this GPU, or set llamacpp_backend = 'cpu'")  # fmt: skip
    if driver.state == "no_module":
        # not a module problem where the driver ignores the card (driver-ceiling says so)
        return None if legacy_gpus_past_ceiling(facts)[1] else no_module_cause(facts)
    if driver.state == "mismatch":
        if s.driver.reboot_on_mismatch or legacy_gpus_past_ceiling(facts)[1]:
            return None  # llamarack reboots; or the reboot would boot a driver past the card (driver-ceiling)
        loaded = facts.module.version if facts.module else "unknown"
        library = driver.library_version or package_driver_version(facts.driver_packages)
        library = f"NVML library {library}" if library else "an NVML library of another version"
        return Failure("driver-reboot-needed", f"{library} but loaded kernel module {loaded} (Driver/library "
                       "version mismatch)", "library and module of the same version",
                       "reboot the host (or set driver_reboot_on_mismatch = True to let llamarack do it)")  # fmt: skip
    return Failure("driver-answers", f"nvidia-smi failed: {driver.message}", "a working nvidia-smi",
                   "look at the driver's state on the host (dmesg, nvidia-smi)")


# The kernel's words for the causes nvidia-smi cannot name (NVRM lines, this boot).
FELL_OFF_BUS = re.compile(r"fallen off the bus", re.I)
LEGACY_BRANCH = re.compile(r"supported through the NVIDIA (\d+)\.xx Legacy drivers")


def no_module_cause(facts: HostFacts) -> Failure:
    """Why the module is not loaded, named from the PCI bus and the kernel's log: no card,
    nouveau holding it, a card the driver dropped, a card off the bus, no module built."""
    cards, log = facts.pci_cards, facts.kernel_log or KernelLog((), None)
    last = next((line for line in reversed(log.lines) if "NVRM" in line), None)
    if cards == ():
        recorded = sorted({g.name for g in facts.recorded_gpus})
        found = f"{', '.join(recorded)} (recorded at the last good run) not" if recorded else "no NVIDIA GPU"
        return Failure("gpu-on-bus", f"{found} on the PCI bus (/sys/bus/pci/devices)", "an NVIDIA GPU on the bus",
                       "seat and power the card (or pass it through to this VM), "
                       "or set llamacpp_backend = 'cpu'")  # fmt: skip
    held = sorted({f"{c.name or c.pci_device_id} ({c.slot})" for c in cards or () if c.driver == "nouveau"})
    if held:
        return Failure("driver-nouveau", f"nouveau holds {', '.join(held)}", "the nvidia module bound to the cards",
                       "blacklist nouveau ('blacklist nouveau' and 'options nouveau modeset=0' in "
                       "/etc/modprobe.d/blacklist-nouveau.conf), update-initramfs -u, then reboot")  # fmt: skip
    fell = next((line for line in log.lines if FELL_OFF_BUS.search(line)), None)
    if fell:
        return Failure("gpu-on-bus", f"a GPU fell off the bus ({fell})", "every GPU answering on the bus",
                       "hardware: reseat or power-cycle the card, check its power and cooling, then reboot")
    legacy = next((m for line in log.lines if (m := LEGACY_BRANCH.search(line))), None)
    if legacy:
        return Failure("driver-ceiling", f"the driver ignores the card: {legacy.group(0)}",
                       f"a driver of the {legacy.group(1)} branch (the last that supports the card)",
                       f"install a {legacy.group(1)}.xx driver and apt-mark hold it")  # fmt: skip
    if facts.kernel_log is not None and log.module_file is None:
        found = "no nvidia module built for the running kernel"
    else:
        found = "the NVIDIA kernel module is not loaded (nvidia-smi cannot reach the driver)" + (
            f"; the kernel said: {last}" if last else "")  # fmt: skip
    return Failure("driver-module-loaded", found, "a loaded nvidia module", "rebuild the module for the running "
                   "kernel (dkms autoinstall) or boot the kernel it was built for, then reboot")  # fmt: skip


def rule_driver_floor(s: Settings, facts: HostFacts) -> Optional[Failure]:
    """The driver is new enough for the toolkit and for the configured minimum."""
    version, floor = facts.driver.driver_version, driver_floor(s)
    if version is None or Version(version) >= Version(floor):
        return None
    return Failure("driver-floor", f"driver {version}",
                   f"driver >= {floor} (CUDA {s.toolchain.cuda_version} / driver_min_version)",
                   f"upgrade the driver to {floor} or newer (580 branch at most on Volta/Pascal)")


def rule_driver_ceiling(s: Settings, facts: HostFacts) -> Optional[Failure]:
    """No driver past the 580 branch on GPUs older than Turing (it drops them).

    A driver that dropped the card does not list it: a 590+ module on a V100 alone does not
    bind ("NVRM: No NVIDIA GPU found", nvidia-smi cannot reach the driver), beside a T4 it lists
    the T4 only. So the cards are the listed ones plus the recorded ones, and the version is the
    one the host runs or boots next (``coming_driver_version``). Refusing in the mismatch state
    keeps the host serving on the old module.
    """
    version, legacy = legacy_gpus_past_ceiling(facts)
    if not legacy:
        return None
    names = ", ".join(sorted({g.name for g in legacy}))
    source = "" if facts.driver.state == "ok" else " (installed, not running)"
    return Failure(
        "driver-ceiling", f"driver {version}{source} with {names} (compute capability {legacy[0].compute_cap})",
        f"a driver of the {LEGACY_DRIVER_LAST_BRANCH} branch or older "
        f"(the last that supports GPUs below compute capability 7.5)",
        f"install a {LEGACY_DRIVER_LAST_BRANCH}.xx driver and apt-mark hold it",
    )


def rule_gpus_readable(s: Settings, facts: HostFacts) -> Optional[Failure]:
    """Every GPU line nvidia-smi printed could be read (else a card goes unplanned)."""
    if not facts.driver.unreadable:
        return None
    return Failure(
        "gpus-readable",
        "nvidia-smi GPU line(s) llamarack cannot read: " + "; ".join(repr(l) for l in facts.driver.unreadable),
        "index, name, uuid, memory.total (MiB), compute_cap, driver_version, pci.device_id for every GPU",
        "look at that card (nvidia-smi -q -i INDEX, dmesg for Xid errors): a field of [N/A] often "
        "means a failing card; fix or remove it, then run again",
    )


def rule_gpus_present(s: Settings, facts: HostFacts) -> Optional[Failure]:
    """A CUDA build needs at least one GPU the driver sees."""
    if s.llamacpp.backend != "cuda" or facts.driver.state not in ("ok", "no_devices") or facts.driver.gpus:
        return None
    return Failure("gpus-present", "no GPU listed by nvidia-smi", "at least one NVIDIA GPU",
                   "check the GPU is seated and bound to the nvidia driver, or set llamacpp_backend = 'cpu'")


def rule_gpus_whole(s: Settings, facts: HostFacts) -> Optional[Failure]:
    """No card in MIG mode: llamarack plans a whole card's memory, and with MIG on CUDA
    sees its instances (or nothing, when none is made), never the whole card."""
    split = [m for m in facts.mig if m.mode == "Enabled"]
    if s.llamacpp.backend != "cuda" or not split:
        return None
    names = {g.index: g.name for g in facts.driver.gpus}
    found = "; ".join(f"{names.get(m.index, f'GPU {m.index}')} (GPU {m.index}) in MIG mode, "
                      + (f"CUDA sees {len(m.instances)} instance(s): {', '.join(m.instances)}" if m.instances
                         else "no MIG instance made: CUDA sees no device")
                      for m in split)  # fmt: skip
    return Failure(
        "gpus-whole", found, "whole cards (MIG mode off): llamarack plans a card's whole memory",
        "turn MIG off on those cards (nvidia-smi -i INDEX -mig 0, then reset the card or reboot), "
        "or leave them out of this host's inventory",
    )


def missing_gpus(facts: HostFacts) -> tuple:
    """The recorded cards the driver no longer lists while it lists others (fallen off the bus, removed,
    or dropped beside a card it still lists), less those a driver too new for them hides (``driver-ceiling``
    names those). () when the driver lists no card: the driver rules and ``gpus-present`` speak then."""
    if facts.driver.state != "ok" or not facts.driver.gpus:
        return ()
    _, explained = legacy_gpus_past_ceiling(facts)
    named = {g.uuid for g in facts.driver.gpus + explained}
    return tuple(g for g in facts.recorded_gpus if g.uuid not in named)


def missing_gpus_warning(s: Settings, facts: HostFacts) -> Optional[str]:
    """What preflight says of recorded cards gone now: the deploy goes on with the cards listed (the
    server role retires a gone card's unit until it is back); the record keeps them until they return."""
    missing = missing_gpus(facts)
    if not missing:
        return None
    return ("recorded GPU(s) not listed by nvidia-smi now: " + ", ".join(f"{g.name} ({g.uuid})" for g in missing)
            + "; listed: " + ", ".join(g.name for g in facts.driver.gpus) + ". Serving from the cards listed "
            "(a gone card's unit retires until it is back). Check the card is seated and bound to the nvidia "
            f"driver (dmesg | grep NVRM); if it was removed on purpose, delete {s.layout.gpus_record}")  # fmt: skip


def rule_gpus_known(s: Settings, facts: HostFacts) -> Optional[Failure]:
    """Every card has a compute capability (from the driver or the card table): else
    the build's arch list is empty and cmake refuses -DCMAKE_CUDA_ARCHITECTURES=."""
    unknown = [g for g in facts.gpus if parse_compute_cap(g.compute_cap) is None]
    if s.llamacpp.backend != "cuda" or s.llamacpp.cuda_archs or not unknown:
        return None
    names = ", ".join(f"{g.name} (PCI device id {g.pci_device_id or 'unknown'})" for g in unknown)
    return Failure(
        "gpu-known", f"GPU(s) of unknown compute capability: {names} (the driver gives no compute_cap and the card "
        "is not in llamarack's card table)", "a compute capability for every GPU",
        "set llamacpp_cuda_archs for this host's group (e.g. ['70'] for a V100), "
        "or add the card to llamarack/gpu_table.py",
    )


def rule_build_covers_gpus(s: Settings, facts: HostFacts) -> Optional[Failure]:
    """Every GPU's architecture is in the build (else: no kernel image at run time)."""
    gpu_archs = {g.arch for g in facts.gpus if g.arch}
    missing = sorted(gpu_archs - {arch_digits(a) for a in s.llamacpp.cuda_archs or ()})
    if s.llamacpp.backend != "cuda" or not s.llamacpp.cuda_archs or not missing:
        return None
    return Failure("build-covers-gpus",
                   f"llamacpp_cuda_archs {list(s.llamacpp.cuda_archs)} with GPUs of arch {sorted(gpu_archs)}",
                   f"every GPU arch in the build (missing {missing})",
                   "add the missing archs to llamacpp_cuda_archs, or unset it to build for the host's GPUs")


def rule_toolkit_targets_archs(s: Settings, facts: HostFacts) -> Optional[Failure]:
    """The toolkit can generate code for every build arch (13+ cannot below 7.5)."""
    if s.llamacpp.backend != "cuda":
        return None
    toolkit = _toolkit_version(s)
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


def rule_dirs_private(s: Settings, facts: HostFacts) -> Optional[Failure]:
    """The directories root runs or builds from (``settings.private_dirs``: the root, toolchain_cuda_home,
    llamacpp_ccache_dir), links resolved, and every existing directory above them are root's (or the
    deploying user's) and no group or other user can write to them: else a local user could put in what
    root later runs. A sticky directory such as /tmp counts as writable: anyone may make a name in it."""
    owners = facts.path_owners
    if owners is None or s.general.allow_shared_dirs:
        return None
    keys = {path: key for key, path in private_dirs(s)}
    allowed = {0, owners.deployer_uid}
    found, fixes = [], []
    for chain in owners.paths:
        bad = [d for d in chain.dirs if d.uid not in allowed or d.writable_by_others()]
        if not bad:
            continue
        key = keys.get(chain.path, "a directory")
        link = f" (a link to {chain.resolved})" if chain.resolved != chain.path else ""
        found.append(f"{key} {chain.path}{link}: " + ", ".join(
            f"{d.path} owned by {d.owner} (uid {d.uid}), mode {d.mode}" for d in bad))
        mine = [d.path for d in bad if d.path == chain.resolved or d.path.startswith(chain.resolved + "/")]
        fixes.append(f"set {key} to a directory only root can write to (under /opt or /srv)"
                     + (f", or chown root:root {' '.join(mine)} and chmod go-w {' '.join(mine)}"
                        if len(mine) == len(bad) else ""))  # fmt: skip
    if not found:
        return None
    user = "" if owners.deployer_uid == 0 else f" (or the deploying user, uid {owners.deployer_uid})"
    return Failure(
        "dirs-private", "; ".join(found),
        f"each of them and every directory above it owned by root{user} and writable by no group or "
        "other user (a sticky /tmp counts: anyone can make a name in it), since root runs what is there",
        "; ".join(fixes),
    )  # fmt: skip


def account_failure(user: str, home: str, setting: Optional[str], entry: Optional[PasswdEntry],
                    group: Optional[int]) -> Optional[Failure]:
    """Whether the system account ``user`` (home ``home``) may be made (no account, no group of that name)
    or taken on (an account llamarack made, its own group its primary one): its home and shell are changed
    and files are given to its group, so an account of the system's or a person's is refused. ``setting``:
    the setting that names it, if any."""
    fix = (f"set {setting} to a name no account or group of this host has (llamarack makes it), or "
           if setting else "") + f"remove the host's {user!r} if nothing else uses it"  # fmt: skip
    if entry is None:
        if group is None:
            return None
        return Failure("service-user", f"no user {user!r} but a group {user!r} (gid {group})",
                       f"no group {user!r}: useradd makes the account's own group", fix)  # fmt: skip
    low, high = entry.system_uids
    needed = (f"an account llamarack made: a system uid ({low}-{high}), GECOS {SERVICE_USER_MARK!r} (or, "
              f"as llamarack made it before it marked it, an empty GECOS with home {home} and shell "
              "/usr/sbin/nologin), and a group of the same name as its primary group")  # fmt: skip
    if not entry.made_by_llamarack(home):
        return Failure("service-user", f"account {user!r}, which llamarack did not make ({entry.describe()})",
                       needed, fix)  # fmt: skip
    if group != entry.gid:
        found = f"group {user!r} has gid {group}" if group is not None else f"no group {user!r}"
        return Failure("service-user", f"account {user!r} of primary gid {entry.gid}, but {found}", needed, fix)
    return None


def rule_service_user(s: Settings, facts: HostFacts) -> Optional[Failure]:
    """The service user is one llamarack may make or take on (``account_failure``)."""
    if not s.general.runs("server"):
        return None
    return account_failure(s.general.service_user, s.general.root, "llamarack_service_user", facts.service_user,
                           facts.service_group)  # fmt: skip


def rule_awq_card_memory(s: Settings, facts: HostFacts) -> Optional[Failure]:
    """Route awq on a CUDA build: the host's smallest card holds what AutoAWQ puts on it while it calibrates
    one decoder layer, counted from the served GGUF of the same checkpoint, else from the checkpoint's
    config.json on the hub, and a bound of the calibration tokens (``roles/model/calibration.py``). A CPU
    build calibrates on the CPU; counts not known (the audit, a hub that did not answer) leave the check
    to the AWQ step itself."""
    short = calibrates(s) and card_shortfall(s, facts.served_model, facts.served_shape, facts.gpus, facts.hub_config)
    return Failure("awq-card-memory", *short) if short else None


RULES: tuple[Callable[[Settings, HostFacts], Optional[Failure]], ...] = (
    rule_gpus_supported,
    rule_driver_loaded,
    rule_driver_floor,
    rule_driver_ceiling,
    rule_gpus_readable,
    rule_gpus_present,
    rule_gpus_whole,
    rule_gpus_known,
    rule_build_covers_gpus,
    rule_toolkit_targets_archs,
    rule_toolkit_present,
    rule_gcc_for_toolkit,
    rule_dirs_private,
    rule_service_user,
    rule_awq_card_memory,
)


def evaluate(s: Settings, facts: HostFacts) -> list[Failure]:
    """Run every rule; return the failures in table order. Cards no setup can serve
    (``gpu-supported``) are the one failure reported: the others' fixes lead nowhere."""
    failures = [failure for rule in RULES if (failure := rule(s, facts)) is not None]
    return failures[:1] if failures and failures[0].rule == "gpu-supported" else failures

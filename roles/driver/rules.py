"""The driver role's compatibility rules: the cards, the driver that runs them, and the
driver the next boot loads.

Each rule is a pure function of one host's settings and facts that returns None (pass) or
a ``Failure`` naming the value found, the value needed and the fix; preflight runs them
(``roles/preflight/rules.py``). The numbers come from NVIDIA's release notes.
"""

from __future__ import annotations

import collections
import re
from typing import Optional

from packaging.version import Version

from llamarack import gpu_table
from llamarack.errors import Failure
from llamarack.gpu_table import parse_compute_cap
from roles.settings import Settings

from ..preflight.facts import HostFacts
from ..toolchain.rules import toolkit_version
from .reads import FELL_OFF_BUS, KernelLog

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
    packages'). Module not bound or no GPU listed: the packages', else the loaded module's."""
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
    if not version or int(version.split(".")[0]) <= LEGACY_DRIVER_LAST_BRANCH:
        return version, ()
    return version, tuple(g for g in all_known_gpus(facts)
                          if (c := parse_compute_cap(g.compute_cap)) and c < LEGACY_BELOW_CAP)  # fmt: skip


def driver_floor(s: Settings) -> str:
    """The lowest driver accepted: the setting, raised to the toolkit's floor on CUDA builds."""
    if s.llamacpp.backend != "cuda":
        return s.driver.min_version
    wanted = toolkit_version(s)
    minimum = next((m for toolkit, m in DRIVER_FLOOR_BY_TOOLKIT if wanted >= toolkit), "0")
    return max(s.driver.min_version, minimum, key=Version)


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
    fallen = fallen_off_bus(facts)
    if fallen:  # nvidia-smi fails on the card that fell; the kernel names it
        return Failure("gpu-on-bus", f"{_fallen_cards(fallen)} (the kernel: {fallen[0][1]}); nvidia-smi failed: "
                       f"{driver.message}", ON_BUS_NEEDED, ON_BUS_FIX)  # fmt: skip
    return Failure("driver-answers", f"nvidia-smi failed: {driver.message}", "a working nvidia-smi",
                   "look at the driver's state on the host (dmesg, nvidia-smi)")


ON_BUS_NEEDED = "every GPU answering on the bus"
ON_BUS_FIX = "hardware: reseat or power-cycle the card, check its power and cooling, then reboot"


def fallen_off_bus(facts: HostFacts) -> tuple:
    """(the card, the kernel's line, its UUID or None) of each card the kernel says fell off the bus
    this boot (``KernelLog.fallen_off_bus``): named by its PCI slot, with its name (the record's, by
    the UUID the kernel tied to the slot, else the card table's for the PCI bus's device) and UUID."""
    log = facts.kernel_log
    if log is None:
        return ()
    uuids, fallen = log.uuids(), []
    for address, line in log.fallen_off_bus().items():
        card = next((c for c in facts.pci_cards or () if c.slot.lower().startswith(address + ".")), None)
        uuid = uuids.get(address)
        recorded = next((g.name for g in facts.recorded_gpus if uuid and g.uuid == uuid), None)
        about = [n for n in (recorded or (card and (card.name or card.pci_device_id)), uuid) if n]
        what = f"the GPU at PCI {card.slot if card else address}" + (f" ({', '.join(about)})" if about else "")
        fallen.append((what, line, uuid))
    return tuple(fallen)


def _fallen_cards(fallen: tuple) -> str:
    return " and ".join(what for what, _, _ in fallen) + " fell off the bus"


# The kernel's words for the causes nvidia-smi cannot name (NVRM lines, this boot; a card off
# the bus: reads.py, FELL_OFF_BUS).
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
        return Failure("gpu-on-bus", f"a GPU fell off the bus ({fell})", ON_BUS_NEEDED, ON_BUS_FIX)
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
    keeps the host serving on the old module."""
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
    return Failure("gpus-whole", found, "whole cards (MIG mode off): llamarack plans a card's whole memory",
                   "turn MIG off on those cards (nvidia-smi -i INDEX -mig 0, then reset the card or reboot), "
                   "or leave them out of this host's inventory")


def missing_gpus(facts: HostFacts) -> tuple:
    """The recorded cards the driver no longer lists while it lists others (fallen off the bus, removed,
    or dropped beside a card it still lists), less those a driver too new for them hides (``driver-ceiling``
    names those). () when the driver lists no card: the driver rules and ``gpus-present`` speak then."""
    if facts.driver.state != "ok" or not facts.driver.gpus:
        return ()
    _, explained = legacy_gpus_past_ceiling(facts)
    named = {g.uuid for g in facts.driver.gpus + explained}
    return tuple(g for g in facts.recorded_gpus if g.uuid not in named)


def fallen_beside_listed(facts: HostFacts) -> tuple:
    """``fallen_off_bus`` where the driver lists other cards and one the PCI bus or the record
    knows is not listed; () otherwise."""
    driver = facts.driver
    if driver.state != "ok" or not driver.gpus:
        return ()
    unlisted = len(facts.pci_cards or ()) > len(driver.gpus) + len(driver.unreadable)
    return fallen_off_bus(facts) if unlisted or missing_gpus(facts) else ()


def fallen_gpus_warning(s: Settings, facts: HostFacts) -> Optional[str]:
    """What preflight says of a card the kernel says fell off the bus while the driver lists the
    others: as of any card gone, the deploy goes on with the cards listed; the card is named by
    its PCI slot, with the cure."""
    fallen = fallen_beside_listed(facts)
    if not fallen:
        return None
    return (f"{_fallen_cards(fallen)} (the kernel: {fallen[0][1]}); listed: "
            + ", ".join(g.name for g in facts.driver.gpus) + ". Serving from the cards listed (a gone card's "
            f"unit retires until it is back). Fix: {ON_BUS_FIX}")  # fmt: skip


def _not_fallen(facts: HostFacts, missing: tuple) -> tuple:
    """The cards of ``missing`` that no kernel line says fell off the bus (``fallen_gpus_warning``
    names those): by the UUID the kernel tied to the slot; one card gone where one fell, without it."""
    fallen = fallen_beside_listed(facts)
    if not fallen:
        return missing
    uuids = {uuid for _, _, uuid in fallen if uuid}
    return () if not uuids and len(fallen) >= len(missing) else tuple(g for g in missing if g.uuid not in uuids)


def missing_gpus_warning(s: Settings, facts: HostFacts) -> Optional[str]:
    """What preflight says of recorded cards gone now: the deploy goes on with the cards listed (the
    server role retires a gone card's unit until it is back); the record keeps them until they return.
    A card the kernel says fell off the bus is ``fallen_gpus_warning``'s."""
    missing = _not_fallen(facts, missing_gpus(facts))
    if not missing:
        return None
    return ("recorded GPU(s) not listed by nvidia-smi now: " + ", ".join(f"{g.name} ({g.uuid})" for g in missing)
            + "; listed: " + ", ".join(g.name for g in facts.driver.gpus) + ". Serving from the cards listed "
            "(a gone card's unit retires until it is back). Check the card is seated and bound to the nvidia "
            f"driver (dmesg | grep NVRM); if it was removed on purpose, delete {s.layout.gpus_record}")  # fmt: skip


RULES = (rule_gpus_supported, rule_driver_loaded, rule_driver_floor, rule_driver_ceiling, rule_gpus_readable,
         rule_gpus_present, rule_gpus_whole)

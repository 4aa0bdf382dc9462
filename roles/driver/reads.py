"""Facts about the NVIDIA driver and the GPUs it sees."""

import json
import re
import shlex
from dataclasses import dataclass
from typing import Optional

from pyinfra.api import FactBase
from pyinfra.api.exceptions import FactProcessError

from llamarack import gpu_table
from llamarack.facts.value import FactValue

# Drivers before 510 do not know the compute_cap field; the fact then takes
# the card table's (by PCI device id), else this one (names as nvidia-smi
# prints them; only for output without a PCI id, e.g. an old record).
COMPUTE_CAP_BY_NAME = {
    # Kepler: the 470 branch is their last driver (a rule refuses them, naming that)
    "Tesla K80": "3.7",
    "Tesla K40": "3.5",
    "Tesla K20": "3.5",
    "Tesla K10": "3.0",
    "GeForce GTX 770": "3.0",
    "GeForce GTX 780": "3.5",
    "Tesla P100": "6.0",
    "Tesla P40": "6.1",
    "Tesla P4": "6.1",
    "Tesla V100": "7.0",
    "Tesla T4": "7.5",
    "Quadro GV100": "7.0",
    "TITAN V": "7.0",
    "NVIDIA TITAN V": "7.0",
    "NVIDIA A100": "8.0",
    "NVIDIA H100": "9.0",
    "NVIDIA H200": "9.0",
}

_MARK = "llamarack:"

# nvidia-smi's exit code when a card's infoROM is corrupted (its man page):
# a warning line, then the normal answer (pytorch/pytorch#87464).
EXIT_INFOROM_CORRUPTED = 14


@dataclass(frozen=True)
class Gpu(FactValue):
    index: int
    name: str
    uuid: str
    memory_mib: int
    compute_cap: Optional[str]
    driver_version: str
    pci_device_id: Optional[str] = None
    """nvidia-smi's ``pci.device_id`` ("0x1DB110DE"); None in older records."""
    missing: bool = False
    """In the record only: a card the driver no longer listed at the run that wrote it
    (kept so that it gets its unit back when it returns; never planned for)."""

    def to_json(self):
        out = super().to_json()
        if not self.missing:  # the cards nvidia-smi lists: their JSON as nvidia-smi's fields alone
            del out["missing"]
        return out

    @property
    def arch(self) -> Optional[str]:
        """The CUDA architecture number ("7.0" -> "70") used for -arch=sm_XX; None for none or an unreadable one."""
        return self.compute_cap.replace(".", "") if _is_compute_cap(self.compute_cap) else None


@dataclass(frozen=True)
class DriverState(FactValue):
    """What ``nvidia-smi`` says about the driver.

    state is one of:
    - ``ok``: the driver answers; ``gpus`` lists the GPUs;
    - ``missing``: no ``nvidia-smi`` on the host (no driver installed);
    - ``no_module``: the kernel module is not loaded (after a kernel upgrade
      without DKMS, or a blacklisted module);
    - ``mismatch``: user-space library and loaded module differ (a driver
      upgrade without reboot); ``library_version`` is the NVML library's;
    - ``no_devices``: the driver runs but lists no GPU ("No devices were
      found"), e.g. a driver branch that dropped the card;
    - ``error``: anything else; ``message`` holds nvidia-smi's words.

    In the ``ok`` state, ``message`` holds the lines that are no GPU (a
    driver's warning, "WARNING: infoROM is corrupted at gpu ..."), and
    ``unreadable`` the GPU lines that could not be read (a memory.total of
    [N/A]): the cards that can be read are kept, a rule refuses the rest."""

    state: str
    gpus: tuple[Gpu, ...] = ()
    library_version: Optional[str] = None
    message: str = ""
    unreadable: tuple[str, ...] = ()

    @property
    def driver_version(self) -> Optional[str]:
        return self.gpus[0].driver_version if self.gpus else None


class NvidiaSmi(FactBase[DriverState]):
    """Returns the driver state and GPU list from ``nvidia-smi --query-gpu``.

    The command always exits 0 and ends with ``llamarack: exit N`` (nvidia-smi's
    own exit code), so a broken driver is a fact value, not a failed fact.
    LC_ALL=C: the CSV and the messages matched here are the C locale's."""

    # pci.device_id last: every driver has it, and the card table reads it
    # when compute_cap is missing (before 510) or [N/A].
    FIELDS = "index,name,uuid,memory.total,compute_cap,driver_version,pci.device_id"
    FIELDS_PRE_510 = "index,name,uuid,memory.total,driver_version,pci.device_id"

    def command(self) -> str:
        query = "nvidia-smi --query-gpu={} --format=csv,noheader,nounits 2>&1"
        return ("export LC_ALL=C; "
                f"if ! command -v nvidia-smi >/dev/null 2>&1; then echo '{_MARK} missing'; exit 0; fi; "
                f"out=$({query.format(self.FIELDS)}); rc=$?; "
                'case "$out" in *"is not a valid field"*) '
                f"out=$({query.format(self.FIELDS_PRE_510)}); rc=$?;; esac; "
                f'printf "%s\\n" "$out"; echo "{_MARK} exit $rc"')

    def process(self, output) -> DriverState:
        lines = [line for line in output if line.strip()]
        if lines == [f"{_MARK} missing"]:
            return DriverState("missing")
        if not lines or not lines[-1].startswith(f"{_MARK} exit "):
            raise FactProcessError(f"unexpected nvidia-smi fact output: {output!r}")

        exit_code = int(lines[-1].split()[-1])
        body = lines[:-1]
        text = "\n".join(body)
        if "couldn't communicate with the NVIDIA driver" in text:
            return DriverState("no_module", message=text)
        if "Driver/library version mismatch" in text:
            match = re.search(r"NVML library version: (\S+)", text)
            return DriverState("mismatch", library_version=match and match.group(1), message=text)
        if "No devices were found" in text:
            return DriverState("no_devices", message=text)
        if exit_code not in (0, EXIT_INFOROM_CORRUPTED):
            return DriverState("error", message=text)
        return _parse_gpu_lines(body)


# A GPU line starts with its index; anything else nvidia-smi printed is a
# warning about the driver or a card, not a card.
_GPU_LINE = re.compile(r"\s*\d+\s*,")
_PCI_DEVICE_ID = re.compile(r"0x[0-9A-Fa-f]{8}")


def _parse_gpu_lines(body) -> DriverState:
    """One card per line: keep those that read, name the others (a rule refuses them)."""
    cards = [(line, _parse_gpu_line(line)) for line in body if _GPU_LINE.match(line)]
    return DriverState("ok", gpus=tuple(gpu for _, gpu in cards if gpu),
                       message="\n".join(line for line in body if not _GPU_LINE.match(line)),
                       unreadable=tuple(line for line, gpu in cards if gpu is None))


def _parse_gpu_line(line: str) -> Optional[Gpu]:
    """A card from its CSV line, or None when a field it needs is unreadable.

    Four layouts: this fact's query (7 fields), its pre-510 query (6, ending
    with the PCI id) and the two earlier queries without the PCI id (6 with
    compute_cap, 5 without), which old recorded outputs still have."""
    values = [v.strip() for v in line.split(",")]
    pci = None
    if values and _PCI_DEVICE_ID.fullmatch(values[-1]) and len(values) in (6, 7):
        pci = values.pop()
    if len(values) == 5:
        values.insert(4, None)  # no compute_cap
    if len(values) != 6:
        return None
    index, name, uuid, memory, cap, driver = values
    if not memory.isdigit() or not index.isdigit():
        return None
    if not _is_compute_cap(cap):
        by_name = (c for prefix, c in COMPUTE_CAP_BY_NAME.items() if name.startswith(prefix))
        cap = gpu_table.compute_cap(pci) or next(by_name, None)
    return Gpu(int(index), name, uuid, int(memory), cap, driver, pci)


def _is_compute_cap(text: Optional[str]) -> bool:
    """"7.0" is; "[N/A]", "N/A" or nothing is not (the table fills it then)."""
    return bool(text) and re.fullmatch(r"\d+\.\d+", text) is not None


@dataclass(frozen=True)
class KernelModule(FactValue):
    version: str
    open: bool


class NvidiaKernelModule(FactBase[Optional[KernelModule]]):
    """Returns the loaded NVIDIA kernel module's version from ``/proc/driver/nvidia/version``,
    or None when no module is loaded."""

    def command(self) -> str:
        return "cat /proc/driver/nvidia/version 2>/dev/null || true"

    def process(self, output) -> Optional[KernelModule]:
        for line in output:
            if line.startswith("NVRM version:"):
                match = re.search(r"Kernel Module(?: for \S+)?\s+(\d+(?:\.\d+)+)", line)
                if not match:
                    raise FactProcessError(f"unexpected NVRM line: {line!r}")
                return KernelModule(match.group(1), open="Open Kernel Module" in line)
        return None


@dataclass(frozen=True)
class CharDevice(FactValue):
    major: int
    name: str


class CharDevices(FactBase[tuple]):
    """Returns the character devices the kernel has registered (``/proc/devices``,
    its "Character devices:" section), as ``CharDevice(major, name)`` in the
    kernel's order. systemd's ``DeviceAllow=char-NAME`` matches these names, and
    the NVIDIA driver's changed in 550.40 (``nvidia-frontend`` became ``nvidia``
    and ``nvidiactl``), so the served unit allows what the host's driver registered."""

    def command(self) -> str:
        return "cat /proc/devices"

    default = staticmethod(tuple)

    def process(self, output) -> tuple:
        devices, section = [], None
        for line in output:
            if line.strip().endswith("devices:"):
                section = line.strip()
            elif section == "Character devices:" and line.strip():
                major, _, name = line.strip().partition(" ")
                if not major.isdigit() or not name.strip():
                    raise FactProcessError(f"unexpected /proc/devices line: {line!r}")
                devices.append(CharDevice(int(major), name.strip()))
        if section is None:
            raise FactProcessError(f"unexpected /proc/devices output: {output[:3]!r}")
        return tuple(devices)


class RecordedGpus(FactBase[tuple]):
    """Returns the GPUs llamarack recorded at the last run where the driver answered (a JSON
    list in the state directory), or ``()``; their ``driver_version`` is empty (not recorded).
    A driver that dropped a card, or an upgrade waiting for a reboot, hides the GPU list; the
    record still says which cards the host has. A record that is not whole JSON counts as
    none (the run writes it again), never as a failure that would stop the host every run."""

    def command(self, path: str) -> str:
        return f"cat {shlex.quote(path)} 2>/dev/null || true"

    default = staticmethod(tuple)

    def process(self, output) -> tuple:
        try:
            items = json.loads("\n".join(output).strip())
        except ValueError:
            return ()  # none, or torn: as if never written (the docstring says why)
        try:
            return tuple(Gpu(**item, driver_version="") for item in items)
        except TypeError as e:  # whole JSON of another shape: not ours to overwrite
            raise FactProcessError(f"unreadable GPU record: {e}") from e


def gpus_record(gpus) -> str:
    """The JSON that ``RecordedGpus`` reads back: the cards only, not the driver (a driver upgrade
    must not rewrite it: a converged host changes nothing; the driver is read live anyway)."""
    cards = [gpu.to_json() for gpu in gpus]  # "missing" only where set: records written before the flag stay
    for card in cards:
        del card["driver_version"]
        if card["pci_device_id"] is None:  # an output without one: records written before it stay as they are
            del card["pci_device_id"]
    return json.dumps(cards, indent=1, sort_keys=True) + "\n"


@dataclass(frozen=True)
class GpuProcess(FactValue):
    pid: int
    name: str
    used_mib: Optional[int]
    gpu_uuid: str


# The start of a query that answers nothing (the fact's default) on a host without nvidia-smi.
SMI_PRESENT = "export LC_ALL=C; command -v nvidia-smi >/dev/null 2>&1 || exit 0; "


class GpuProcesses(FactBase[tuple]):
    """Returns the processes that hold GPU memory, as ``nvidia-smi --query-compute-apps``
    lists them; empty when there are none or no working driver (the GPU facts say why)."""

    def command(self) -> str:
        return (SMI_PRESENT + "nvidia-smi --query-compute-apps=pid,process_name,used_gpu_memory,gpu_uuid "
                "--format=csv,noheader,nounits 2>/dev/null; true")  # fmt: skip

    default = staticmethod(tuple)

    def process(self, output) -> tuple:
        processes, pending = [], None
        for line in output:
            if pending is None and (not line.strip() or line.startswith("No running processes")):
                continue
            # A line that does not read is a name broken by a newline: read with the next.
            text = line if pending is None else f"{pending}\n{line}"
            if process := compute_app(text):
                processes.append(process)
            pending = None if process else text
        if pending is not None:
            raise FactProcessError(f"unexpected compute-apps line: {pending!r}")
        return tuple(processes)


def compute_app(line: str) -> Optional[GpuProcess]:
    """One line of ``--query-compute-apps=pid,process_name,used_gpu_memory,gpu_uuid``, or None.

    nvidia-smi's CSV quotes nothing, so a process name may hold ", ": the pid is the
    first field, the memory and the card's UUID the last two, the name all between."""
    fields = line.split(",")
    if len(fields) < 4:
        return None
    pid, used, uuid = (f.strip() for f in (fields[0], *fields[-2:]))
    if not pid.isdigit() or not re.fullmatch(r"[A-Z]+-[0-9A-Za-z-]+", uuid):
        return None
    used_mib = int(used) if used.isdigit() else None  # [N/A] without permission
    return GpuProcess(int(pid), ",".join(fields[1:-2]).strip(), used_mib, uuid)


# Packages that make up an NVIDIA driver on Debian (nvidia-driver, libnvidia-*,
# nvidia-kernel-dkms, libcuda1, the GL/EGL/Vulkan/OpenCL/VDPAU ones: every binary
# package of nvidia-graphics-drivers, which depend on each other at exactly one
# version), Ubuntu (nvidia-driver-550, nvidia-dkms-550, nvidia-utils-550,
# libnvidia-compute-550, linux-modules-nvidia-550-*...) and NVIDIA's CUDA
# repository (cuda-drivers-550, nvidia-open, nvidia-fabricmanager-550...). The
# toolkit's packages (nvidia-cuda-toolkit, nvidia-cuda-dev...) are not the driver
# and stay out: holding them would block toolkit updates for no reason.
DRIVER_PACKAGE = re.compile(
    r"nvidia-driver.*|nvidia-kernel-.*|nvidia-dkms-.*|nvidia-utils-.*|nvidia-compute-utils-.*"
    r"|nvidia-smi|nvidia-alternative|nvidia-persistenced|nvidia-modprobe|nvidia-firmware-.*"
    r"|nvidia-open(-[0-9].*)?|nvidia-headless-.*|libnvidia-.*|libcuda1|libnvcuvid1|cuda-drivers.*"
    r"|firmware-nvidia-.*|xserver-xorg-video-nvidia.*"
    r"|linux-(modules|objects|signatures)-nvidia-.*"
    r"|lib(gl1|glx|egl|gles)[0-9]*-nvidia.*|libnvoptix1|libcudadebugger1|nvidia-(egl|vulkan|opencl)-(icd|common)"
    r"|nvidia-vdpau-driver|nvidia-cuda-mps|nvidia-suspend-common|nvidia-legacy-check|nvidia-fabricmanager.*"
)


@dataclass(frozen=True)
class DebPackage(FactValue):
    name: str
    version: str
    held: bool
    """dpkg's selection is ``hold`` (what ``apt-mark hold`` sets)."""


class NvidiaDriverPackages(FactBase[tuple]):
    """Returns the installed NVIDIA driver packages with their version and hold state.

    dpkg's selection state is the first word of ``${Status}``: ``hold`` after
    ``apt-mark hold``, ``install`` otherwise, so one query answers both."""

    def requires_command(self) -> str:
        return "dpkg-query"

    def command(self) -> str:
        # ${binary:Package}: "libnvidia-ml1:i386" for a foreign architecture's copy (and
        # ":amd64" on a Multi-Arch: same package), so each copy is held by its own name
        return "dpkg-query -W -f='${binary:Package}\\t${Version}\\t${Status}\\n'"

    default = staticmethod(tuple)

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


@dataclass(frozen=True)
class PciCard(FactValue):
    slot: str
    pci_device_id: str
    """As nvidia-smi writes it: "0x1DB110DE" (device 0x1DB1 of vendor 0x10DE)."""
    driver: Optional[str]
    """The kernel driver bound to it (``nvidia``, ``nouveau``), None when none is."""
    name: Optional[str]
    compute_cap: Optional[str]
    """From the card table by device id; None for a card not in it."""


class NvidiaPciCards(FactBase[tuple]):
    """Returns the NVIDIA display and 3D controllers on the PCI bus (``/sys/bus/pci/devices``,
    vendor 0x10de, class 0x03xxxx), with the driver bound to each and the card table's
    name and compute capability: what the host has whether or not a driver answers."""

    def command(self) -> str:
        return ('for d in /sys/bus/pci/devices/*; do [ "$(cat "$d/vendor" 2>/dev/null)" = 0x10de ] || continue; '
                'c=$(cat "$d/class"); case "$c" in 0x03*) ;; *) continue ;; esac; drv=-; '
                '[ -e "$d/driver" ] && drv=$(basename "$(readlink "$d/driver")"); '
                'echo "${d##*/} $(cat "$d/device") $c $drv"; done')  # fmt: skip

    default = staticmethod(tuple)

    def process(self, output) -> tuple:
        cards = []
        for line in output:
            fields = line.split()
            if len(fields) != 4 or not re.fullmatch(r"0x[0-9a-fA-F]{4}", fields[1]):
                raise FactProcessError(f"unexpected PCI line: {line!r}")
            pci_id = f"0x{fields[1][2:].upper()}10DE"
            card = gpu_table.board(pci_id)
            cards.append(PciCard(fields[0], pci_id, None if fields[3] == "-" else fields[3],
                                 card.name if card else None, card.compute_cap if card else None))  # fmt: skip
        return tuple(cards)


# The kernel's words for a card that stopped answering on the PCI bus (Xid 79), in each form the
# driver prints: "NVRM: Xid (PCI:0000:3b:00): 79, pid=..., GPU has fallen off the bus.", "NVRM:
# GPU 0000:3b:00.0: GPU has fallen off the bus.", and at probe, over three lines, "NVRM: The
# NVIDIA GPU 0000:b3:00.0" / "NVRM: (PCI ID: 10de:26b5) installed in this system has" / "NVRM:
# fallen off the bus and is not responding to commands."
FELL_OFF_BUS = re.compile(r"fallen off the bus", re.I)
# A card's PCI address in an NVRM line ("PCI:0000:3b:00", "GPU 0000:3b:00.0"), and the line that
# ties an address to a card's UUID ("NVRM: GPU at PCI:0000:3b:00: GPU-3c1f0a2e-...").
_PCI_ADDRESS = re.compile(r"(?:PCI:|GPU )(?:([0-9a-fA-F]{4,8}):)?([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\b")
_GPU_AT = re.compile(r"GPU at PCI:(?:([0-9a-fA-F]{4,8}):)?([0-9a-fA-F]{2}):([0-9a-fA-F]{2}): (GPU-[0-9a-fA-F-]+)")


def pci_address(domain: Optional[str], bus: str, device: str) -> str:
    """A card's PCI address as the kernel names its slot, domain:bus:device in lowercase
    ("0000:3b:00"; nvidia-smi writes the domain in 8 digits, "00000000:3B:00.0")."""
    return f"{(domain or '0')[-4:].zfill(4)}:{bus}:{device}".lower()


@dataclass(frozen=True)
class KernelLog(FactValue):
    lines: tuple
    """The kernel's last NVRM and nouveau lines of this boot (at most 40)."""
    module_file: Optional[str]
    """The nvidia module file for the running kernel, None when there is none."""

    def fallen_off_bus(self) -> dict:
        """{PCI address ("0000:3b:00"): the kernel's words} of each card it says fell off the bus this
        boot, the address read from that line or, for the probe's three lines, the two before it
        (then the words are the line that names the card, "...", and the one that says it fell)."""
        fallen: dict = {}
        for i, line in enumerate(self.lines):
            if not FELL_OFF_BUS.search(line):
                continue
            named = next((text for text in (line, *reversed(self.lines[max(0, i - 2):i]))
                          if _PCI_ADDRESS.search(text)), None)  # fmt: skip
            if named:
                words = line.strip() if named is line else f"{named.strip()} ... {line.strip()}"
                fallen.setdefault(pci_address(*_PCI_ADDRESS.search(named).groups()), words)
        return fallen

    def uuids(self) -> dict:
        """{PCI address: the card's UUID} where the kernel tied them ("GPU at PCI:...: GPU-...")."""
        return {pci_address(*m.groups()[:3]): m.group(4) for line in self.lines if (m := _GPU_AT.search(line))}


class NvidiaKernelLog(FactBase[KernelLog]):
    """Returns what the kernel said of the NVIDIA driver this boot (``dmesg``, else
    ``journalctl -k``: its NVRM and nouveau lines, the last 40) and whether a
    module file exists for the running kernel: why a module is not loaded."""

    MARK = "llamarack-module-file:"

    def command(self) -> str:
        return ("{ dmesg 2>/dev/null || journalctl -k -b -q --no-pager -o cat 2>/dev/null; } "
                "| grep -E 'NVRM|nouveau' | tail -n 40; "
                f"echo \"{self.MARK} $(find /lib/modules/$(uname -r) -name 'nvidia.ko*' 2>/dev/null | head -n 1)\"")

    def default(self) -> KernelLog:
        return KernelLog((), None)

    def process(self, output) -> KernelLog:
        lines = [line for line in output if not line.startswith(self.MARK)]
        marks = [line[len(self.MARK):].strip() for line in output if line.startswith(self.MARK)]
        if not marks:
            raise FactProcessError(f"no module line in {output[-3:]!r}")
        # dmesg's "[   12.345678] " stamp off: the message is what names a cause
        return KernelLog(tuple(re.sub(r"^\[\s*[\d.]+\]\s*", "", line) for line in lines), marks[-1] or None)


@dataclass(frozen=True)
class MigState(FactValue):
    index: int
    mode: str
    """nvidia-smi's ``mig.mode.current``: "Enabled", "Disabled", or "[N/A]" (no MIG)."""
    instances: tuple
    """The MIG devices CUDA sees on the card (``nvidia-smi -L``: "3g.20gb", ...)."""


class MigStates(FactBase[tuple]):
    """Returns each card's MIG mode and the MIG devices on it: with MIG on, CUDA sees
    the instances (20 GB each on an A100 split in two), or nothing when none is made,
    never the whole card that ``--query-gpu`` lists. ``()`` where the driver cannot say."""

    def command(self) -> str:
        return (SMI_PRESENT + "nvidia-smi --query-gpu=index,mig.mode.current --format=csv,noheader 2>/dev/null; "
                "nvidia-smi -L 2>/dev/null; true")  # fmt: skip

    default = staticmethod(tuple)

    def process(self, output) -> tuple:
        modes, instances, card = {}, {}, None
        for line in output:
            if m := re.fullmatch(r"(\d+), (Enabled|Disabled|\[N/A\]|N/A)", line.strip()):
                modes[int(m.group(1))] = m.group(2)
            elif m := re.match(r"GPU (\d+): ", line):
                card = int(m.group(1))
            elif (m := re.match(r"\s+MIG (\S+)\s+Device\s+\d+:", line)) and card is not None:
                instances.setdefault(card, []).append(m.group(1))
        return tuple(MigState(i, mode, tuple(instances.get(i, ()))) for i, mode in sorted(modes.items()))


@dataclass(frozen=True)
class CardLink(FactValue):
    first: int
    second: int
    link: str
    """As ``nvidia-smi topo -m`` writes it: "NV2" (a bonded set of two NVLinks), or the PCIe
    path: "PIX", "PXB", "PHB", "NODE", "SYS" ("SOC" on old drivers)."""

    @property
    def nvlinks(self) -> int:
        """The NVLinks between the two cards (0: PCIe only)."""
        return int(self.link[2:]) if self.link.startswith("NV") else 0


@dataclass(frozen=True)
class Topology(FactValue):
    cards: tuple
    """The indexes of the cards the matrix has (nvidia-smi's numbering)."""
    links: tuple
    """A ``CardLink`` for each two cards (``first`` < ``second``) whose link reads the same both ways."""
    problem: str = ""
    """What could not be read (a driver's error, a value that is no link, a matrix that
    disagrees with itself); empty when the whole matrix read."""


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_LINK = re.compile(r"X|NV\d+|PIX|PXB|PHB|NODE|SYS|SOC")
_CARD = re.compile(r"GPU(\d+)")


class GpuTopology(FactBase[Topology]):
    """Returns how each two cards are linked, from ``nvidia-smi topo -m``: NVLink (how many) or
    the PCIe path. Whatever the output holds, the answer is a value: what does not read is
    named in ``problem`` (the cards and links that read are kept).

    The header is underlined (ANSI) on a terminal; the columns are tab-separated, and
    columns of network cards and the CPU and NUMA affinity follow the cards'."""

    def command(self) -> str:
        return SMI_PRESENT + "nvidia-smi topo -m 2>&1; true"

    def default(self) -> Topology:
        return Topology((), ())

    def process(self, output) -> Topology:
        rows = [_ANSI.sub("", line).split() for line in output]
        header = next((r for r in rows if r[:1] == ["GPU0"] and not _LINK.fullmatch(r[1] if len(r) > 1 else "X")), None)
        if header is None:
            return Topology((), (), " ".join(word for row in rows for word in row)[:300])
        count = next((i for i, word in enumerate(header) if word != f"GPU{i}"), len(header))
        matrix = {int(m.group(1)): r[1:1 + count] for r in rows if r and r is not header and (m := _CARD.fullmatch(r[0]))}
        problems = [f"no row of GPU{i}" for i in range(count) if len(matrix.get(i, ())) != count]
        problems += [f"GPU{i} reads {_cell(matrix, i, i)!r} to itself" for i in range(count)
                     if len(matrix.get(i, ())) == count and matrix[i][i] != "X"]  # fmt: skip
        links = []
        for first in range(count):
            for second in range(first + 1, count):
                link, back = (_cell(matrix, first, second), _cell(matrix, second, first))
                if link != back:
                    problems.append(f"GPU{first}-GPU{second} reads {link!r} one way and {back!r} the other")
                elif not _LINK.fullmatch(link) or link == "X":
                    problems.append(f"GPU{first}-GPU{second} reads {link!r}, no link")
                else:
                    links.append(CardLink(first, second, link))
        return Topology(tuple(range(count)), tuple(links), "; ".join(problems))


def _cell(matrix: dict, row: int, column: int) -> str:
    values = matrix.get(row, ())
    return values[column] if column < len(values) else ""


def topology_summary(topology: Topology) -> str:
    """One line of the links per card pair: "8 cards; NVLink between 0-1:NV1 0-2:NV1 ...;
    PCIe only between 0-5:SYS ..."."""
    if not topology.cards:
        return f"no topology: {topology.problem}" if topology.problem else "no cards"
    parts = [f"{len(topology.cards)} card" + ("s" if len(topology.cards) > 1 else "")]
    for title, kept in (("NVLink between", lambda link: link.nvlinks), ("PCIe only between", lambda link: not link.nvlinks)):
        pairs = [f"{link.first}-{link.second}:{link.link}" for link in topology.links if kept(link)]
        if pairs:
            parts.append(f"{title} {' '.join(pairs)}")
    if topology.problem:
        parts.append(f"unread: {topology.problem}")
    return "; ".join(parts)

#!/usr/bin/python3
"""Fake nvidia-smi for llamarack lab hosts (the one allowed test double).

Installed as /usr/bin/nvidia-smi by the lab's `nvidia-smi` package. It
prints what a real driver prints, in the real formats (captured from a
real H200 host with driver 580.159.04; see tests/fixtures/nvidia-smi/):

- GPUs come from /etc/llamarack-lab/gpus.json (what hardware the host has),
  listed when the running module's branch supports them: past the 580
  branch, cards below compute capability 7.5 are ignored, and a host with
  only such cards has no module at all (the loader refuses, as the real
  module's probe finds "No NVIDIA GPU");
- a card the lab took off the bus (/etc/llamarack-lab/cards-off.json, its
  UUID: ``llamarack lab driver HOST --card-off N``) is not listed, and the
  others are numbered without it, as after a card fell off the bus;
- compute processes are, as the real driver lists them, the running ones on
  the cards: each llama-server whose environment's CUDA_VISIBLE_DEVICES
  names listed cards (by UUID or index) holds its --model file's size on
  them, shared by its --tensor-split (else by the cards' memory), as llama.cpp
  lays the layers out; the lab can hide them (gpu-processes-hidden.json:
  all, or by pid or systemd unit), as a driver that drops the served PID;
  /etc/llamarack-lab/gpu-processes.json, when a lab test writes it
  (``llamarack_lab.driver.set_gpu_processes``), lists them instead: pid,
  name, MiB and card of each. They are listed by ``--query-compute-apps``,
  the table and ``-q``, and counted in the card's memory.used (real formats:
  tests/fixtures/nvidia-smi/h200-driver-580.159.04-processes/);
- ``nvidia-smi topo -m`` prints the links between the listed cards that
  gpus.json names (each card's ``links`` by peer UUID, its CPU affinity and
  NUMA node) in the real layout of current drivers (tab-separated, the
  header underlined on a terminal, the legend after);
- the "kernel module" version is read from /proc/driver/nvidia/version,
  written at boot by nvidia-kernel-support's nvidia-module.service;
- the user-space library version is the suffix of the installed
  /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.<version> marker (libnvidia-ml1's).

So an upgraded package without a reboot gives the NVML version mismatch,
and no loaded module gives the "couldn't communicate" failure, with the
real messages and exit codes. LLAMARACK_FAKE_NVIDIA_ROOT prefixes all
paths and LLAMARACK_FAKE_NVIDIA_NOW (Unix seconds) sets the clock of the
date lines (unit tests only). Standard library only: it runs on the guest.

The package installs this module under /usr/lib/llamarack-lab, compiled at
install, and /usr/bin/nvidia-smi imports it (``python3 -I -S``): the real
nvidia-smi is a compiled program, and a double that re-compiles 300 lines
each call cost every host's audit 10 ms a call.
"""

import os
import sys
import time
from functools import lru_cache
from json import loads

ROOT = os.environ.get("LLAMARACK_FAKE_NVIDIA_ROOT", "")
PROC_VERSION = ROOT + "/proc/driver/nvidia/version"
LIB_DIR = ROOT + "/usr/lib/x86_64-linux-gnu"
LIB_PREFIX = "libnvidia-ml.so."  # then the version: libnvidia-ml.so.550.127.05
GPUS_JSON = ROOT + "/etc/llamarack-lab/gpus.json"
PROCESSES_JSON = ROOT + "/etc/llamarack-lab/gpu-processes.json"
HIDDEN_JSON = ROOT + "/etc/llamarack-lab/gpu-processes-hidden.json"
CARDS_OFF_JSON = ROOT + "/etc/llamarack-lab/cards-off.json"
PROC = ROOT + "/proc"
MIB = 1 << 20

# The 580 branch is the last that supports Maxwell, Pascal and Volta: a later module
# ignores cards below compute capability 7.5 (roles/driver/rules.py, driver-ceiling).
LEGACY_LAST_BRANCH = 580
LEGACY_BELOW_CAP = (7, 5)

# driver branch -> highest CUDA version it supports (what nvidia-smi shows)
CUDA_BY_BRANCH = {
    590: "13.1", 580: "13.0", 575: "12.9", 570: "12.8", 565: "12.7",
    560: "12.6", 555: "12.5", 550: "12.4", 545: "12.3", 535: "12.2",
    530: "12.1", 525: "12.0", 520: "11.8", 515: "11.7", 510: "11.6",
    470: "11.4", 460: "11.2", 450: "11.0", 440: "10.2", 418: "10.1",
}

MSG_NO_DRIVER = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA "
    "driver. Make sure that the latest NVIDIA driver is installed and "
    "running.\n\n"
)
MSG_NO_DEVICES = "No devices were found\n"
EXIT_NO_DEVICES = 6  # what the real one exits with when it lists no GPU
EXIT_NO_DRIVER = 9
EXIT_MISMATCH = 18
EXIT_BAD_ARG = 2


def _now() -> str:
    """The time as the real nvidia-smi prints it: C's asctime, the day padded with a space
    ("Fri Dec  4 14:04:05 2026")."""
    fixed = os.environ.get("LLAMARACK_FAKE_NVIDIA_NOW")
    return time.asctime(time.localtime(float(fixed) if fixed else None))


def cuda_version(driver):
    branch = int(driver.split(".")[0])
    known = [b for b in CUDA_BY_BRANCH if b <= branch]
    return CUDA_BY_BRANCH[max(known)] if known else "N/A"


def module_version():
    try:
        text = open(PROC_VERSION).read()
    except OSError:
        return None
    # "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.127.05  <date>" (or "Kernel Module for x86_64")
    for marker in ("Kernel Module for x86_64", "Kernel Module"):
        if marker in text:
            words = text.split(marker, 1)[1].split()
            return words[0] if words else None
    return None


def _is_version(text):
    parts = text.split(".")
    return 2 <= len(parts) <= 3 and all(p.isdigit() for p in parts)


def library_version():
    try:
        names = sorted(os.listdir(LIB_DIR))
    except OSError:
        return None
    for name in names:
        if name.startswith(LIB_PREFIX) and _is_version(name[len(LIB_PREFIX):]):
            return name[len(LIB_PREFIX):]
    return None


# PCI device ids ("0x<device><vendor>", as pci.device_id prints them) of the
# lab's boards, for a gpus.json without "pci_device_id" (pci.ids, vendor 10de;
# the H200's from the real capture).
PCI_DEVICE_ID_BY_NAME = {
    "Tesla V100-SXM2-16GB": "0x1DB110DE", "Tesla V100-SXM2-32GB": "0x1DB510DE",
    "Tesla V100-PCIE-16GB": "0x1DB410DE", "NVIDIA GeForce RTX 3090": "0x220410DE",
    "Tesla T4": "0x1EB810DE", "Tesla P100-PCIE-16GB": "0x15F810DE",
    "Tesla P40": "0x1B3810DE", "NVIDIA H200": "0x233510DE",
}


def pci_device_id(gpu):
    return gpu.get("pci_device_id") or PCI_DEVICE_ID_BY_NAME.get(gpu["name"], "0x000010DE")


def _load(path):
    try:
        with open(path) as f:
            return loads(f.read())
    except OSError:
        return []


def load_gpus():
    """The host's cards (gpus.json), whatever the driver."""
    return _load(GPUS_JSON)


def supported(gpu, driver):
    """Whether a module of ``driver`` drives the card."""
    if driver_major(driver) <= LEGACY_LAST_BRANCH:
        return True
    return tuple(int(x) for x in gpu["compute_cap"].split(".")) >= LEGACY_BELOW_CAP


def listed_gpus(driver):
    """The cards the running module of ``driver`` drives and that are on the bus, as it numbers them."""
    off = set(_load(CARDS_OFF_JSON))
    return [g for g in load_gpus() if supported(g, driver) and g["uuid"] not in off]


def processes_on(gpus):
    """The compute processes on ``gpus``: those a lab test set, in the file's order, else
    the running ones the lab does not hide, by pid."""
    uuids = {g["uuid"] for g in gpus}
    return [p for p in compute_processes() if p["gpu_uuid"] in uuids]


@lru_cache(maxsize=None)
def compute_processes():
    if os.path.exists(PROCESSES_JSON):
        return tuple(_load(PROCESSES_JSON))
    hidden = _load(HIDDEN_JSON) or {}
    return tuple(p for p in running_processes(listed_gpus(module_version() or ""))
                 if not (hidden.get("all") or p["pid"] in hidden.get("pids", ())
                         or p["unit"] in hidden.get("units", ())))  # fmt: skip


def _proc_text(pid, name):
    try:
        with open("%s/%s/%s" % (PROC, pid, name), "rb") as f:
            return f.read().decode(errors="replace")
    except OSError:
        return None


def running_processes(gpus):
    """Each running llama-server on the ``gpus`` its CUDA_VISIBLE_DEVICES names, with its
    share of the model file it serves, a process per card, by pid."""
    found = []
    for pid in sorted(int(d) for d in os.listdir(PROC) if d.isdigit()) if os.path.isdir(PROC) else ():
        argv = (_proc_text(pid, "cmdline") or "").split("\0")
        environ = dict(v.partition("=")[::2] for v in (_proc_text(pid, "environ") or "").split("\0") if "=" in v)
        if os.path.basename(argv[0]) != "llama-server" or "CUDA_VISIBLE_DEVICES" not in environ:
            continue
        cards = visible_cards(environ["CUDA_VISIBLE_DEVICES"], gpus)
        size = model_size(pid, argv)
        unit = unit_of(pid)
        for card, share in zip(cards, shares(argv, cards)):
            found.append({"pid": pid, "name": argv[0], "used_mib": -(-int(size * share) // MIB),
                          "gpu_uuid": card["uuid"], "unit": unit})  # fmt: skip
    return found


def unit_of(pid):
    """The systemd unit of a process (the last part of its cgroup path), or ""."""
    path = (_proc_text(pid, "cgroup") or "").strip().split("\n")[-1].rpartition(":")[2]
    return path.rstrip("/").rpartition("/")[2]


def visible_cards(value, gpus):
    """The cards CUDA_VISIBLE_DEVICES names, in its order, as CUDA reads it: an index of the
    driver's numbering or a UUID (or its unique start); the first entry that names none ends it."""
    cards = []
    for entry in (e.strip() for e in value.split(",")):
        named = [g for g in gpus if entry.startswith("GPU-") and g["uuid"].startswith(entry)]
        if entry.isdigit() and int(entry) < len(gpus):
            named = [gpus[int(entry)]]
        if len(named) != 1:
            break
        if named[0] not in cards:
            cards.append(named[0])
    return cards


def option(argv, *names):
    """The value of a command line option (``-m PATH``, ``--model PATH``, ``--model=PATH``), or None."""
    for i, arg in enumerate(argv):
        if arg in names and i + 1 < len(argv):
            return argv[i + 1]
        if arg.partition("=")[0] in names and "=" in arg:
            return arg.partition("=")[2]
    return None


def model_size(pid, argv):
    """The size in bytes of the model file a llama-server serves (0 when it cannot be read)."""
    model = option(argv, "-m", "--model")
    if not model:
        return 0
    try:  # a relative path from the process's working directory
        return os.stat(os.path.join("%s/%d/cwd" % (PROC, pid), model)).st_size
    except OSError:
        return 0


def shares(argv, cards):
    """Each card's part of the layers: --tensor-split's proportions, else the cards' memory."""
    text = option(argv, "-ts", "--tensor-split") or ""
    try:
        weights = [float(w) for w in text.replace("/", ",").split(",")] if text else []
    except ValueError:
        weights = []
    weights = (weights + [0.0] * len(cards))[:len(cards)]
    if not sum(weights):
        weights = [c["memory_mib"] for c in cards]
    return [w / sum(weights) for w in weights]


def by_card(gpus):
    """(card, process) of each process on ``gpus``, card by card as the driver lists them."""
    return [(g, p) for g in gpus for p in processes_on([g])]


def used_mib(gpu):
    """The card's memory in use: what the driver keeps, and its processes'."""
    return gpu.get("memory_used_mib", 0) + sum(p["used_mib"] for p in processes_on([gpu]))


# --- query fields --------------------------------------------------------
# canonical name -> (header, unit or None, getter(gpu, index, driver))
FIELDS = {
    "index": ("index", None, lambda g, i, d: str(i)),
    "count": ("count", None, lambda g, i, d: str(len(listed_gpus(d)))),
    "name": ("name", None, lambda g, i, d: g["name"]),
    "uuid": ("uuid", None, lambda g, i, d: g["uuid"]),
    "driver_version": ("driver_version", None, lambda g, i, d: d),
    "memory.total": ("memory.total", "MiB", lambda g, i, d: str(g["memory_mib"])),
    "memory.used": ("memory.used", "MiB", lambda g, i, d: str(used_mib(g))),
    "memory.free": ("memory.free", "MiB", lambda g, i, d: str(g["memory_mib"] - used_mib(g))),
    "compute_cap": ("compute_cap", None, lambda g, i, d: g["compute_cap"]),
    "pci.bus_id": ("pci.bus_id", None, lambda g, i, d: g["bus_id"]),
    "pci.device_id": ("pci.device_id", None, lambda g, i, d: pci_device_id(g)),
    "pstate": ("pstate", None, lambda g, i, d: g.get("pstate", "P0")),
    "temperature.gpu": ("temperature.gpu", None, lambda g, i, d: str(g.get("temperature_c", 37))),
    "power.limit": ("power.limit", "W", lambda g, i, d: "%.2f" % g.get("power_cap_w", 300)),
}
ALIASES = {
    "gpu_name": "name", "gpu_uuid": "uuid", "gpu_bus_id": "pci.bus_id",
    "compute_capability": "compute_cap", "enforced.power.limit": "power.limit",
}
# --query-compute-apps: canonical name -> (header, unit or None, getter(process, gpu))
APP_FIELDS = {
    "pid": ("pid", None, lambda p, g: str(p["pid"])),
    "process_name": ("process_name", None, lambda p, g: p["name"]),
    "used_gpu_memory": ("used_gpu_memory", "MiB", lambda p, g: str(p["used_mib"])),
    "gpu_uuid": ("gpu_uuid", None, lambda p, g: p["gpu_uuid"]),
    "gpu_name": ("gpu_name", None, lambda p, g: g["name"]),
    "gpu_bus_id": ("gpu_bus_id", None, lambda p, g: g["bus_id"]),
}
APP_ALIASES = {"name": "process_name", "used_memory": "used_gpu_memory"}


def query(fields_arg, fmt_arg, driver, fields=FIELDS, aliases=ALIASES):
    """(fields, noheader, nounits) of a query, or the exit status of a bad one."""
    opts = [o.strip() for o in fmt_arg.split(",")]
    if not opts or opts[0] != "csv":
        sys.stdout.write('"%s" is not a valid format.\n\n' % fmt_arg)
        return EXIT_BAD_ARG
    chosen = []
    for raw in fields_arg.split(","):
        name = raw.strip()
        canon = aliases.get(name, name)
        if canon not in fields or (canon == "compute_cap" and driver_major(driver) < 510):
            sys.stdout.write('Field "%s" is not a valid field to query.\n\n' % name)
            return EXIT_BAD_ARG
        chosen.append(canon)
    return chosen, "noheader" in opts, "nounits" in opts


def driver_major(driver):
    return int(driver.split(".")[0]) if driver else 0


def print_query(fields, noheader, nounits, driver):
    out = []
    if not noheader:
        heads = []
        for f in fields:
            head, unit, _ = FIELDS[f]
            heads.append(head if unit is None or nounits else "%s [%s]" % (head, unit))
        out.append(", ".join(heads))
    for i, gpu in enumerate(listed_gpus(driver)):
        vals = []
        for f in fields:
            _, unit, get = FIELDS[f]
            v = get(gpu, i, driver)
            vals.append(v if unit is None or nounits else "%s %s" % (v, unit))
        out.append(", ".join(vals))
    sys.stdout.write("".join(line + "\n" for line in out))
    return 0


def print_apps(fields, noheader, nounits, driver):
    """--query-compute-apps: a line per registered process; the header alone when there is
    none. The header names a column's unit with nounits too (real, driver 580)."""
    heads = ["%s [%s]" % (head, unit) if unit else head for head, unit, _ in (APP_FIELDS[f] for f in fields)]
    out = [] if noheader else [", ".join(heads)]
    for gpu, p in by_card(listed_gpus(driver)):
        vals = []
        for f in fields:
            _, unit, get = APP_FIELDS[f]
            v = get(p, gpu)
            vals.append(v if unit is None or nounits else "%s %s" % (v, unit))
        out.append(", ".join(vals))
    sys.stdout.write("".join(line + "\n" for line in out))
    return 0


# --- the plain table (580-style layout, also used by 535+ drivers) -------
SEP = "+-----------------------------------------+------------------------+----------------------+"
WIDE = "+-----------------------------------------------------------------------------------------+"


def _process_rows(gpus):
    """The table's rows of the registered processes (real layout, driver 580): a name
    longer than 32 is cut to its last 29 characters after "...". """
    index = {g["uuid"]: i for i, g in enumerate(gpus)}
    rows = []
    for _, p in by_card(gpus):
        name = p["name"] if len(p["name"]) <= 32 else "..." + p["name"][-29:]
        rows.append("|%5d%6s%5s%16d%7s   %-32s%14s |" % (
            index[p["gpu_uuid"]], "N/A", "N/A", p["pid"], "C", name, "%dMiB" % p["used_mib"]))
    return rows or ["|  No running processes found                                                             |"]


def print_table(driver):
    gpus = listed_gpus(driver)
    lines = [_now() + "       ", WIDE,
             "| NVIDIA-SMI %-23sDriver Version: %-15sCUDA Version: %-9s|"
             % (driver, driver, cuda_version(driver)),
             SEP,
             "| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |",
             "| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |",
             "|                                         |                        |               MIG M. |",
             "|=========================================+========================+======================|"]
    for i, g in enumerate(gpus):
        mem = "%dMiB / %dMiB" % (used_mib(g), g["memory_mib"])
        lines += [
            "|%4d  %-30s%3s  |%19s %3s |%21s |" % (
                i, g["name"][:30], "On", g["bus_id"], "Off", g.get("ecc", "0")),
            "|%4s%6s%6s%16s / %5s |%23s |%8s%13s |" % (
                "N/A", "%dC" % g.get("temperature_c", 37), g.get("pstate", "P0"),
                "%dW" % g.get("power_usage_w", 40), "%dW" % g.get("power_cap_w", 300),
                mem, "0%", "Default"),
            "|%41s|%24s|%21s |" % ("", "", g.get("mig", "N/A")),
            SEP,
        ]
    lines += ["", WIDE,
              "| Processes:                                                                              |",
              "|  GPU   GI   CI              PID   Type   Process name                        GPU Memory |",
              "|        ID   ID                                                               Usage      |",
              "|=========================================================================================|",
              *_process_rows(gpus), WIDE]
    sys.stdout.write("\n".join(lines) + "\n")
    return 0


# --- nvidia-smi -q (the real layout: key padded to column 55, then ": ") ---
def q_line(depth, key, value=None):
    pad = "    " * depth + key
    return pad if value is None else "%-55s: %s" % (pad, value)


def _q_processes(gpu):
    """-q's processes of a card: each block's values at column 42 (real, driver 580)."""
    lines = []
    for p in processes_on([gpu]):
        lines += ["%-42s: %s" % (key, value) for key, value in (
            ("        GPU instance ID", "N/A"), ("        Compute instance ID", "N/A"),
            ("        Process ID", p["pid"]), ("            Type", "C"), ("            Name", p["name"]),
            ("            Used GPU Memory", "%d MiB" % p["used_mib"]))]  # fmt: skip
    return [q_line(1, "Processes")] + lines if lines else [q_line(1, "Processes", "None")]


def print_q(driver):
    gpus = listed_gpus(driver)
    lines = ["", "==============NVSMI LOG==============", "",
             q_line(0, "Timestamp", _now()),
             q_line(0, "Driver Version", driver), q_line(0, "CUDA Version", cuda_version(driver)),
             "", q_line(0, "Attached GPUs", str(len(gpus)))]
    for i, g in enumerate(gpus):
        used = used_mib(g)
        reserved = g.get("memory_reserved_mib", 0)
        bus = g["bus_id"]
        lines += [
            "GPU " + bus,
            q_line(1, "Product Name", g["name"]),
            q_line(1, "Product Brand", g.get("brand", "NVIDIA")),
            q_line(1, "Persistence Mode", "Enabled"),
            q_line(1, "MIG Mode"),
            q_line(2, "Current", g.get("mig", "N/A")),
            q_line(2, "Pending", g.get("mig", "N/A")),
            q_line(1, "GPU UUID", g["uuid"]),
            q_line(1, "Minor Number", str(i)),
            q_line(1, "PCI"),
            q_line(2, "Bus", "0x" + bus.split(":")[1]),
            q_line(2, "Device", "0x" + bus.split(":")[2].split(".")[0]),
            q_line(2, "Domain", "0x" + bus.split(":")[0][-4:]),
            q_line(2, "Device Id", pci_device_id(g)),
            q_line(2, "Bus Id", bus),
            q_line(1, "Performance State", g.get("pstate", "P0")),
            q_line(1, "FB Memory Usage"),
            q_line(2, "Total", "%d MiB" % g["memory_mib"]),
            q_line(2, "Reserved", "%d MiB" % reserved),
            q_line(2, "Used", "%d MiB" % used),
            q_line(2, "Free", "%d MiB" % (g["memory_mib"] - reserved - used)),
            q_line(1, "Compute Mode", "Default"),
            q_line(1, "Temperature"),
            q_line(2, "GPU Current Temp", "%d C" % g.get("temperature_c", 37)),
            q_line(1, "GPU Power Readings"),
            q_line(2, "Current Power Limit", "%.2f W" % g.get("power_cap_w", 300)),
        ] + _q_processes(g)
    sys.stdout.write("\n".join(lines) + "\n\n")
    return 0


# --- nvidia-smi topo -m (the layout of current drivers: tabs, the legend after) ---
TOPO_LEGEND = [
    "", "Legend:", "",
    "  X    = Self",
    "  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)",
    "  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node",
    "  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)",
    "  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)",
    "  PIX  = Connection traversing at most a single PCIe bridge",
    "  NV#  = Connection traversing a bonded set of # NVLinks",
]


def print_topo(driver):
    """The link between each two listed cards, their CPU and NUMA affinity; the header
    underlined when printed to a terminal."""
    gpus = listed_gpus(driver)
    head = "\t".join(["GPU%d" % i for i in range(len(gpus))] + ["CPU Affinity", "NUMA Affinity", "GPU NUMA ID"])
    lines = ["\t" + ("\x1b[4m%s\x1b[0m" % head if sys.stdout.isatty() else head)]
    for i, g in enumerate(gpus):
        cells = [" X " if peer is g else g.get("links", {}).get(peer["uuid"], "SYS") for peer in gpus]
        lines.append("\t".join(["GPU%d" % i] + cells + [g.get("cpu_affinity", "N/A"),
                                                          str(g.get("numa_node", "N/A")), "", "N/A"]))  # fmt: skip
    sys.stdout.write("\n".join(lines + TOPO_LEGEND) + "\n")
    return 0


def arguments(argv):
    """(mode, query fields, format) of the command line, or the exit status of a bad one."""
    qfields = fmt = None
    mode = "table"
    if argv[:1] == ["topo"] and argv[1:] in (["-m"], ["--matrix"]):
        return "topo", None, None
    it = iter(argv)
    for arg in it:
        if arg.startswith("--query-gpu="):
            qfields, mode = arg.split("=", 1)[1], "query"
        elif arg == "--query-gpu":
            qfields, mode = next(it, ""), "query"
        elif arg.startswith("--format="):
            fmt = arg.split("=", 1)[1]
        elif arg == "--format":
            fmt = next(it, "")
        elif arg.startswith("--query-compute-apps="):
            qfields, mode = arg.split("=", 1)[1], "apps"
        elif arg in ("-L", "--list-gpus"):
            mode = "list"
        elif arg == "--version":
            mode = "version"
        elif arg in ("-q", "--query"):
            mode = "q"
        else:
            sys.stdout.write('Invalid combination of input arguments. Please run '
                             '"nvidia-smi -h" for help.\n\n')
            return EXIT_BAD_ARG
    return mode, qfields, fmt


def main(argv):
    args = arguments(argv)
    if isinstance(args, int):
        return args
    mode, qfields, fmt = args
    lib = library_version()
    mod = module_version()
    parsed = None
    if mode == "query":
        if fmt is None:
            sys.stdout.write("The --format option is required when --query-gpu is used.\n\n")
            return EXIT_BAD_ARG
        parsed = query(qfields, fmt, lib or mod or "")
    elif mode == "apps":
        parsed = query(qfields, fmt or "csv", lib or mod or "", APP_FIELDS, APP_ALIASES)
    if isinstance(parsed, int):
        return parsed
    if mod is None:
        sys.stdout.write(MSG_NO_DRIVER)
        return EXIT_NO_DRIVER
    if lib is None or lib != mod:
        lib_mm = ".".join((lib or "").split(".")[:2])
        sys.stdout.write("Failed to initialize NVML: Driver/library version mismatch\n"
                         "NVML library version: %s\n" % lib_mm)
        return EXIT_MISMATCH
    if mode == "version":
        sys.stdout.write("NVIDIA-SMI version  : %s\nNVML version        : %s\n"
                         "DRIVER version      : %s\nCUDA Version        : %s\n"
                         % (mod, ".".join(mod.split(".")[:2]), mod, cuda_version(mod)))
        return 0
    if not listed_gpus(mod):
        # a module past the cards' branch would not have loaded ("No NVIDIA GPU found"); one
        # whose cards all fell off the bus finds none
        no_module = load_gpus() and not any(supported(g, mod) for g in load_gpus())
        sys.stdout.write(MSG_NO_DRIVER if no_module else MSG_NO_DEVICES)
        return EXIT_NO_DRIVER if no_module else EXIT_NO_DEVICES
    return answer(mode, parsed, mod)


def answer(mode, parsed, driver):
    """What each mode prints once the driver answers and lists a card."""
    if mode == "query":
        return print_query(*parsed, driver)
    if mode == "apps":
        return print_apps(*parsed, driver)
    if mode == "q":
        return print_q(driver)
    if mode == "topo":
        return print_topo(driver)
    if mode == "list":
        for i, g in enumerate(listed_gpus(driver)):
            sys.stdout.write("GPU %d: %s (UUID: %s)\n" % (i, g["name"], g["uuid"]))
            # MIG devices under their GPU, as the real -L lists them
            for j, mig in enumerate(g.get("mig_devices", [])):
                sys.stdout.write("  MIG %-13s Device %2d: (UUID: %s)\n" % (mig["profile"], j, mig["uuid"]))
        return 0
    return print_table(driver)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

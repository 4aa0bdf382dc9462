"""GPU profiles of lab hosts and how rack specs turn into host names/IPs.

A profile is the hardware a host pretends to have: it becomes the guest's
/etc/llamarack-lab/gpus.json, read by the fake nvidia-smi. Values are what
real nvidia-smi reports for these boards (memory.total in MiB as in csv
queries of recent drivers).
"""

from __future__ import annotations

import ipaddress
import uuid
from dataclasses import dataclass

SUBNET = ipaddress.ip_network("10.77.0.0/24")
GATEWAY = "10.77.0.1"
FIRST_HOST_OCTET = 11  # host i (0-based) is at 10.77.0.(11+i)
MAX_HOSTS = 200


@dataclass(frozen=True)
class Gpu:
    name: str
    memory_mib: int
    compute_cap: str
    power_cap_w: int
    pstate: str = "P0"
    mig: str = "N/A"


@dataclass(frozen=True)
class Profile:
    name: str
    host_base: str  # host names derive from it: lab-v100, lab-v100-a, ...
    gpus: tuple[Gpu, ...]
    bus: tuple[int, ...] = ()
    """Each card's PCI bus number (its bus id 00000000:BB:00.0); 0x1E, 0x1F, ... when empty."""
    links: tuple[str, ...] = ()
    """``nvidia-smi topo -m``'s matrix, a row per card ("X NV1 SYS"); PHB between all when empty."""
    numa: tuple[int, ...] = ()
    """Each card's NUMA node (its CPU affinity is the node's CPUs); node 0 when empty."""


# The NUMA nodes' CPUs of the multi-card profiles (two 20-core sockets with threads, as a DGX-1).
NODE_CPUS = ("0-19,40-59", "20-39,60-79")

# A DGX-1 with V100s: the hybrid cube-mesh of NVLinks, NV1 or NV2 between linked cards and SYS
# across the sockets otherwise, as its real `nvidia-smi topo -m` prints it
# (tests/facts/GpuTopology/dgx1_v100_driver_440.json); its cards' bus numbers as on a DGX-1.
DGX1_LINKS = (
    "X NV1 NV1 NV2 NV2 SYS SYS SYS",
    "NV1 X NV2 NV1 SYS NV2 SYS SYS",
    "NV1 NV2 X NV2 SYS SYS NV1 SYS",
    "NV2 NV1 NV2 X SYS SYS SYS NV1",
    "NV2 SYS SYS SYS X NV1 NV1 NV2",
    "SYS NV2 SYS SYS NV1 X NV2 NV1",
    "SYS SYS NV1 SYS NV1 NV2 X NV2",
    "SYS SYS SYS NV1 NV2 NV1 NV2 X",
)
DGX1_BUS = (0x06, 0x07, 0x0A, 0x0B, 0x85, 0x86, 0x89, 0x8A)

V100_SXM2_16GB = Gpu("Tesla V100-SXM2-16GB", 16384, "7.0", 300)
V100_PCIE_16GB = Gpu("Tesla V100-PCIE-16GB", 16384, "7.0", 250)
P40 = Gpu("Tesla P40", 24576, "6.1", 250)
RTX_3090 = Gpu("NVIDIA GeForce RTX 3090", 24576, "8.6", 350, pstate="P8")


PROFILES: dict[str, Profile] = {p.name: p for p in [
    Profile("v100-16gb", "lab-v100", (V100_SXM2_16GB,)),
    Profile("v100-32gb", "lab-v100-32", (Gpu("Tesla V100-SXM2-32GB", 32768, "7.0", 300),)),
    Profile("t4", "lab-t4", (Gpu("Tesla T4", 15360, "7.5", 70, pstate="P8"),)),
    Profile("p100", "lab-p100", (Gpu("Tesla P100-PCIE-16GB", 16384, "6.0", 250),)),
    Profile("p40", "lab-p40", (P40,)),
    Profile("h200", "lab-h200", (Gpu("NVIDIA H200", 143771, "9.0", 700, mig="Disabled"),)),
    Profile("none", "lab-cpu", ()),
    # Hosts with several cards: a DGX-1 (8 V100 SXM2 linked by NVLink), a 3090 beside three
    # P40s over two sockets' PCIe, two PCIe V100s behind one host bridge (a split host).
    Profile("v100-sxm2-16gb-x8", "lab-v100x8", (V100_SXM2_16GB,) * 8, DGX1_BUS, DGX1_LINKS, (0,) * 4 + (1,) * 4),
    Profile("rtx3090-p40-x3", "lab-mixed", (RTX_3090, P40, P40, P40), (0x18, 0x3B, 0x86, 0xAF),
            ("X NODE SYS SYS", "NODE X SYS SYS", "SYS SYS X PHB", "SYS SYS PHB X"), (0, 0, 1, 1)),
    Profile("v100-16gb-x2", "lab-v100x2", (V100_PCIE_16GB,) * 2, (0x3B, 0x5E), ("X PHB", "PHB X")),
]}

DEFAULT_PROFILES = ["v100-16gb", "v100-16gb", "v100-32gb", "t4"]

# The rack's gateway (HAProxy; inventory group `gateways`): a host without GPU, at the
# address after the serving hosts'.
GATEWAY_HOST = "lab-gw"
GATEWAY_HOST_PROFILE = "none"


def host_ip(index: int) -> str:
    return str(SUBNET.network_address + FIRST_HOST_OCTET + index)


def parse_gpus_spec(spec: str) -> list[str]:
    """'v100-16gb,t4' or 'v100-16gb*2,t4' -> list of profile names."""
    out: list[str] = []
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        name, _, count = part.partition("*")
        name = name.strip()
        if name not in PROFILES:
            raise ValueError(f"unknown GPU profile {name!r}; known: {', '.join(PROFILES)}")
        try:
            n = int(count) if count else 1
        except ValueError:
            raise ValueError(f"bad count in {part!r}") from None
        if n < 1:
            raise ValueError(f"bad count in {part!r}")
        out += [name] * n
    if not out:
        raise ValueError("empty GPU spec")
    return out


def rack_profiles(n: int | None = None, gpus: str | None = None) -> list[str]:
    """Profiles of a rack: from --gpus, else N hosts cycling the defaults."""
    if gpus:
        profiles = parse_gpus_spec(gpus)
        if n is not None and n != len(profiles):
            raise ValueError(f"N={n} but --gpus lists {len(profiles)} hosts")
    else:
        n = len(DEFAULT_PROFILES) if n is None else n
        profiles = [DEFAULT_PROFILES[i % len(DEFAULT_PROFILES)] for i in range(n)]
    if not 1 <= len(profiles) <= MAX_HOSTS:
        raise ValueError(f"a rack has 1..{MAX_HOSTS} hosts")
    return profiles


def _suffix(i: int) -> str:
    return chr(ord("a") + i) if i < 26 else str(i + 1)


def host_names(profiles: list[str]) -> list[str]:
    """Unique names from profiles: a base used once stays bare, repeated
    bases get -a, -b, ... (default rack: lab-v100-a, lab-v100-b,
    lab-v100-32, lab-t4)."""
    bases = [PROFILES[p].host_base for p in profiles]
    seen: dict[str, int] = {}
    names = []
    for b in bases:
        if bases.count(b) == 1:
            names.append(b)
        else:
            k = seen.get(b, 0)
            seen[b] = k + 1
            names.append(f"{b}-{_suffix(k)}")
    return names


def rack_spec(profiles: list[str]) -> list[tuple[str, str, str]]:
    """[(name, profile, ip)] for a list of profiles."""
    return [(n, p, host_ip(i)) for i, (n, p) in enumerate(zip(host_names(profiles), profiles))]


def gateway_spec(serving: int) -> tuple[str, str, str]:
    """(name, profile, ip) of the gateway of a rack of ``serving`` hosts: the next address."""
    return (GATEWAY_HOST, GATEWAY_HOST_PROFILE, host_ip(serving))


def gpus_json(host: str, profile: str) -> list[dict]:
    """The guest's /etc/llamarack-lab/gpus.json: stable per host name. Each card's ``links``
    name its link to each other card by UUID (``nvidia-smi topo -m``'s NV2, PHB, SYS...)."""
    spec = PROFILES[profile]
    uuids = ["GPU-" + str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{host}.gpu{i}.llamarack-lab")) for i in range(len(spec.gpus))]
    out = []
    for i, g in enumerate(spec.gpus):
        row = spec.links[i].split() if spec.links else ["PHB"] * len(spec.gpus)
        node = spec.numa[i] if spec.numa else 0
        out.append({
            "name": g.name,
            "memory_mib": g.memory_mib,
            "compute_cap": g.compute_cap,
            "uuid": uuids[i],
            "bus_id": f"00000000:{spec.bus[i] if spec.bus else 0x1E + i:02X}:00.0",
            "power_cap_w": g.power_cap_w,
            "power_usage_w": 40 if g.power_cap_w > 100 else 12,
            "pstate": g.pstate,
            "mig": g.mig,
            "links": {peer: link for j, (peer, link) in enumerate(zip(uuids, row)) if j != i},
            "cpu_affinity": NODE_CPUS[node],
            "numa_node": node,
        })
    return out


DEFAULT_RACK: list[tuple[str, str]] = [
    (n, p) for n, p, _ in rack_spec(DEFAULT_PROFILES)
]

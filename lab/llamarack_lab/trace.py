"""What the lab may leave behind on the machine, as comparable snapshots:
taken before `up` and after `down`, they must be equal (tests), and
`lab status --trace` style checks can show what is left."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from .host import CGROUP_PARENT, CGROUP_ROOTS, MEMORY_ROOT
from .network import BRIDGE, FWD_CHAIN, NAT_CHAIN
from . import paths


def _iptables(table: str) -> list[str]:
    out = subprocess.run(["iptables-save", "-t", table], capture_output=True, text=True).stdout
    return [re.sub(r"\[\d+:\d+\]", "", line) for line in out.splitlines()
            if line and not line.startswith("#")]


def lab_processes() -> list[str]:
    """Processes in any llamarack-lab cgroup (found via /proc, not by name)."""
    out = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            cg = (p / "cgroup").read_text()
            if (p / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue  # a zombie holds nothing; its parent or init reaps it
        except (OSError, IndexError):
            continue
        if f"/{CGROUP_PARENT}/" in cg or cg.rstrip().endswith(f"/{CGROUP_PARENT}"):
            out.append(p.name)
    return sorted(out)


def machine_snapshot() -> dict:
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    netns = Path("/run/netns")
    state = str(paths.state_dir())
    mounts = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        mnt = line.split()[4]
        if mnt.startswith(state) or mnt.startswith("/run/netns") or "lrlab" in mnt:
            mounts.append(mnt)
    return {
        "links": sorted(l.split(":")[1].strip().split("@")[0] for l in links.splitlines()),
        "netns": sorted(x.name for x in netns.iterdir()) if netns.is_dir() else None,
        "iptables_filter": _iptables("filter"),
        "iptables_nat": _iptables("nat"),
        "ip_forward": Path("/proc/sys/net/ipv4/ip_forward").read_text().strip(),
        "mounts": sorted(mounts),
        "cgroups": sorted(str(r / CGROUP_PARENT) for r in (*CGROUP_ROOTS, MEMORY_ROOT)
                          if (r / CGROUP_PARENT).exists()),
        "processes": lab_processes(),
        "state_dir_exists": Path(state).exists() and any(Path(state).iterdir()),
    }


def leftovers() -> list[str]:
    """Lab things present now (whatever the machine had before)."""
    s = machine_snapshot()
    out = []
    if BRIDGE in s["links"]:
        out.append(f"bridge {BRIDGE}")
    out += [f"netns {n}" for n in (s["netns"] or []) if n.startswith("llamarack-")]
    out += [f"iptables {r}" for r in s["iptables_filter"] + s["iptables_nat"]
            if FWD_CHAIN in r or NAT_CHAIN in r]
    out += [f"mount {m}" for m in s["mounts"] if m.startswith(str(paths.state_dir()))]
    out += [f"cgroup {c}" for c in s["cgroups"]]
    out += [f"process {p}" for p in s["processes"]]
    return out

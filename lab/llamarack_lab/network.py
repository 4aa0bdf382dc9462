"""Lab networking: a bridge on the machine, one netns + veth per host, and
NAT that lets hosts reach only the package registries and the resolver.

Everything created here is recorded (in rack.json, by the caller) and
removed by exactly that record: the lab's own iptables chains, the bridge,
the namespaces, and ip_forward put back to what it was.
"""

from __future__ import annotations

import configparser
import os
import re
import socket
import subprocess
from pathlib import Path
from urllib.parse import urlparse

from .profiles import GATEWAY, SUBNET
from .util import LabError, is_mountpoint, run

BRIDGE = "lrlab0"
FWD_CHAIN = "LLAMARACK-LAB-FWD"
NAT_CHAIN = "LLAMARACK-LAB-NAT"
IP_FORWARD = Path("/proc/sys/net/ipv4/ip_forward")
NETNS_DIR = Path("/run/netns")
REGISTRY_HOSTS = ["deb.debian.org", "pypi.org", "files.pythonhosted.org"]
# The jumps from the built-in chains into the lab's chains ((table, args)).
JUMPS = [
    ("filter", ["FORWARD", "-i", BRIDGE, "-j", FWD_CHAIN]),
    ("filter", ["FORWARD", "-o", BRIDGE, "-j", FWD_CHAIN]),
    ("nat", ["POSTROUTING", "-s", str(SUBNET), "-j", NAT_CHAIN]),
]


# --- which addresses hosts may reach ---------------------------------------

def _pip_index_hosts() -> set[str]:
    """Hosts of the machine's pip indexes (pip.conf / PIP_* env), if http(s)."""
    urls: list[str] = []
    for env in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL"):
        urls += os.environ.get(env, "").split()
    cp = configparser.ConfigParser()
    cp.read(["/etc/pip.conf", "/etc/xdg/pip/pip.conf",
             os.path.expanduser("~/.config/pip/pip.conf"), os.path.expanduser("~/.pip/pip.conf")])
    for section in cp.sections():
        for key in ("index-url", "extra-index-url"):
            urls += cp.get(section, key, fallback="").split()
    hosts = set()
    for u in urls:
        p = urlparse(u)
        if p.scheme in ("http", "https") and p.hostname:
            hosts.add(p.hostname)
    return hosts


def resolvers() -> list[str]:
    out = []
    try:
        for line in Path("/etc/resolv.conf").read_text().splitlines():
            m = re.match(r"\s*nameserver\s+(\d+\.\d+\.\d+\.\d+)", line)
            if m:
                out.append(m.group(1))
    except OSError:
        pass
    return out


def registry_addresses() -> dict[str, list[str]]:
    """IPv4 addresses of the package registries, resolved now (up time)."""
    out: dict[str, list[str]] = {}
    for host in sorted(set(REGISTRY_HOSTS) | _pip_index_hosts()):
        try:
            infos = socket.getaddrinfo(host, 443, socket.AF_INET, socket.SOCK_STREAM)
        except socket.gaierror:
            continue
        out[host] = sorted({i[4][0] for i in infos})
    if not out:
        raise LabError("could not resolve any package registry (deb.debian.org, pypi.org)")
    return out


# --- ip_forward, bridge, iptables ------------------------------------------

def _ipt(table: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    return run(["iptables", "-w", "-t", table, *args], check=check)


def setup_machine(allowed: list[str], dns: list[str]) -> dict:
    """Bridge + forwarding + NAT. Returns the record for teardown."""
    if Path(f"/sys/class/net/{BRIDGE}").exists():
        raise LabError(f"bridge {BRIDGE} exists already: is a rack up? (lab status / lab down)")
    rec: dict = {"bridge": BRIDGE, "ip_forward": IP_FORWARD.read_text().strip(), "chains": [],
                 # `ip netns add` creates and bind-mounts /run/netns if missing
                 "netns_dir_created": not NETNS_DIR.exists()}
    run(["ip", "link", "add", BRIDGE, "type", "bridge"])
    rec["bridge_created"] = True
    run(["ip", "addr", "add", f"{GATEWAY}/{SUBNET.prefixlen}", "dev", BRIDGE])
    run(["ip", "link", "set", BRIDGE, "up"])

    for table, chain in (("filter", FWD_CHAIN), ("nat", NAT_CHAIN)):
        if _ipt(table, "-n", "-L", chain, check=False).returncode == 0:
            raise LabError(f"iptables chain {chain} exists already (left by another lab?)")
        _ipt(table, "-N", chain)
        rec["chains"].append([table, chain])
    fwd = [["-i", BRIDGE, "-o", BRIDGE, "-j", "ACCEPT"],  # host to host
           ["-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "ACCEPT"]]
    for ip in sorted(set(allowed)):
        fwd.append(["-i", BRIDGE, "-d", ip, "-p", "tcp", "-m", "multiport",
                    "--dports", "80,443", "-j", "ACCEPT"])
    for ip in sorted(set(dns)):
        for proto in ("udp", "tcp"):
            fwd.append(["-i", BRIDGE, "-d", ip, "-p", proto, "--dport", "53", "-j", "ACCEPT"])
    fwd.append(["-j", "DROP"])  # anything else to or from the lab hosts
    for rule in fwd:
        _ipt("filter", "-A", FWD_CHAIN, *rule)
    _ipt("nat", "-A", NAT_CHAIN, "-d", str(SUBNET), "-j", "RETURN")
    _ipt("nat", "-A", NAT_CHAIN, "-j", "MASQUERADE")
    rec["jumps"] = []
    for table, args in JUMPS:
        _ipt(table, "-I", *args[:1], "1", *args[1:])
        rec["jumps"].append([table, args])
    IP_FORWARD.write_text("1\n")
    return rec


def teardown_machine(rec: dict) -> list[str]:
    """Undo setup_machine from its record. Returns errors (best effort)."""
    errors = []
    if "ip_forward" in rec:
        try:
            IP_FORWARD.write_text(rec["ip_forward"] + "\n")
        except OSError as e:
            errors.append(f"ip_forward: {e}")
    for table, args in rec.get("jumps", []):
        r = _ipt(table, "-D", *args, check=False)
        if r.returncode != 0:
            errors.append(f"iptables -t {table} -D {' '.join(args)}: {r.stderr.decode().strip()}")
    for table, chain in rec.get("chains", []):
        _ipt(table, "-F", chain, check=False)
        r = _ipt(table, "-X", chain, check=False)
        if r.returncode != 0:
            errors.append(f"iptables -t {table} -X {chain}: {r.stderr.decode().strip()}")
    if rec.get("bridge_created") and Path(f"/sys/class/net/{rec['bridge']}").exists():
        r = run(["ip", "link", "del", rec["bridge"]], check=False)
        if r.returncode != 0:
            errors.append(f"ip link del {rec['bridge']}: {r.stderr.decode().strip()}")
    if rec.get("netns_dir_created") and NETNS_DIR.is_dir() and not any(NETNS_DIR.iterdir()):
        if is_mountpoint(NETNS_DIR):
            run(["umount", str(NETNS_DIR)], check=False)
        try:
            NETNS_DIR.rmdir()
        except OSError as e:
            errors.append(f"rmdir {NETNS_DIR}: {e}")
    return errors


# --- per host ----------------------------------------------------------------

def netns_name(host: str) -> str:
    return f"llamarack-{host}"


def veth_name(index: int) -> str:
    return f"lrv{index}"  # <= 15 chars; the guest side is eth0


def add_host(rec: dict, host: str, index: int, ip: str) -> None:
    """Create the host's netns and veth; rec (saved by the caller) gets their
    names before they exist, so a failure half-way is still cleaned up."""
    ns, veth = netns_name(host), veth_name(index)
    rec.update(netns=ns, veth=veth)
    run(["ip", "netns", "add", ns])
    run(["ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns])
    run(["ip", "link", "set", veth, "master", BRIDGE, "up"])
    run(["ip", "-n", ns, "link", "set", "lo", "up"])
    run(["ip", "-n", ns, "addr", "add", f"{ip}/{SUBNET.prefixlen}", "dev", "eth0"])
    run(["ip", "-n", ns, "link", "set", "eth0", "up"])
    run(["ip", "-n", ns, "route", "add", "default", "via", GATEWAY])


def remove_host(rec: dict) -> list[str]:
    errors = []
    if rec.get("netns") and Path(f"/run/netns/{rec['netns']}").exists():
        r = run(["ip", "netns", "del", rec["netns"]], check=False)
        if r.returncode != 0:
            errors.append(f"ip netns del {rec['netns']}: {r.stderr.decode().strip()}")
    if rec.get("veth") and Path(f"/sys/class/net/{rec['veth']}").exists():
        run(["ip", "link", "del", rec["veth"]], check=False)
    return errors

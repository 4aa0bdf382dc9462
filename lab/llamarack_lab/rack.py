"""Bring a lab rack up and down; the state of a running rack is rack.json
in the state dir, which records everything `up` created so that `down`
removes exactly that (by recorded PID, cgroup, mount and rule)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from . import LAB_GROUP_DATA, host as hostmod, image, network, paths, profiles, services
from .fake_nvidia import deb
from .util import LabError, is_mountpoint, progress, require_tool, run

STATE_FILE = "rack.json"
REQUIRED_TOOLS = ["mmdebstrap", "systemd-nspawn", "zstd", "lxcfs", "iptables", "ip",
                  "ssh", "ssh-keygen", "dpkg-deb", "tar", "mount", "umount"]


@dataclass(frozen=True)
class LabHost:
    name: str
    ip: str
    profile: str
    gateway: bool = False
    """The rack's gateway (inventory group `gateways`: HAProxy, no llama-server)."""


class Rack:
    """A running rack, as recorded in rack.json."""

    def __init__(self, state_dir: Path, data: dict):
        self.state_dir = state_dir
        self.data = data

    @property
    def hosts(self) -> list[LabHost]:
        """Every host of the rack, the gateway included."""
        return [LabHost(h["name"], h["ip"], h["profile"], h.get("gateway", False)) for h in self.data["hosts"]]

    @property
    def serving(self) -> list[LabHost]:
        """The hosts that serve a model (all but the gateway)."""
        return [h for h in self.hosts if not h.gateway]

    @property
    def gateway(self) -> LabHost | None:
        """The rack's gateway host (HAProxy), None for a rack without one."""
        return next((h for h in self.hosts if h.gateway), None)

    @property
    def key_path(self) -> Path:
        return self.state_dir / "id_ed25519"

    @property
    def inventory_path(self) -> Path:
        return self.state_dir / "inventory.py"

    @property
    def known_hosts(self) -> Path:
        return self.state_dir / "known_hosts"

    def host(self, name_or_ip: str) -> dict:
        for h in self.data["hosts"]:
            if name_or_ip in (h["name"], h["ip"]):
                return h
        raise LabError(f"no lab host {name_or_ip!r}; hosts: "
                       + ", ".join(h["name"] for h in self.data["hosts"]))

    def ssh_command(self, name: str, cmd: str | None = None, tty: bool = False) -> list[str]:
        h = self.host(name)
        args = ["ssh", "-i", str(self.key_path), "-o", "IdentitiesOnly=yes",
                "-o", f"UserKnownHostsFile={self.known_hosts}",
                "-o", "StrictHostKeyChecking=yes", "-o", "LogLevel=ERROR",
                "-o", "ConnectTimeout=10"]
        if not tty:
            args += ["-o", "BatchMode=yes"]
        args.append(f"root@{h['ip']}")
        if cmd is not None:
            args += ["--", cmd]
        return args

    def ssh(self, name: str, cmd: str, *, input: bytes | None = None,
            timeout: float = 120) -> subprocess.CompletedProcess:
        """Run a shell command on a host; text output, never raises on rc."""
        r = subprocess.run(self.ssh_command(name, cmd), input=input, capture_output=True,
                           timeout=timeout)
        return subprocess.CompletedProcess(r.args, r.returncode,
                                           r.stdout.decode(errors="replace"),
                                           r.stderr.decode(errors="replace"))

    def save(self) -> None:
        tmp = self.state_dir / (STATE_FILE + ".part")
        tmp.write_text(json.dumps(self.data, indent=2) + "\n")
        os.replace(tmp, self.state_dir / STATE_FILE)


def load(state_dir: Path | None = None) -> Rack | None:
    sd = state_dir or paths.state_dir()
    f = sd / STATE_FILE
    if not f.is_file():
        return None
    return Rack(sd, json.loads(f.read_text()))


def require_running(state_dir: Path | None = None) -> Rack:
    rack = load(state_dir)
    if rack is None:
        raise LabError(f"no lab rack is up (no {paths.state_dir() / STATE_FILE}); run 'lab up'")
    return rack


# --- up ------------------------------------------------------------------------

def _check_machine() -> None:
    if os.geteuid() != 0:
        raise LabError("the lab needs root (namespaces, mounts, iptables)")
    for tool in REQUIRED_TOOLS:
        require_tool(tool)


def _mount_state_dir(sd: Path) -> bool:
    sd.mkdir(parents=True, exist_ok=True)
    if is_mountpoint(sd):
        return False
    if not paths.state_on_tmpfs():
        sd.chmod(0o700)
        return False
    run(["mount", "-t", "tmpfs", "-o", "mode=0700,size=75%", "llamarack-lab", str(sd)])
    return True


def _start_lxcfs(sd: Path) -> dict:
    mnt = sd / "lxcfs"
    mnt.mkdir(exist_ok=True)
    cgroups = hostmod.make_cgroups("lxcfs")
    pid = hostmod.spawn_in_cgroups(["lxcfs", "-f", "-p", str(sd / "lxcfs.pid"), str(mnt)],
                                   cgroups, sd / "lxcfs.log")
    rec = {"pid": pid, "cgroups": cgroups, "mount": str(mnt)}
    deadline = time.monotonic() + 10
    while not is_mountpoint(mnt):
        if time.monotonic() > deadline or not hostmod.pid_alive(pid):
            raise LabError(f"lxcfs did not mount {mnt}; see {sd / 'lxcfs.log'}")
        time.sleep(0.05)
    return rec


def _write_inventory(rack: Rack) -> None:
    data = dict(LAB_GROUP_DATA, ssh_key=str(rack.key_path))
    lines = ["# Generated by `llamarack lab up`: the running lab rack.",
             "# Usable as is: pyinfra " + str(rack.inventory_path) + " deploy.py", "",
             "from llamarack.ssh import PARAMIKO_CONNECT_KWARGS", "",
             "lab = (", "    ["]
    for h in rack.data["hosts"]:
        hd = {"ssh_hostname": h["ip"], "lab_profile": h["profile"]}
        lines.append(f"        ({h['name']!r}, {hd!r}),")
    lines += ["    ],",
              f"    dict({data!r}, ssh_paramiko_connect_kwargs=PARAMIKO_CONNECT_KWARGS),",
              ")", ""]
    gateways = [h["name"] for h in rack.data["hosts"] if h.get("gateway")]
    if gateways:  # HAProxy in front of the others: preflight's read and the gateway role only
        lines += [f"gateways = {gateways!r}", ""]
    rack.inventory_path.write_text("\n".join(lines))


def up(n: int | None = None, gpus: str | None = None,
       driver_version: str = deb.DEFAULT_VERSION, boot_timeout: float = 90, gateway: bool = True,
       memory_mib: int | None = None) -> Rack:
    """Start a rack (N serving hosts, and with ``gateway`` the gateway host after them; each
    serving host's memory capped at ``memory_mib`` MiB, None: the machine's); on any failure,
    tear down what was started and raise."""
    spec = profiles.rack_spec(profiles.rack_profiles(n, gpus))
    if gateway:
        spec.append(profiles.gateway_spec(len(spec)))
    deb.check_version(driver_version)
    _check_machine()
    sd = paths.state_dir()
    if (sd / STATE_FILE).exists():
        raise LabError(f"a rack is already up ({sd / STATE_FILE}); run 'lab down' first")
    t0 = time.monotonic()
    # owner: the process bringing the rack up (hosts have no PID until they boot)
    rack = Rack(sd, {"version": 1, "hosts": [], "started": time.time(), "owner": os.getpid()})
    rack.data["tmpfs_mounted"] = _mount_state_dir(sd)
    try:
        rack.save()
        _up(rack, spec, driver_version, boot_timeout, memory_mib)
    except BaseException:
        progress("up failed: tearing down what was started")
        down(sd)
        raise
    progress(f"rack up: {len(spec)} hosts in {time.monotonic() - t0:.1f} s; "
             f"inventory {rack.inventory_path}")
    return rack


def _up(rack: Rack, spec, driver_version: str, boot_timeout: float, memory_mib: int | None = None) -> None:
    sd = rack.state_dir
    paths.CCACHE_DIR.mkdir(parents=True, exist_ok=True)
    if not rack.key_path.exists():
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "llamarack-lab",
             "-f", str(rack.key_path)])
    pubkey = rack.key_path.with_suffix(".pub").read_text()

    lower = image.ensure_unpacked(sd)
    rack.data["image"] = str(lower)

    allowed = sorted({ip for ips in network.registry_addresses().values() for ip in ips})
    dns = network.resolvers()
    rack.data["network"] = {"allowed": allowed, "dns": dns}
    rack.save()
    rec = network.setup_machine(allowed, dns)
    rack.data["network"].update(rec)
    rack.save()

    rack.data["lxcfs"] = _start_lxcfs(sd)
    rack.save()

    progress("preparing the lab's local sources (llama.cpp mirror, package index, hub)")
    rack.data["services"] = services.start_all(profiles.GATEWAY)
    rack.save()

    driver_layer = None  # the fake driver, installed once for the GPU hosts
    if any(profiles.PROFILES[profile].gpus for _, profile, _ in spec):
        debs = deb.build_set(driver_version, paths.cache_dir() / "debs")
        driver_layer = hostmod.make_driver_layer(sd / "driver", lower, debs)
    progress(f"starting {len(spec)} hosts")
    for i, (name, profile, ip) in enumerate(spec):
        hdir = sd / "hosts" / name
        h = {"name": name, "ip": ip, "profile": profile, "dir": str(hdir),
             "gateway": name == profiles.GATEWAY_HOST}
        rack.data["hosts"].append(h)
        gpus = bool(profiles.PROFILES[profile].gpus)
        root = hostmod.make_overlay(hdir, f"{driver_layer}:{lower}" if gpus else lower)
        h["root"] = str(root)
        rack.save()
        h["host_key"] = hostmod.personalize(root, name, ip, profile, pubkey)
        if gpus:
            hostmod.add_driver_source(root, services.url(profiles.GATEWAY, services.DRIVER_REPO_PATH))
        network.add_host(h, name, i, ip)
        rack.save()
        cmd = hostmod.nspawn_command(name, root, h["netns"], rack.data["lxcfs"]["mount"])
        h.update(hostmod.launch(name, hdir, cmd))
        rack.save()
        if memory_mib and not h["gateway"]:
            set_memory(rack, name, memory_mib)

    rack.known_hosts.write_text("".join(f"{h['ip']} {h['host_key']}\n" for h in rack.data["hosts"]))
    _write_inventory(rack)
    wait_booted(rack, boot_timeout)


def set_memory(rack: Rack, name: str, mib: int | None) -> str:
    """Cap a host's memory at ``mib`` MiB (None or 0: the machine's again): the kernel holds the
    host to it (its OOM killer), and the host's /proc/meminfo says it (MemTotal, from lxcfs)."""
    h = rack.host(name)
    mem = hostmod.set_memory_cap(h["name"], h["cgroups"], mib or None)
    h["cgroups"] = [*h["cgroups"], mem] if mem not in h["cgroups"] else h["cgroups"]  # `down` removes it
    h["memory_mib"] = mib or None
    rack.save()
    return f"{h['name']}: memory " + (f"capped at {mib} MiB" if mib else "no longer capped")


def wait_booted(rack: Rack, timeout: float = 90, names: list[str] | None = None) -> dict[str, str]:
    """Wait for SSH, then for systemd to finish booting. Returns each host's
    `systemctl is-system-running` answer (running or degraded)."""
    hosts = [h for h in rack.data["hosts"] if names is None or h["name"] in names]

    def one(h):
        hostmod.wait_ssh(h["ip"], timeout, alive=lambda: hostmod.pid_alive(h["pid"]))
        r = rack.ssh(h["name"], "systemctl is-system-running --wait", timeout=timeout)
        state = r.stdout.strip()
        if state not in ("running", "degraded"):
            raise LabError(f"{h['name']}: system state {state!r} {r.stderr.strip()}")
        return h["name"], state

    with ThreadPoolExecutor(max_workers=max(1, min(32, len(hosts)))) as ex:
        return dict(ex.map(one, hosts))


# --- down ----------------------------------------------------------------------

def down(state_dir: Path | None = None) -> list[str]:
    """Remove everything the recorded rack created. Returns problems found
    (empty when clean); never stops at the first one."""
    sd = state_dir or paths.state_dir()
    rack = load(sd)
    if rack is None:
        return []
    d = rack.data
    errors: list[str] = []
    cgroups = [c for h in d["hosts"] for c in h.get("cgroups", [])]
    errors += hostmod.kill_cgroups(cgroups)
    for h in d["hosts"]:
        root = h.get("root")
        if root and is_mountpoint(root):
            r = run(["umount", root], check=False)
            if r.returncode != 0:
                errors.append(f"umount {root}: {r.stderr.decode().strip()}")
        errors += network.remove_host(h)
    if d.get("services"):
        services.stop_all(d["services"])  # stops and reaps them
    lx = d.get("lxcfs")
    if lx:
        if is_mountpoint(lx["mount"]):
            r = run(["umount", lx["mount"]], check=False)
            if r.returncode != 0:
                run(["umount", "-l", lx["mount"]], check=False)
        errors += hostmod.kill_cgroups(lx["cgroups"])
    # reap the supervisors and lxcfs if this process started them (pytest)
    for pid in [h.get("pid") for h in d["hosts"]] + [(lx or {}).get("pid")]:
        if pid:
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass
    if "network" in d:
        errors += network.teardown_machine(d["network"])
    parent_dirs = {str(Path(c).parent) for c in cgroups + (lx or {}).get("cgroups", [])}
    for p in parent_dirs:
        try:
            Path(p).rmdir()
        except OSError:
            pass
    if d.get("tmpfs_mounted"):
        r = run(["umount", str(sd)], check=False)
        if r.returncode != 0:
            errors.append(f"umount {sd}: {r.stderr.decode().strip()}")
        else:
            try:
                sd.rmdir()
            except OSError:
                pass
    elif not errors:
        # a state dir on someone else's mount: remove what up put there
        for sub in ("hosts", "image", "driver", "lxcfs"):
            shutil.rmtree(sd / sub, ignore_errors=True)
        for f in ("image.key", "inventory.py", "known_hosts", "lxcfs.log", "lxcfs.pid",
                  "id_ed25519", "id_ed25519.pub", STATE_FILE):
            (sd / f).unlink(missing_ok=True)
    return errors


# --- status --------------------------------------------------------------------

def status(state_dir: Path | None = None) -> list[dict]:
    rack = load(state_dir)
    if rack is None:
        return []
    out = []
    for h in rack.data["hosts"]:
        alive = bool(h.get("pid")) and hostmod.pid_alive(h["pid"])
        out.append({"name": h["name"], "ip": h["ip"], "profile": h["profile"],
                    "alive": alive, "ssh": alive and hostmod.ssh_banner(h["ip"])})
    return out


def stale(rack: Rack) -> bool:
    """Debris of a run that was killed: neither the process that brought it up nor
    any of its hosts is alive. A rack still booting or rebooting a host is not."""
    if rack.data.get("owner") and hostmod.pid_alive(rack.data["owner"]):
        return False
    return not any(h["alive"] for h in status(rack.state_dir))


def healthy(rack: Rack) -> bool:
    st = status(rack.state_dir)
    return bool(st) and all(h["alive"] and h["ssh"] for h in st)

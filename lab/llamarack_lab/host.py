"""One lab host: overlay root + per-host files + a supervised nspawn.

The overlay's lower dir is the shared unpacked image, under the layer of the
installed fake driver for a GPU host; everything that makes the host itself
(hostname, machine-id, SSH host key, authorized_keys, resolv.conf, GPU
description) lands in its upper dir.
The launcher runs in its own cgroup (v1 name=systemd and the unified
hierarchy): nspawn with --keep-unit puts the guest under it, and that
cgroup is how `down` finds and kills exactly this host's processes. A host
whose memory is capped (``set_memory_cap``) has its processes moved into a
memory cgroup of its own (cgroup v1's memory controller) whose limit is the
cap: the kernel's OOM killer holds the host to it, and lxcfs, whose
/proc/meminfo the guest mounts over its own, shows it as its MemTotal. What
the host wrote before (its files are in the state tmpfs) stays charged where
it was: the cap is on what the host takes from then on.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

from . import image, paths, profiles
from .util import LabError, run

CGROUP_ROOTS = [Path("/sys/fs/cgroup/systemd"), Path("/sys/fs/cgroup/unified")]
# cgroup v1's memory controller (a machine of hybrid hierarchies, as the lab needs): each host's
# memory cgroup, whose limit is the host's memory cap.
MEMORY_ROOT = Path("/sys/fs/cgroup/memory")
CGROUP_PARENT = "llamarack-lab"
SUPERVISOR = Path(__file__).parent / "supervisor.py"


# --- cgroups -----------------------------------------------------------------

def cgroup_dirs(name: str) -> list[Path]:
    return [r / CGROUP_PARENT / name for r in CGROUP_ROOTS if (r / "cgroup.procs").exists()]


def make_cgroups(name: str) -> list[str]:
    dirs = cgroup_dirs(name)
    if not dirs:
        raise LabError("no name=systemd or unified cgroup hierarchy under /sys/fs/cgroup")
    for d in dirs:
        d.mkdir(parents=True, exist_ok=True)
    return [str(d) for d in dirs]


def cgroup_pids(cgroup: str) -> set[int]:
    pids: set[int] = set()
    for procs in Path(cgroup).rglob("cgroup.procs"):
        try:
            pids |= {int(x) for x in procs.read_text().split()}
        except OSError:
            pass
    return pids


def kill_cgroups(cgroups: list[str], timeout: float = 10) -> list[str]:
    """SIGKILL every process in the cgroups until they are empty, then
    remove them (deepest first)."""
    deadline = time.monotonic() + timeout
    while True:
        pids = set().union(*(cgroup_pids(c) for c in cgroups if Path(c).exists()))
        if not pids:
            break
        if time.monotonic() > deadline:
            return [f"processes left in {cgroups}: {sorted(pids)}"]
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            try:  # reap it if it is our own child (e.g. a supervisor)
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass
        time.sleep(0.05)
    errors = []
    for c in cgroups:
        root = Path(c)
        if not root.exists():
            continue
        subdirs = sorted((p for p in root.rglob("*") if p.is_dir()),
                         key=lambda p: len(p.parts), reverse=True)
        for d in subdirs + [root]:
            for _ in range(50):
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.05)  # a zombie is still being reaped
            else:
                errors.append(f"could not remove cgroup {d}")
    return errors


def set_memory_cap(name: str, cgroups: list[str], mib: int | None) -> str:
    """Cap host ``name``'s memory at ``mib`` MiB (None: no cap): the limit (with swap, where the
    machine accounts it) of its memory cgroup, made here, into which every process of its
    ``cgroups`` is moved (the new ones are born there). Returns the memory cgroup, for ``down``."""
    if not (MEMORY_ROOT / "cgroup.procs").exists():
        raise LabError(f"no memory controller at {MEMORY_ROOT} (cgroup v1): a host's memory cannot be capped")
    mem = MEMORY_ROOT / CGROUP_PARENT / name
    mem.mkdir(parents=True, exist_ok=True)
    new = mib * 2**20 if mib else -1
    current = int((mem / "memory.limit_in_bytes").read_text())
    files = ["memory.limit_in_bytes", "memory.memsw.limit_in_bytes"]  # memory+swap is never below memory
    for f in reversed(files) if new < 0 or new > current else files:
        if (mem / f).exists():
            try:
                (mem / f).write_text(str(new))
            except OSError as e:
                raise LabError(f"{mem / f}: {new}: {e} (a cap below what the host holds now?)") from None
    for _ in range(100):  # until no process of the host is left outside (one may fork meanwhile)
        outside = set().union(*(cgroup_pids(c) for c in cgroups if Path(c) != mem)) - cgroup_pids(str(mem))
        if not outside:
            return str(mem)
        for pid in outside:
            try:
                (mem / "cgroup.procs").write_text(str(pid))
            except OSError:
                pass  # gone meanwhile
        time.sleep(0.02)
    raise LabError(f"{name}: processes keep appearing outside {mem}")


def _join_cgroups(cgroups: list[str]) -> None:
    for c in cgroups:
        Path(c, "cgroup.procs").write_text(str(os.getpid()))


def spawn_in_cgroups(cmd: list[str], cgroups: list[str], log: Path) -> int:
    """Start cmd detached, already inside the cgroups; return its PID."""
    with open(log, "ab") as out:
        p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                             start_new_session=True, preexec_fn=lambda: _join_cgroups(cgroups))
    return p.pid


# --- root filesystem ---------------------------------------------------------

def make_overlay(hdir: Path, lower: Path | str) -> Path:
    """Mount ``hdir``/root: an overlay of ``lower`` (directories joined by ":", the upper
    one first) with ``hdir``/upper on top."""
    for d in ("upper", "work", "root"):
        (hdir / d).mkdir(parents=True, exist_ok=True)
    root = hdir / "root"
    run(["mount", "-t", "overlay", "overlay", "-o",
         f"lowerdir={lower},upperdir={hdir / 'upper'},workdir={hdir / 'work'}", str(root)])
    return root


def personalize(root: Path, name: str, ip: str, profile: str, pubkey: str) -> str:
    """Write the per-host files (they land in the overlay's upper dir).
    Returns the host's public SSH host key line."""
    (root / "etc/hostname").write_text(name + "\n")
    (root / "etc/hosts").write_text(
        f"127.0.0.1\tlocalhost\n{ip}\t{name}\n::1\tlocalhost ip6-localhost ip6-loopback\n")
    (root / "etc/machine-id").write_text(uuid.uuid4().hex + "\n")
    resolv = root / "etc/resolv.conf"
    if resolv.is_symlink():
        resolv.unlink()
    shutil.copy("/etc/resolv.conf", resolv)
    # root and the sudo user take the rack's key
    for home, uid in (("root", 0), (f"home/{image.DEPLOY_USER}", image.DEPLOY_UID)):
        ak = root / home / ".ssh/authorized_keys"
        ak.parent.mkdir(mode=0o700, exist_ok=True)
        ak.write_text(pubkey.strip() + "\n")
        ak.chmod(0o600)
        os.chown(ak.parent, uid, uid)
        os.chown(ak, uid, uid)
    key = root / "etc/ssh/ssh_host_ed25519_key"
    run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"root@{name}", "-f", str(key)])
    lab_etc = root / "etc/llamarack-lab"
    lab_etc.mkdir(exist_ok=True)
    (lab_etc / "gpus.json").write_text(json.dumps(profiles.gpus_json(name, profile), indent=2) + "\n")
    (lab_etc / "profile").write_text(profile + "\n")
    (root / "var/cache/llamarack-ccache").mkdir(parents=True, exist_ok=True)
    _lxcfs_meminfo(root)
    return key.with_suffix(".pub").read_text().strip()


# The host's /proc/meminfo from lxcfs (bound at /var/lib/lxcfs by the lab), as the image's
# lxcfs-uptime.service does /proc/uptime: MemTotal is the host's memory cap (``set_memory_cap``),
# else the machine's. Written into each host's own files, as the rest of personalize's.
MEMINFO_UNIT = """# llamarack lab: the host's memory as its cap (its memory cgroup's limit): lxcfs
# (bound at /var/lib/lxcfs by the lab) serves a per-container /proc/meminfo.
[Unit]
Description=Container memory from lxcfs (llamarack lab)
DefaultDependencies=no
ConditionPathExists=/var/lib/lxcfs/proc/meminfo
Before=sysinit.target

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/bin/mount --bind /var/lib/lxcfs/proc/meminfo /proc/meminfo

[Install]
WantedBy=sysinit.target
"""


def _lxcfs_meminfo(root: Path) -> None:
    sysd = root / "etc/systemd/system"
    (sysd / "lxcfs-meminfo.service").write_text(MEMINFO_UNIT)
    wants = sysd / "sysinit.target.wants"
    wants.mkdir(exist_ok=True)
    (wants / "lxcfs-meminfo.service").symlink_to("/etc/systemd/system/lxcfs-meminfo.service")


DRIVER_SOURCE = "etc/apt/sources.list.d/llamarack-lab-nvidia.list"


def add_driver_source(root: Path, url: str) -> None:
    """The lab's apt repository of the fake driver as one of the host's apt sources (a GPU
    host of a real site reaches NVIDIA's repository, or its own mirror of it, the same way)."""
    (root / DRIVER_SOURCE).write_text(f"deb [trusted=yes] {url} ./\n")


def make_driver_layer(layer_dir: Path, lower: Path, debs: list[Path]) -> Path:
    """The fake driver's packages installed once over the image, into a layer of their own
    (the upper dir of an overlay on the image) that each GPU host's root puts between its
    own upper dir and the image: dpkg runs once for the rack. dpkg runs the maintainer
    scripts chrooted into the root (nvidia-kernel-dkms builds the module the boot unit
    loads). Returns the layer."""
    root = make_overlay(layer_dir, lower)
    try:
        run(["dpkg", f"--root={root}", "--force-unsafe-io", "-i", *map(str, debs)])
    finally:
        run(["umount", str(root)])
    return layer_dir / "upper"


# --- process -----------------------------------------------------------------

def nspawn_command(name: str, root: Path, netns: str, lxcfs_dir: str | None) -> list[str]:
    cmd = [
        "systemd-nspawn", "--quiet", "--boot", "--register=no", "--keep-unit",
        f"--machine={name}", f"--directory={root}",
        f"--network-namespace-path=/run/netns/{netns}",
        "--resolv-conf=off", "--timezone=off", "--link-journal=no", "--console=read-only",
        f"--bind={paths.CCACHE_DIR}:{paths.GUEST_CCACHE_DIR}",
    ]
    if lxcfs_dir:
        cmd.append(f"--bind-ro={lxcfs_dir}:/var/lib/lxcfs")
    return cmd


def launch(name: str, hdir: Path, nspawn_cmd: list[str]) -> dict:
    """Start the supervisor (relaunches nspawn after a guest reboot) in the
    host's own cgroups."""
    cgroups = make_cgroups(name)
    if any(cgroup_pids(c) for c in cgroups):
        raise LabError(f"cgroup of {name} is not empty: another lab running?")
    pid = spawn_in_cgroups([sys.executable, str(SUPERVISOR), *nspawn_cmd],
                           cgroups, hdir / "console.log")
    return {"pid": pid, "cgroups": cgroups}


def ssh_banner(ip: str, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((ip, 22), timeout=timeout) as s:
            s.settimeout(timeout)
            return s.recv(8).startswith(b"SSH-")
    except OSError:
        return False


def wait_ssh(ip: str, timeout: float, alive=lambda: True) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ssh_banner(ip):
            return
        if not alive():
            raise LabError(f"host {ip}: nspawn exited during boot")
        time.sleep(0.1)
    raise LabError(f"host {ip}: no SSH after {timeout:.0f} s")


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie child of ours is not alive
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False

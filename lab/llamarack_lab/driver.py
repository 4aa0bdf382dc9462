"""Change the fake NVIDIA driver of a running lab host, through dpkg over
SSH like an admin (or unattended-upgrades) would; and say which processes
its cards run."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from . import paths
from .fake_nvidia import deb
from .rack import Rack
from .util import LabError

NO_MODULE_FLAG = "/etc/llamarack-lab/nvidia-no-module"
PROCESSES_JSON = "/etc/llamarack-lab/gpu-processes.json"
MODULE_TOOL = "/usr/lib/llamarack-lab/nvidia-module"
UNLOAD = "rm -f /proc/driver/nvidia/version; rmdir /proc/driver/nvidia 2>/dev/null; true"


def _ok(r, what: str) -> None:
    if r.returncode != 0:
        raise LabError(f"{what} failed ({r.returncode}): {r.stderr.strip() or r.stdout.strip()}")


def install(rack: Rack, host: str, version: str) -> None:
    """dpkg -i a new nvidia-driver package: user space changes at once,
    the loaded module stays until reboot."""
    pkg = deb.build_deb(version, paths.cache_dir() / "debs")
    r = rack.ssh(host, "f=$(mktemp --suffix=.deb) && cat > \"$f\" && "
                       "dpkg -i \"$f\" >/dev/null; rc=$?; rm -f \"$f\"; exit $rc",
                 input=pkg.read_bytes())
    _ok(r, f"dpkg -i {pkg.name} on {host}")


def installed_version(rack: Rack, host: str) -> str | None:
    r = rack.ssh(host, "dpkg-query -W -f '${Status} ${Version}' nvidia-driver")
    parts = r.stdout.split()
    if r.returncode != 0 or "installed" not in parts:
        return None
    return parts[-1].rsplit("-", 1)[0]


def set_driver(rack: Rack, host: str, version: str | None = None,
               state: str | None = None) -> str:
    rack.host(host)  # unknown host -> clear error
    if version:
        deb.check_version(version)
        if state == "missing":
            raise LabError("--version and --state missing contradict each other")
        install(rack, host, version)
    if state == "missing":
        _ok(rack.ssh(host, "dpkg --purge nvidia-driver >/dev/null"), "dpkg --purge")
    elif state == "no-module":
        _ok(rack.ssh(host, f"touch {NO_MODULE_FLAG}; {UNLOAD}"), "unload module")
    elif state == "ok":
        if installed_version(rack, host) is None:
            install(rack, host, version or deb.DEFAULT_VERSION)
        _ok(rack.ssh(host, f"rm -f {NO_MODULE_FLAG}; {UNLOAD}; {MODULE_TOOL} load"),
            "load module")
    pkg = installed_version(rack, host)
    mod = rack.ssh(host, "cat /proc/driver/nvidia/version 2>/dev/null").stdout.split("  ")
    loaded = mod[1].strip() if len(mod) > 1 else None
    return f"{host}: package {pkg or 'not installed'}, loaded module {loaded or 'none'}"


@dataclass(frozen=True)
class GpuProcess:
    """A compute process the fake nvidia-smi lists on a card (the guest's pid)."""

    pid: int
    name: str
    used_mib: int
    gpu_uuid: str

    def __post_init__(self):
        if not (isinstance(self.pid, int) and self.pid > 0 and isinstance(self.used_mib, int) and self.used_mib >= 0
                and isinstance(self.name, str) and self.name and str(self.gpu_uuid).startswith("GPU-")):  # fmt: skip
            raise LabError(f"not a GPU process: {self!r} (a pid, a name, MiB used and a GPU-... UUID)")


def set_gpu_processes(rack: Rack, host: str, processes: tuple = ()) -> str:
    """What ``host``'s nvidia-smi lists as its compute processes from now on (its
    ``--query-compute-apps``, its table, ``-q``, and each card's memory.used): ``processes``
    (``GpuProcess``), in that order; none when empty. A process on a card its running
    driver does not list is not shown. The file stands until it is set again: a process
    that ends or restarts (another pid) is set again by the test."""
    rack.host(host)  # unknown host -> clear error
    text = json.dumps([asdict(p) for p in processes], indent=2) + "\n"
    r = rack.ssh(host, f"cat > {PROCESSES_JSON}.new && mv -f {PROCESSES_JSON}.new {PROCESSES_JSON}",
                 input=text.encode())  # fmt: skip
    _ok(r, f"writing {PROCESSES_JSON} on {host}")
    return f"{host}: {len(processes)} GPU process(es) listed"

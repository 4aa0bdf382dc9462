"""Change the fake NVIDIA driver of a running lab host, through dpkg over
SSH like an admin (or unattended-upgrades) would."""

from __future__ import annotations

from . import paths
from .fake_nvidia import deb
from .rack import Rack
from .util import LabError

NO_MODULE_FLAG = "/etc/llamarack-lab/nvidia-no-module"
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

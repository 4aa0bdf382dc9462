"""Change the fake NVIDIA driver of a running lab host, through dpkg over
SSH like an admin (or unattended-upgrades) would, or make its module build
fail; and say which processes its cards run."""

from __future__ import annotations

import io
import json
import shlex
import tarfile
from dataclasses import asdict, dataclass

from . import paths, profiles
from .fake_nvidia import deb
from .rack import Rack
from .util import LabError

NO_MODULE_FLAG = "/etc/llamarack-lab/nvidia-no-module"
PROCESSES_JSON = "/etc/llamarack-lab/gpu-processes.json"
HIDDEN_JSON = "/etc/llamarack-lab/gpu-processes-hidden.json"
CARDS_OFF_JSON = "/etc/llamarack-lab/cards-off.json"
GPUS_JSON = "/etc/llamarack-lab/gpus.json"
PROFILE_FILE = "/etc/llamarack-lab/profile"
MODULE_TOOL = "/usr/lib/llamarack-lab/nvidia-module"
UNLOAD = "rm -f /proc/driver/nvidia/version; rmdir /proc/driver/nvidia 2>/dev/null; true"


def _ok(r, what: str) -> None:
    if r.returncode != 0:
        raise LabError(f"{what} failed ({r.returncode}): {r.stderr.strip() or r.stdout.strip()}")


def install(rack: Rack, host: str, version: str) -> None:
    """dpkg -i the driver's whole package set at ``version`` at once (an upgrade, a
    downgrade or a first install): user space changes at once, nvidia-kernel-dkms builds
    the module for the next boot (its error, where the build fails, is the LabError's),
    the loaded module stays until reboot."""
    debs = deb.build_set(version, paths.cache_dir() / "debs")
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w") as tar:
        for d in debs:
            tar.add(d, arcname=d.name)
    r = rack.ssh(host, 'd=$(mktemp -d) && tar -x -C "$d" && dpkg -i "$d"/*.deb >/dev/null; '
                       'rc=$?; rm -rf "$d"; exit $rc', input=archive.getvalue())  # fmt: skip
    _ok(r, f"dpkg -i of the NVIDIA driver {version} ({len(debs)} packages) on {host}")


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
        _ok(rack.ssh(host, "dpkg --purge " + " ".join(deb.package_names()) + " >/dev/null"), "dpkg --purge")
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


def set_dkms_fault(rack: Rack, host: str, version: str | None) -> str:
    """Make the module build of driver ``version`` fail on ``host`` from now on (the
    postinst of its nvidia-kernel-dkms fails with DKMS's error, so dpkg and apt do), as a
    kernel the module's source does not build for; None: builds succeed again."""
    rack.host(host)  # unknown host -> clear error
    if version is None:
        _ok(rack.ssh(host, f"rm -f {deb.DKMS_FAILS}"), f"removing {deb.DKMS_FAILS} on {host}")
        return f"{host}: module builds succeed"
    deb.check_version(version)
    _ok(rack.ssh(host, f"echo {version} > {deb.DKMS_FAILS}"), f"writing {deb.DKMS_FAILS} on {host}")
    return f"{host}: the module build of {version} fails (DKMS)"


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


def _write(rack: Rack, host: str, path: str, value) -> None:
    """``value`` as JSON in ``path`` on ``host``, replaced whole (None: the file removed)."""
    if value is None:
        _ok(rack.ssh(host, f"rm -f {shlex.quote(path)}"), f"removing {path} on {host}")
        return
    q = shlex.quote(path)
    r = rack.ssh(host, f"cat > {q}.new && mv -f {q}.new {q}", input=(json.dumps(value, indent=2) + "\n").encode())
    _ok(r, f"writing {path} on {host}")


def set_gpu_processes(rack: Rack, host: str, processes: tuple = ()) -> str:
    """What ``host``'s nvidia-smi lists as its compute processes from now on (its
    ``--query-compute-apps``, its table, ``-q``, and each card's memory.used): ``processes``
    (``GpuProcess``), in that order, in place of the running ones it finds. None given: it
    lists the running ones again (each llama-server on the cards its CUDA_VISIBLE_DEVICES
    names). A process on a card its running driver does not list is not shown. The file
    stands until it is set again: a process that ends or restarts (another pid) is set
    again by the test."""
    rack.host(host)  # unknown host -> clear error
    _write(rack, host, PROCESSES_JSON, [asdict(p) for p in processes] if processes else None)
    return f"{host}: {len(processes)} GPU process(es) listed" if processes else f"{host}: the running GPU processes listed"


def hide_gpu_processes(rack: Rack, host: str, hide: bool = True, pids: tuple = (), units: tuple = ()) -> str:
    """Make ``host``'s driver drop running processes from its lists, as a driver that does
    not see the served PID: every one (no ``pids``/``units``), or those pids and those of the
    systemd units named (``llamarack-server@1.service``). ``hide=False``: show them all again."""
    rack.host(host)
    if not all(isinstance(p, int) and p > 0 for p in pids) or not all(isinstance(u, str) and u for u in units):
        raise LabError(f"not pids and unit names: {pids!r}, {units!r}")
    value = {"all": not (pids or units), "pids": list(pids), "units": list(units)} if hide else None
    _write(rack, host, HIDDEN_JSON, value)
    what = ", ".join([*map(str, pids), *units]) or "every running process"
    return f"{host}: {what} hidden from the driver's lists" if hide else f"{host}: no process hidden"


def host_cards(rack: Rack, host: str) -> list[dict]:
    """The cards ``host`` has (its gpus.json), in its order."""
    found = rack.host(host)
    return profiles.gpus_json(found["name"], found["profile"])


def reseat(rack: Rack, host: str, profile: str) -> str:
    """Give ``host`` the cards of GPU profile ``profile`` in place of its own, as a server
    whose cards were swapped: its driver lists them from now on (every card on the bus),
    and the rack remembers the host's new profile (``lab status``, ``cards``)."""
    found = rack.host(host)
    if profile not in profiles.PROFILES:
        raise LabError(f"unknown GPU profile {profile!r}; known: {', '.join(profiles.PROFILES)}")
    _write(rack, host, GPUS_JSON, profiles.gpus_json(found["name"], profile))
    _write(rack, host, CARDS_OFF_JSON, None)
    _ok(rack.ssh(host, f"echo {shlex.quote(profile)} > {shlex.quote(PROFILE_FILE)}"), f"writing {PROFILE_FILE} on {host}")
    found["profile"] = profile
    rack.save()
    return f"{host}: the cards of {profile} ({len(profiles.PROFILES[profile].gpus)})"


def set_card(rack: Rack, host: str, card: int, on: bool) -> str:
    """Take card ``card`` (its place among the host's cards, 0-based) off the bus, or put it
    back: the driver stops listing it (and numbers the others without it), or lists it again."""
    cards = host_cards(rack, host)
    if not 0 <= card < len(cards):
        raise LabError(f"{host} has {len(cards)} card(s): no card {card}")
    r = rack.ssh(host, f"cat {CARDS_OFF_JSON} 2>/dev/null || echo '[]'")
    _ok(r, f"reading {CARDS_OFF_JSON} on {host}")
    off = [u for u in json.loads(r.stdout or "[]") if u != cards[card]["uuid"]] + ([] if on else [cards[card]["uuid"]])
    _write(rack, host, CARDS_OFF_JSON, off)
    listed = [i for i, c in enumerate(cards) if c["uuid"] not in off]
    return f"{host}: card {card} ({cards[card]['bus_id']}) {'back on' if on else 'off'} the bus; cards listed: {listed}"

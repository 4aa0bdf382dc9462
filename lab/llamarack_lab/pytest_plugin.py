"""pytest plugin for tests that need the lab rack.

Register with `pytest_plugins = ["llamarack_lab.pytest_plugin"]`.

- fixture `lab_rack` (session): brings up the default rack and tears it
  down at the end. With LLAMARACK_LAB_REUSE=1 a rack that is already up
  and healthy is used as is and left up; a rack started here is then also
  left up for the next run. A rack that cannot start is a test failure,
  never a skip.
- marker `lab`: tests that need the rack (select with -m lab, or
  deselect with -m "not lab").
"""

from __future__ import annotations

import collections
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from . import driver as drivermod
from . import rack as rackmod
from . import trace
from .util import LabError


def pytest_sessionstart(session):
    """A rack whose hosts are gone (left by a run that was killed: its processes
    ended, its state kept) is only debris: remove it, so lab tests start clean.
    A live rack is someone's: it is left alone, and the lab tests say so."""
    existing = rackmod.load()
    if existing is not None and rackmod.stale(existing):
        errors = rackmod.down()
        print(f"llamarack lab: removed a stale rack (its hosts were gone){': ' + '; '.join(errors) if errors else ''}")


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "lab: needs the llamarack lab rack (root, systemd-nspawn); "
                   "fails, does not skip, when the lab cannot start")


def pyinfra_command() -> list[str]:
    exe = shutil.which("pyinfra")
    return [exe] if exe else [sys.executable, "-m", "pyinfra"]


def parse_pyinfra_totals(output: str) -> dict[str, int]:
    """Grand total line of pyinfra's results table:
    {'hosts': N, 'success': changed ops, 'error': N, 'no_change': N}."""
    m = re.search(r"^\s*Grand total\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s*$", output, re.M)
    if not m:
        raise AssertionError("no 'Grand total' line in pyinfra output:\n" + output[-3000:])
    vals = [0 if v == "-" else int(v) for v in m.groups()]
    return dict(zip(["hosts", "success", "error", "no_change"], vals))


ANSI = re.compile(r"\x1b\[[0-9;]*m")


def count_remote_work(debug_output: str, hosts: list[str]) -> dict:
    """Per host, from a ``--debug`` run's output (pyinfra's own log lines): the remote
    commands ("Running command on HOST"), the fact reads ("Loaded fact") and the
    facts read more than once."""
    text = ANSI.sub("", debug_output)
    commands = collections.Counter(re.findall(r"Running command on (\S+?): \(pty", text))
    facts: dict = collections.defaultdict(collections.Counter)
    for host, fact in re.findall(r"\[([^\]\s]+)\]\s+Loaded fact (.+?)\s*$", text, re.M):
        facts[host][fact] += 1
    return {
        h: {"remote_commands": commands.get(h, 0), "fact_reads": sum(facts[h].values()),
            "facts_read_more_than_once": {f: n for f, n in facts[h].items() if n > 1}}  # fmt: skip
        for h in hosts
    }


class LabRack:
    """What tests get: the hosts and helpers to act on them."""

    def __init__(self, rack: rackmod.Rack):
        self.rack = rack

    @property
    def hosts(self) -> list[rackmod.LabHost]:
        """The serving hosts (what most tests deploy and ask for completions)."""
        return self.rack.serving

    @property
    def all_hosts(self) -> list[rackmod.LabHost]:
        """Every host, the gateway included."""
        return self.rack.hosts

    @property
    def gateways(self) -> list[rackmod.LabHost]:
        return [h for h in self.rack.hosts if h.gateway]

    @property
    def inventory_path(self) -> Path:
        return self.rack.inventory_path

    def ssh(self, host: str, cmd: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return self.rack.ssh(host, cmd, timeout=timeout)

    def run_pyinfra(self, deploy, *args: str, inventory=None, timeout: float = 900):
        """Run pyinfra (-y) on the rack's inventory. deploy is a deploy file
        or a list of CLI words (e.g. ["server.shell", "commands=true"]).
        Returns (returncode, stdout+stderr)."""
        ops = [str(deploy)] if isinstance(deploy, (str, os.PathLike)) else list(deploy)
        cmd = [*pyinfra_command(), "-y", str(inventory or self.inventory_path), *ops, *args]
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           timeout=timeout)
        return r.returncode, r.stdout

    def driver(self, host: str, version: str | None = None, state: str | None = None) -> str:
        return drivermod.set_driver(self.rack, host, version=version, state=state)

    def dkms_fails(self, host: str, version: str | None) -> str:
        """The module build of driver ``version`` fails on the host from now on (None: builds
        succeed again): its nvidia-kernel-dkms postinst fails with DKMS's error."""
        return drivermod.set_dkms_fault(self.rack, host, version)

    def gpu_processes(self, host: str, *processes: drivermod.GpuProcess) -> str:
        """What the host's nvidia-smi lists as compute processes from now on, in place of the
        running ones it finds (none given: the running ones again);
        ``lab_rack.gpu_processes("lab-t4", GpuProcess(pid, "llama-server", 690, uuid))``."""
        return drivermod.set_gpu_processes(self.rack, host, processes)

    def hide_gpu_processes(self, host: str, hide: bool = True, pids: tuple = (), units: tuple = ()) -> str:
        """The host's driver drops running processes from its lists (all, or those ``pids`` and
        ``units``), as one that does not see the served PID; ``hide=False`` shows them again."""
        return drivermod.hide_gpu_processes(self.rack, host, hide, pids, units)

    def card(self, host: str, n: int, on: bool = False) -> str:
        """Card ``n`` (0-based, of the host's cards) falls off the bus (``on=False``: the driver
        stops listing it) or comes back (``on=True``)."""
        return drivermod.set_card(self.rack, host, n, on)

    def reseat(self, host: str, profile: str) -> str:
        """The host's cards become GPU profile ``profile``'s (a server whose cards were swapped)."""
        return drivermod.reseat(self.rack, host, profile)

    def cap_memory(self, host: str, mib: int | None) -> str:
        """Cap the host's memory at ``mib`` MiB (None: the machine's again): its /proc/meminfo's
        MemTotal says so (lxcfs), and the kernel's OOM killer holds the host to it."""
        return rackmod.set_memory(self.rack, host, mib)

    def cards(self, host: str) -> list[dict]:
        """The host's cards as its fake driver knows them (name, uuid, bus_id, links...), in order."""
        return drivermod.host_cards(self.rack, host)


@pytest.fixture(scope="session")
def lab_rack():
    reuse = os.environ.get("LLAMARACK_LAB_REUSE") == "1"
    existing = rackmod.load()
    started = False
    try:
        if existing is not None and reuse and rackmod.healthy(existing):
            rack = existing
        else:
            if existing is not None:
                if not reuse:
                    pytest.fail("a lab rack is already up: run 'llamarack lab down' or set "
                                "LLAMARACK_LAB_REUSE=1", pytrace=False)
                rackmod.down()  # up but unhealthy: start afresh
            before = trace.machine_snapshot()
            rack = rackmod.up()
            started = True
    except LabError as e:
        pytest.fail(f"lab rack could not start: {e}", pytrace=False)
    yield LabRack(rack)
    if started and not reuse:
        errors = rackmod.down()
        # lab things only: other work on the machine may change the rest
        left = trace.leftovers()
        after = trace.machine_snapshot()
        if after["ip_forward"] != before["ip_forward"]:
            left.append(f"ip_forward {before['ip_forward']} -> {after['ip_forward']}")
        if errors or left:
            pytest.fail(f"lab down left traces: {errors + left}", pytrace=False)

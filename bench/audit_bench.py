#!/usr/bin/env python3
"""What ``llamarack audit`` of the 4-host lab rack costs.

    python3 bench/audit_bench.py [--reps 7] [--reuse]     (as root, under the lab lock)

Uses the rack that is up with ``--reuse`` (it must be converged: the audit
must find no drift), else brings up the 4-host rack, deploys it until it
converges and takes it down at the end. Records:

- audit_s: wall time of ``llamarack audit inventory/lab.py --json`` (exit 0,
  every host reachable, no drift), median of --reps, beside a bare
  ``ssh HOST true`` fan-out to the same hosts in the same minutes. Both are
  figures, not bounds: the lab's hosts share this machine's cores with the
  audit, so they follow the minute they are taken;
- audit_control_cpu_s: the audit's CPU on this machine;
- remote_commands_per_host: from one ``--debug`` run (pyinfra's own log lines);
- script_bytes: the size of each host's one command;
- hosts_unchanged: the hosts' files, unit and server process before and after.

Writes bench/results/audit.json, stamped by ``bench/provenance.py``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

import provenance  # noqa: E402  (this folder's)
from llamarack_lab import rack as rackmod  # noqa: E402
from llamarack_lab.pytest_plugin import count_remote_work  # noqa: E402

from converged_bench import _cpu, _pyinfra_version, deploy, ssh_fan_out  # noqa: E402

INVENTORY = ROOT / "inventory/lab.py"
# What an audit must not change on a host: llamarack's files, the unit, the server process.
HOST_STATE = ("find /opt/llamarack /etc/systemd/system/llamarack-server.service -xdev -printf '%p %s %T@ %m\\n' "
              "| sort | sha256sum; systemctl show -p MainPID -p NRestarts llamarack-server.service")


def audit(*args: str) -> tuple[float, float, dict, str]:
    """(wall seconds, CPU seconds here, report, stderr) of one audit; it must find every host converged."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "llamarack", "audit", str(INVENTORY), "--json", *args], cwd=ROOT,
                       capture_output=True, text=True, timeout=600)  # fmt: skip
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    report = json.loads(r.stdout) if r.stdout.startswith("{") else {}
    if r.returncode != 0 or not all(v["reachable"] and not v["drift"] for v in report["hosts"].values()):
        raise SystemExit(f"audit exit {r.returncode}:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return wall, cpu, report, r.stderr


def script_bytes() -> dict:
    """{host: bytes of the one command the audit runs there}, from its settings."""
    from roles.audit import audit_reads
    from llamarack.facts.reading import FactsTogether
    from llamarack.hosts import load
    from roles.settings import settings_for

    return {h.name: len(FactsTogether().command(reads=audit_reads(settings_for(h))).encode())
            for h in load(str(INVENTORY))}  # fmt: skip


def measure(rack, reps: int) -> dict:
    hosts = [h.name for h in rack.hosts]
    state_before = {h: rack.ssh(h, HOST_STATE).stdout for h in hosts}
    audit()  # warm this machine's page cache, as any second run finds it
    walls, cpus, fan_outs = [], [], []
    for _ in range(reps):
        fan_outs.append(ssh_fan_out(rack))
        wall, cpu, _, _ = audit()
        walls.append(wall)
        cpus.append(cpu)
    work = count_remote_work(audit("--debug")[3], hosts)
    return {
        "audit_s": {"median": round(statistics.median(walls), 3), "runs": [round(t, 3) for t in walls]},
        "ssh_true_fan_out_s": {"median": round(statistics.median(fan_outs), 3)},
        "audit_control_cpu_s": round(statistics.median(cpus), 3),
        "remote_commands_per_host": {h: v["remote_commands"] for h, v in work.items()},
        "script_bytes": script_bytes(),
        "hosts_unchanged": {h: rack.ssh(h, HOST_STATE).stdout == state_before[h] for h in hosts},
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--reuse", action="store_true", help="use the rack that is up (converged)")
    args = ap.parse_args()
    rack = rackmod.load()
    if rack is not None and not args.reuse:
        raise SystemExit("a lab rack is up: run 'llamarack lab down' first, or pass --reuse")
    brought_up = rack is None
    rack = rack or rackmod.up(n=4)
    try:
        if brought_up:
            deploy()
            deploy()  # converged: the second run changes nothing
        load_before = os.getloadavg()
        figures = measure(rack, args.reps)
        load_after = os.getloadavg()
    finally:
        if brought_up:
            rackmod.down()
    result = {
        "provenance": provenance.stamp(__file__),
        "date": datetime.date.today().isoformat(),
        "machine": {"cpu": _cpu(), "cores": os.cpu_count(), "python": platform.python_version(),
                    "pyinfra": _pyinfra_version()},  # fmt: skip
        "hosts": len(rack.hosts),
        "reps": args.reps,
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in load_after],
        **figures,
    }
    (ROOT / "bench/results/audit.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

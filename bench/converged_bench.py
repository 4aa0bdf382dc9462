#!/usr/bin/env python3
"""What a converged deploy and an audit of the lab rack cost: time, remote commands and fact reads per host.

    python3 bench/converged_bench.py [--reps 5] [--reuse] [--hosts N] [--state-on-disk DIR]   (as root)

Brings up the default 4-host rack (``--hosts N``: N hosts cycling the same
profiles, deployed through the rack's own inventory; ``--reuse``: the rack
that is up), runs the README's deploy (``pyinfra -y inventory/lab.py
deploy.py``) until it converges, then measures:

- first_deploy_s, second_deploy_s: the README's figures with this machine's caches;
- converged_s: median wall time of --reps converged runs (every operation "No changes");
- per host, from one converged run with --debug (pyinfra's own log lines):
  remote commands ("Running command on HOST") and fact reads ("Loaded fact"),
  with the facts read more than once;
- audit_s: median of --reps ``llamarack audit inventory/lab.py --json`` (exit 0), against
  a bare fan-out of ``ssh HOST true`` to the same hosts in parallel (ssh_true_s), and
  the audit's remote commands per host (its --debug log);
- the load average when the timings start (other work on the machine skews them).

Writes bench/results/converged.json (``converged-<N>hosts.json`` for another N), the
machine noted, stamped by ``bench/provenance.py``; takes down a rack it brought up.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

import provenance  # noqa: E402  (this folder's)
from llamarack_lab import rack as rackmod  # noqa: E402
from llamarack_lab.pytest_plugin import count_remote_work, parse_pyinfra_totals, pyinfra_command  # noqa: E402

INVENTORY = ROOT / "inventory/lab.py"  # the README's; --hosts N uses the rack's own
DEPLOY = ROOT / "deploy.py"


inventory = INVENTORY


def deploy(*args: str) -> tuple[float, str]:
    started = time.monotonic()
    r = subprocess.run([*pyinfra_command(), "-y", str(inventory), str(DEPLOY), *args], cwd=ROOT,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=3600)  # fmt: skip
    elapsed = time.monotonic() - started
    if r.returncode != 0:
        raise SystemExit(f"deploy failed (rc {r.returncode}):\n{r.stdout[-4000:]}")
    return elapsed, r.stdout


def audit(*args: str) -> tuple[float, str]:
    """``llamarack audit inventory/lab.py --json``: (seconds, stderr); it must find no drift."""
    started = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "llamarack", "audit", str(inventory), "--json", *args], cwd=ROOT,
                       capture_output=True, text=True, timeout=600)  # fmt: skip
    elapsed = time.monotonic() - started
    if r.returncode != 0:
        raise SystemExit(f"audit exit {r.returncode}:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return elapsed, r.stderr


def ssh_fan_out(rack) -> float:
    """Wall time of ``ssh HOST true`` to every host at once: the floor any remote audit pays."""
    started = time.monotonic()
    procs = [subprocess.Popen(rack.ssh_command(h.name, "true"), stdin=subprocess.DEVNULL) for h in rack.hosts]
    if any(p.wait(timeout=120) for p in procs):
        raise SystemExit("ssh HOST true failed")
    return time.monotonic() - started


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--keep-log", action="store_true", help="keep the --debug run's output (not committed)")
    ap.add_argument("--reuse", action="store_true", help="use the rack that is up")
    ap.add_argument("--hosts", type=int, default=4, help="hosts in the rack (default 4: the README's)")
    ap.add_argument("--state-on-disk", metavar="DIR",
                    help="keep the rack's state in DIR on disk, not the lab's tmpfs (75%% of the memory: "
                         "a converged host holds about 2 GB, so 16 hosts do not fit there)")
    args = ap.parse_args()
    if args.state_on_disk:
        os.environ.update(LLAMARACK_LAB_DIR=args.state_on_disk, LLAMARACK_LAB_TMPFS="0")
    rack = rackmod.load()
    if rack is not None and not args.reuse:
        raise SystemExit("a lab rack is up: run 'llamarack lab down' first, or pass --reuse")
    started = time.monotonic()
    brought_up = rack is None
    rack = rack or rackmod.up(n=args.hosts)
    global inventory
    # the README's rack: 4 serving hosts (and its gateway, which the deploy provisions too)
    readme_rack = len(rack.serving) == 4
    inventory = INVENTORY if readme_rack else rack.inventory_path
    up_s = time.monotonic() - started if brought_up else None
    try:
        hosts = [h.name for h in rack.hosts]
        first_s, _ = deploy()
        second_s, out = deploy()
        totals = parse_pyinfra_totals(out)
        if totals["success"] or totals["error"]:
            raise SystemExit(f"the second deploy was not converged: {totals}")
        load = os.getloadavg()
        times = [deploy()[0] for _ in range(args.reps)]
        _, debug = deploy("--debug")
        (ROOT / "bench/results/converged-debug.log").write_text(debug) if args.keep_log else None
        per_host = count_remote_work(debug, hosts)
        audit_times = [audit()[0] for _ in range(args.reps)]
        audit_work = count_remote_work(audit("--debug")[1], hosts)
        ssh_times = [ssh_fan_out(rack) for _ in range(args.reps)]
    finally:
        if brought_up:
            rackmod.down()
    median = statistics.median(times)
    result = {
        "provenance": provenance.stamp(__file__),
        "date": datetime.date.today().isoformat(),
        "machine": {"cpu": _cpu(), "cores": os.cpu_count(), "python": platform.python_version(),
                    "pyinfra": _pyinfra_version()},  # fmt: skip
        "hosts": len(hosts),
        "serving_hosts": len(rack.serving),
        "lab_state": "disk" if args.state_on_disk else "tmpfs",
        "lab_up_s": round(up_s, 2) if up_s is not None else None,
        "first_deploy_s": round(first_s, 1),
        "second_deploy_s": round(second_s, 2),
        "load_average_at_timing": [round(x, 2) for x in load],
        "converged_s": {"median": round(median, 2), "runs": [round(t, 2) for t in times]},
        "per_host": per_host,
        "remote_commands_per_host_median": statistics.median(v["remote_commands"] for v in per_host.values()),
        "audit_s": {"median": round(statistics.median(audit_times), 2), "runs": [round(t, 2) for t in audit_times]},
        "ssh_true_fan_out_s": {"median": round(statistics.median(ssh_times), 3),
                               "runs": [round(t, 3) for t in ssh_times]},
        "audit_over_ssh_fan_out": round(statistics.median(audit_times) / statistics.median(ssh_times), 1),
        "audit_remote_commands_per_host": {h: v["remote_commands"] for h, v in audit_work.items()},
    }
    serving = len(rack.serving)
    path = ROOT / ("bench/results/converged.json" if readme_rack else f"bench/results/converged-{serving}hosts.json")
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return 0


def _cpu() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def _pyinfra_version() -> str:
    import pyinfra

    return getattr(pyinfra, "__version__", "?")


if __name__ == "__main__":
    sys.exit(main())

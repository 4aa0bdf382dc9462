#!/usr/bin/env python3
"""What a converged deploy of the lab rack costs: time, remote commands and fact reads per host.

    python3 bench/converged_bench.py [--reps 5]        (as root, with no lab rack up)

Brings up the default 4-host rack, runs the README's deploy
(`pyinfra -y inventory/lab.py deploy.py`) until it converges, then measures:

- first_deploy_s, second_deploy_s: the README's figures with this machine's caches;
- converged_s: median wall time of --reps converged runs (every operation "No changes");
- per host, from one converged run with --debug (pyinfra's own log lines):
  remote commands ("Running command on HOST") and fact reads ("Getting fact"),
  with the facts read more than once.

Writes bench/results/converged.json (the machine noted) and takes the rack down.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from llamarack.lab import rack as rackmod  # noqa: E402
from llamarack.lab.pytest_plugin import count_remote_work, parse_pyinfra_totals, pyinfra_command  # noqa: E402

INVENTORY = ROOT / "inventory/lab.py"
DEPLOY = ROOT / "deploy.py"


def deploy(*args: str) -> tuple[float, str]:
    started = time.monotonic()
    r = subprocess.run([*pyinfra_command(), "-y", str(INVENTORY), str(DEPLOY), *args], cwd=ROOT,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=3600)  # fmt: skip
    elapsed = time.monotonic() - started
    if r.returncode != 0:
        raise SystemExit(f"deploy failed (rc {r.returncode}):\n{r.stdout[-4000:]}")
    return elapsed, r.stdout


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--keep-log", action="store_true", help="keep the --debug run's output (not committed)")
    args = ap.parse_args()
    if rackmod.load() is not None:
        raise SystemExit("a lab rack is up: run 'llamarack lab down' first")
    started = time.monotonic()
    rack = rackmod.up()
    up_s = time.monotonic() - started
    try:
        hosts = [h.name for h in rack.hosts]
        first_s, _ = deploy()
        second_s, out = deploy()
        totals = parse_pyinfra_totals(out)
        if totals["success"] or totals["error"]:
            raise SystemExit(f"the second deploy was not converged: {totals}")
        times = [deploy()[0] for _ in range(args.reps)]
        _, debug = deploy("--debug")
        (ROOT / "bench/results/converged-debug.log").write_text(debug) if args.keep_log else None
        per_host = count_remote_work(debug, hosts)
    finally:
        rackmod.down()
    result = {
        "date": datetime.date.today().isoformat(),
        "machine": {"cpu": _cpu(), "cores": os.cpu_count(), "python": platform.python_version(),
                    "pyinfra": _pyinfra_version()},  # fmt: skip
        "hosts": len(hosts),
        "lab_up_s": round(up_s, 2),
        "first_deploy_s": round(first_s, 1),
        "second_deploy_s": round(second_s, 2),
        "converged_s": {"median": round(statistics.median(times), 2), "runs": [round(t, 2) for t in times]},
        "per_host": per_host,
        "remote_commands_per_host_median": statistics.median(v["remote_commands"] for v in per_host.values()),
    }
    path = ROOT / "bench/results/converged.json"
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

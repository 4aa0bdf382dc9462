#!/usr/bin/env python3
"""Lab benchmark: how fast a rack comes up and goes, and whether pyinfra
runs scale across hosts. Writes bench/results/lab.json, stamped by
``bench/provenance.py``.

    sudo python3 bench/lab_bench.py [--reps 3] [--skip-cold]

Measures (median of --reps unless said):
- cold_up_4: 4 hosts from nothing: empty image cache (mmdebstrap build),
  once (target <= 120 s);
- warm_up_4: 4 hosts with the cached image (target <= 10 s);
- down_4: teardown of 4 hosts (target <= 5 s);
- converged pyinfra run of tests/lab/deploys/trivial.py on 16 hosts vs
  1 host (--limit) of the same converged rack (target ratio <= 1.5), with
  the CPU each run took (the machine's, and pyinfra's own); once as
  llamarack connects (TCP_NODELAY, llamarack/ssh.py) and once with
  paramiko's default (Nagle on) for reference.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

import provenance  # noqa: E402  (this folder's)
from llamarack_lab import rack as rackmod, trace  # noqa: E402
from llamarack_lab.pytest_plugin import parse_pyinfra_totals, pyinfra_command  # noqa: E402

DEPLOY = ROOT / "tests/lab/deploys/trivial.py"
OUT = ROOT / "bench/results/lab.json"


def machine() -> dict:
    mem_kib = int(next(l for l in open("/proc/meminfo") if l.startswith("MemTotal")).split()[1])
    pyinfra_v = subprocess.run([*pyinfra_command(), "--version"], capture_output=True,
                               text=True).stdout.strip()
    return {
        "nproc": os.cpu_count(),
        "mem_gib": round(mem_kib / 2**20, 1),
        "kernel": platform.release(),
        "os": platform.freedesktop_os_release().get("PRETTY_NAME", "?"),
        "python": platform.python_version(),
        "pyinfra": pyinfra_v,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        # other work on the machine skews these figures: recorded, not hidden
        "loadavg_at_start": open("/proc/loadavg").read().split()[:3],
    }


def stat(runs: list[float], target: float | None = None) -> dict:
    d = {"runs_s": [round(r, 2) for r in runs], "median_s": round(statistics.median(runs), 2)}
    if target is not None:
        d["target_s"] = target
        d["meets_target"] = d["median_s"] <= target
    return d


def timed(fn, *a, **kw):
    t0 = time.monotonic()
    res = fn(*a, **kw)
    return time.monotonic() - t0, res


def up_down(n: int) -> tuple[float, float]:
    t_up, _ = timed(rackmod.up, n)
    t_down, errors = timed(rackmod.down)
    if errors or trace.leftovers():
        raise SystemExit(f"down left traces: {errors} {trace.leftovers()}")
    return t_up, t_down


def machine_cpu_s() -> float:
    """CPU seconds the whole machine has spent busy (all cores, guests too)."""
    fields = open("/proc/stat").readline().split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq = map(int, fields[:7])
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def children_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def pyinfra_run(rack, *args) -> tuple[float, dict, dict]:
    """One pyinfra run: wall seconds, its totals, and the CPU it took."""
    cmd = [*pyinfra_command(), "-y", str(rack.inventory_path), str(DEPLOY), *args]
    cpu0, own0, t0 = machine_cpu_s(), children_cpu_s(), time.monotonic()
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    dt = time.monotonic() - t0
    cpu = {"machine_cpu_s": machine_cpu_s() - cpu0, "pyinfra_cpu_s": children_cpu_s() - own0}
    if r.returncode != 0:
        raise SystemExit(f"pyinfra failed:\n{r.stdout[-3000:]}")
    return dt, parse_pyinfra_totals(r.stdout), cpu


# paramiko's default connection (Nagle on): the reference for llamarack/ssh.py
NAGLE_ON = ("--data", "ssh_paramiko_connect_kwargs={}")


def converged(rack, reps: int, hosts: int, extra: tuple = ()) -> dict:
    """Converged runs on all hosts and on one, alternating; medians."""
    runs: dict[str, list] = {"many": [], "one": []}
    first = rack.hosts[0].name
    for _ in range(reps):
        for key, limit in (("many", ()), ("one", ("--limit", first))):
            dt, totals, cpu = pyinfra_run(rack, *extra, *limit)
            assert totals["success"] == 0, totals
            runs[key].append((dt, cpu))
        print(f"converged{' ' + ' '.join(extra) if extra else ''}: {hosts} hosts "
              f"{runs['many'][-1][0]:.2f} s, 1 host {runs['one'][-1][0]:.2f} s", flush=True)

    def summary(rs):
        d = stat([dt for dt, _ in rs])
        for k in ("machine_cpu_s", "pyinfra_cpu_s"):
            d[f"median_{k}"] = round(statistics.median(c[k] for _, c in rs), 2)
        return d

    many, one = summary(runs["many"]), summary(runs["one"])
    ratio = many["median_s"] / one["median_s"]
    return {f"{hosts}_hosts": many, "1_host": one,
            "ratio": {"hosts": hosts, "ratio": round(ratio, 2), "target": 1.5,
                      "meets_target": ratio <= 1.5}}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--skip-cold", action="store_true")
    ap.add_argument("--hosts", type=int, default=16)
    args = ap.parse_args()
    if rackmod.load() is not None:
        raise SystemExit("a lab rack is up: run 'llamarack lab down' first")
    result: dict = {"machine": machine(), "reps": args.reps}

    if not args.skip_cold:
        cold_cache = Path(tempfile.mkdtemp(prefix="bench-cold-", dir="/var/cache/llamarack"))
        os.environ["LLAMARACK_LAB_CACHE"] = str(cold_cache)
        try:
            t_up, t_down = up_down(4)
        finally:
            del os.environ["LLAMARACK_LAB_CACHE"]
            shutil.rmtree(cold_cache)
        result["cold_up_4_hosts"] = stat([t_up], 120)
        print(f"cold up 4: {t_up:.1f} s", flush=True)

    ups, downs = [], []
    rackmod.up(4)  # make sure the image is cached before timing warm ups
    rackmod.down()
    for _ in range(args.reps):
        t_up, t_down = up_down(4)
        ups.append(t_up)
        downs.append(t_down)
        print(f"warm up 4: {t_up:.1f} s, down: {t_down:.2f} s", flush=True)
    result["warm_up_4_hosts"] = stat(ups, 10)
    result["down_4_hosts"] = stat(downs, 5)

    t_up, rack = timed(rackmod.up, args.hosts)
    result[f"warm_up_{args.hosts}_hosts"] = stat([t_up])
    try:
        t_first, totals, _ = pyinfra_run(rack)
        result[f"first_run_{args.hosts}_hosts"] = stat([t_first])
        print(f"first run on {args.hosts}: {t_first:.1f} s {totals}", flush=True)
        result["converged"] = converged(rack, args.reps, args.hosts)
        result["converged_nagle_on"] = converged(rack, args.reps, args.hosts, NAGLE_ON)
        mem = subprocess.run(["free", "-m"], capture_output=True, text=True).stdout
        result[f"machine_mem_used_mib_with_{args.hosts}_hosts"] = int(mem.split("\n")[1].split()[2])
    finally:
        t_down, errors = timed(rackmod.down)
        result[f"down_{args.hosts}_hosts"] = stat([t_down])
    result["machine"]["loadavg_at_end"] = open("/proc/loadavg").read().split()[:3]
    result = {"provenance": provenance.stamp(__file__), **result}
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()

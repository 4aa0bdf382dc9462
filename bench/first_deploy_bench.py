#!/usr/bin/env python3
"""What the first deploy of a rack pays: each host making its own build and model, against once per rack.

    python3 bench/first_deploy_bench.py [--ways per_host,once]     (as root, no lab rack up)

The lab's hosts share one ccache, which a real rack rarely has: here each host has only its own
(``LLAMARACK_LAB_CCACHE=own``: ccache's default directory in the host, empty after ``lab up``).
For each way, a fresh rack of the README's shape (4 serving hosts and the gateway) gets the
README's deploy once (``pyinfra -y inventory/lab.py deploy.py``):

- ``per_host``: ``llamacpp_ship_builds=false model_ship_artifacts=false``: every host compiles
  its build and fetches, converts and quantizes its model;
- ``once``: ``llamacpp_ship_builds=true model_ship_artifacts=true``: one host compiles each
  build and makes each model artifact, the others receive them sealed.

Counted from the hosts and the lab's own records, not from the deploy's words:

- compiles: serving hosts whose served build holds CMake's cache (a received build carries its
  sealed files only);
- conversions and quantizations: distinct ``convert.log`` and ``quantize.log`` (sha256) among
  the serving hosts' served models (a shipped artifact would carry its maker's logs);
- hub bytes: the body bytes of the model files the lab's hub sent during the deploy (its
  ``hub.log`` records), against the checkpoint's size;
- bytes shipped: the deploy's "receiving it from HOST (N MiB)" lines, builds and models apart;
- wall time of the deploy, and the load average before it (other work skews it).

Writes bench/results/first-deploy.json, the machine noted, stamped by ``bench/provenance.py``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

import provenance  # noqa: E402  (this folder's)
from llamarack_lab import rack as rackmod, services  # noqa: E402
from llamarack_lab.pytest_plugin import pyinfra_command  # noqa: E402

WAYS = {"per_host": ("--data", "llamacpp_ship_builds=false", "--data", "model_ship_artifacts=false"),
        "once": ("--data", "llamacpp_ship_builds=true", "--data", "model_ship_artifacts=true")}
# "[host] llama.cpp ...: receiving it from lab-v100-32 (20 MiB), not compiling it" (``llamarack.ship``)
RECEIVED = re.compile(r"^\s*\[(\S+)\].*?(llama\.cpp|model) [^:]*: receiving it from (\S+) \((\d+) MiB\)", re.M)
ANSI = re.compile(r"\x1b\[[0-9;]*m")
BUILD = "/opt/llamarack/builds/current"
MODEL = "/opt/llamarack/models/current"


def hub_records(rack) -> list:
    """The lab hub's records so far (one JSON line per answered request in ``hub.log``)."""
    log = rack.state_dir / "hub.log"
    lines = log.read_text(errors="replace").splitlines() if log.exists() else []
    return [json.loads(line) for line in lines if line.startswith("{")]


def model_bytes(records: list) -> int:
    """Body bytes the hub sent of repository files (``/resolve/``), not its listings."""
    return sum(r["sent"] for r in records if r["method"] == "GET" and "/resolve/" in r["path"])


def host_state(rack, name: str) -> dict:
    """What the host made itself: its build's CMake cache, its model's pipeline logs."""
    r = rack.ssh(name, f"test -f {BUILD}/build/CMakeCache.txt && echo compiled; "
                       f"cd {MODEL} && sha256sum convert.log quantize.log 2>/dev/null")  # fmt: skip
    logs = dict(reversed(line.split()) for line in r.stdout.splitlines() if line.endswith(".log"))
    return {"compiled": "compiled" in r.stdout.split(), "logs": logs}


def checkpoint_bytes() -> int:
    """The size of the pinned checkpoint: the files of the repository the lab's hub serves."""
    return sum(f.stat().st_size for f in services.prepare_hub().rglob("*") if f.is_file())


def measure(way: str) -> dict:
    rack = rackmod.up()
    try:
        serving = [h.name for h in rack.serving]
        before = len(hub_records(rack))
        load = os.getloadavg()
        started = time.monotonic()
        r = subprocess.run([*pyinfra_command(), "-y", str(ROOT / "inventory/lab.py"), str(ROOT / "deploy.py"),
                            *WAYS[way]], cwd=ROOT, env=os.environ | {"LLAMARACK_LAB_CCACHE": "own"},
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=7200)  # fmt: skip
        wall = time.monotonic() - started
        if r.returncode != 0:
            raise SystemExit(f"{way}: deploy failed (rc {r.returncode}):\n{r.stdout[-4000:]}")
        hosts = {name: host_state(rack, name) for name in serving}
        served = hub_records(rack)[before:]
        received = {(host, what): (source, int(mib)) for host, what, source, mib in RECEIVED.findall(ANSI.sub("", r.stdout))}
        builds = [mib for (_, what), (_, mib) in received.items() if what == "llama.cpp"]
        models = [mib for (_, what), (_, mib) in received.items() if what == "model"]
        return {
            "deploy_s": round(wall, 1),
            "load_average_before": [round(x, 2) for x in load],
            "serving_hosts": len(serving),
            "compiles": sum(h["compiled"] for h in hosts.values()),
            "conversions": len({h["logs"].get("convert.log") for h in hosts.values()} - {None}),
            "quantizations": len({h["logs"].get("quantize.log") for h in hosts.values()} - {None}),
            "hub_model_bytes": model_bytes(served),
            "checkpoint_bytes": checkpoint_bytes(),
            "builds_received": len(builds),
            "build_mib_shipped": sum(builds),
            "models_received": len(models),
            "model_mib_shipped": sum(models),
            "per_host": {name: {"compiled": h["compiled"],
                                "build_from": received.get((name, "llama.cpp"), (None,))[0],
                                "model_from": received.get((name, "model"), (None,))[0]} for name, h in hosts.items()},
        }
    finally:
        rackmod.down()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ways", default=",".join(WAYS), help=f"which of {', '.join(WAYS)} (default: both)")
    args = ap.parse_args()
    ways = args.ways.split(",")
    if not set(ways) <= set(WAYS):
        raise SystemExit(f"--ways: {args.ways!r}; allowed: {', '.join(WAYS)}")
    if rackmod.load() is not None:
        raise SystemExit("a lab rack is up: run 'llamarack lab down' first")
    result = {
        "what": "the README's first deploy of the lab rack, each host with its own ccache, made per host and once",
        "provenance": provenance.stamp(__file__),
        "date": datetime.date.today().isoformat(),
        "machine": provenance.machine(),
        "ways": {way: measure(way) for way in ways},
    }
    path = ROOT / "bench/results/first-deploy.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

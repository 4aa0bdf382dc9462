"""On the GPU machine: the served unit's device rule, the residency check and the build
proof's GPU verdicts, against a real CUDA llama-server (``residency.sh build`` made it).

    python3 bench/gpu/residency.py --build DIR --hold HOLD --out OUT     (as root)

1. The device rule: the driver's names in ``/proc/devices`` (the ``CharDevices`` fact),
   through the server role's ``device_names``, against the major of every ``/dev/nvidia*``
   node: each node's major must be one the rule allows.
2. On the card: llama-server (the smoke model, the unit's flags, ``-ngl 999``) with the
   card reachable: the build proof's ``on_the_card`` passes, and the server role's
   ``residency`` finds its PID on the card with ``nvidia-smi --query-compute-apps``.
3. Device denied: the same, with opens of the major-195 nodes failing as the cgroup device
   rule makes them fail. No systemd here, so it is emulated: in a private mount namespace,
   ``/dev/nvidia0`` and ``/dev/nvidiactl`` are bind-mounted onto themselves and remounted
   ``nodev`` (an open then fails with EACCES, where the cgroup rule gives EPERM; CUDA sees
   no device either way). Both checks must refuse it, naming the cause.
4. A busy card: ``hold`` keeps all but KEEP MiB of the card (a live server during a bump);
   the build proof's smoke run with several KEEP values: where it fits it must pass, where
   it does not the failure must be named a GPU out-of-memory.

Writes OUT/gpu-residency.json and each server log under OUT/logs/.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from roles.driver.reads import CharDevices, GpuProcesses  # noqa: E402
from roles.llamacpp.files import llamacpp_proof as proof  # noqa: E402
from roles.server.files.wait_healthy import residency  # noqa: E402
from roles.server.plan import device_names  # noqa: E402

# The unit's flags but the KV cache (the build here leaves out the flash-attention kernels
# that a quantized V cache needs, to build in half the time).
ARGS = ["--cache-type-k", "f16", "--cache-type-v", "f16", "--n-gpu-layers", "999", "--flash-attn", "off",
        "--load-mode", "none"]
DENY = ("/dev/nvidia0", "/dev/nvidiactl")


def sh(*argv: str) -> str:
    return subprocess.run(argv, capture_output=True, text=True, timeout=120).stdout


def device_rule() -> dict:
    devices = CharDevices().process(Path("/proc/devices").read_text().splitlines())
    allowed = device_names(tuple(devices), cuda=True)
    by_major: dict = {}
    for d in devices:
        by_major.setdefault(d.major, []).append(d.name)
    nodes = {}
    for node in sorted(Path("/dev").glob("nvidia*")):
        if node.is_char_device():
            major = os.major(node.stat().st_rdev)
            names = by_major.get(major, [])
            nodes[str(node)] = {"major": major, "names": names, "allowed": any(n in allowed for n in names)}
    return {"allowed": list(allowed), "nodes": nodes, "ok": bool(nodes) and all(n["allowed"] for n in nodes.values())}


def serve(build: Path, out: Path, name: str, wrap: str = "") -> dict:
    """One smoke run through the build proof's own code; its verdicts and the residency check's."""
    bindir = build
    if wrap:  # a build dir whose bin/llama-server runs the real one inside ``wrap``
        bindir = out / f"wrap-{name}"
        (bindir / "bin").mkdir(parents=True, exist_ok=True)
        script = bindir / "bin" / "llama-server"
        script.write_text(f'#!/bin/sh\nexec unshare -m sh -c \'{wrap} exec "$0" "$@"\' {build}/bin/llama-server "$@"\n')
        script.chmod(0o755)
    log = out / "logs" / f"{name}.log"
    found: dict = {"case": name}
    processes: list = []
    real_gpu_mib = proof._gpu_mib

    def seen(pid: int):  # what the residency check reads, taken while the server runs
        processes.extend(GpuProcesses().process(sh("nvidia-smi", "--query-compute-apps=pid,process_name,"
                                                   "used_gpu_memory,gpu_uuid", "--format=csv,noheader,nounits")
                                                .splitlines()))  # fmt: skip
        found["pid"] = pid
        return real_gpu_mib(pid)

    proof._gpu_mib = seen
    try:
        result = proof.serve_once(str(bindir), str(out / "smoke.gguf"), ARGS, str(log), 120, cuda=True)
        found["served"] = {k: result[k] for k in ("tokens", "tokens_per_second", "offloaded", "gpu_mib")}
        proof.on_the_card(result, str(log))
        found["proof"] = "on the card"
    except proof.SmokeFailure as e:
        e = proof.named_gpu_failure(e)
        found["proof"] = f"refused: {e.why}"
    finally:
        proof._gpu_mib = real_gpu_mib
    text = log.read_text(errors="replace") if log.exists() else ""
    if "pid" in found:  # the wrapper execs: its PID is llama-server's
        cards = tuple(sh("nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader").split())
        found["processes"] = [p.to_json() if hasattr(p, "to_json") else str(p) for p in processes]
        found["residency"] = residency(tuple(processes), found["pid"], cards, 1, text,
                                       denied=("nvidia", "nvidiactl") if wrap else ()) or "on the card"  # fmt: skip
    found["log_lines"] = [ln for ln in text.splitlines()
                          if re.search(r"offloaded|CUDA|GPU|out of memory|alloc", ln)][-12:]  # fmt: skip
    return found


def busy(build: Path, hold: str, out: Path, keep: int) -> dict:
    holder = subprocess.Popen([hold, str(keep)], stdout=subprocess.PIPE, text=True)
    try:
        line = holder.stdout.readline().strip()
        found = serve(build, out, f"busy-keep-{keep}")
        found["holder"] = line
        return found
    finally:
        holder.kill()
        holder.wait()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", type=Path, required=True)
    ap.add_argument("--hold", required=True)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    (args.out / "logs").mkdir(parents=True, exist_ok=True)
    proof.write_smoke_gguf(str(args.out / "smoke.gguf"))
    deny = " ".join(f'mount --bind {n} {n} && mount -o remount,bind,nodev {n} &&' for n in DENY)
    result = {
        "date": datetime.date.today().isoformat(),
        "machine": sh("nvidia-smi", "--query-gpu=name,driver_version,memory.total,mig.mode.current",
                      "--format=csv,noheader").strip(),
        "device_rule": device_rule(),
        "on_the_card": serve(args.build, args.out, "card"),
        "device_denied": serve(args.build, args.out, "denied", wrap=deny),
        "busy_card": [busy(args.build, args.hold, args.out, keep) for keep in (1024, 512, 256, 128, 48)],
    }
    (args.out / "gpu-residency.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""On the GPU machine: the served unit's device rule, the residency check and the build
proof's GPU verdicts, against a real CUDA llama-server (``residency.sh build`` made it).

    python3 bench/gpu/residency.py --build DIR --hold HOLD --out OUT     (as root)

Every verdict is the product's, from what the product itself reads: the unit is the one
the server role renders (``render_unit``, its ``DeviceAllow`` lines from this machine's
``/proc/devices`` through the ``CharDevices`` fact and ``device_names``); the cause of a
refusal is worked out as the unit's health check does on a host (``wait_healthy``:
``denied_names`` of the unit's text, ``/proc/devices`` and the majors of the
``/dev/nvidia*`` nodes; ``compute_apps``; ``residency`` with the server's log).

1. The device rule: the driver's names in ``/proc/devices``, through ``device_names``,
   against the major of every ``/dev/nvidia*`` node: each node's major must be allowed.
2. On the card: llama-server (the smoke model, the unit's flags, ``-ngl 999``) with the
   card reachable: the build proof's ``on_the_card`` passes, and ``residency`` finds its
   PID on the card.
3. Device nodes unopenable: the same, with opens of the major-195 nodes failing. No
   systemd here, so it is done as a denial would be: in a private mount namespace,
   ``/dev/nvidia0`` and ``/dev/nvidiactl`` are bind-mounted onto themselves and
   remounted ``nodev`` (an open then fails with EACCES, where the cgroup rule gives
   EPERM; CUDA sees no device either way). Both checks must refuse it; each names the
   cause it can tell from its own reads:
   - ``device_denied``: the role's unit, which allows every name of the driver: what
     keeps the card away is not its rule, and ``residency`` names what the log says;
   - ``unit_denies``: a unit without the ``DeviceAllow`` lines of ``nvidia`` and
     ``nvidiactl`` (the role's unit with those two lines left out, as an override
     template without them would write it): its own rule denies the nodes, and
     ``denied_names`` reads that from the unit.
4. A busy card: ``hold`` keeps all but KEEP MiB of the card (a live server during a bump);
   the build proof's smoke run with several KEEP values: where it fits it must pass, where
   it does not the failure must be named a GPU out-of-memory.

Writes OUT/gpu-residency.json (stamped by ``bench/provenance.py``) and each server log
under OUT/logs/.
"""

from __future__ import annotations

import argparse
import datetime
import glob
import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

import provenance  # noqa: E402  (bench/provenance.py)
from roles.driver.reads import CharDevices  # noqa: E402
from roles.llamacpp.files import llamacpp_proof as proof  # noqa: E402
from roles.server.files.wait_healthy import compute_apps, denied_names, residency  # noqa: E402
from roles.server.plan import device_names, render_unit  # noqa: E402
from roles.settings import load_settings  # noqa: E402

# The unit's flags but the KV cache: f16, flash attention off (what is proven is where the
# process runs, not its kernels; the build is the one the other GPU scripts share).
ARGS = ["--cache-type-k", "f16", "--cache-type-v", "f16", "--n-gpu-layers", "999", "--flash-attn", "off",
        "--load-mode", "none"]
DENY = ("/dev/nvidia0", "/dev/nvidiactl")
UNIT_LACKS = ("nvidia", "nvidiactl")  # unit_denies: the DeviceAllow lines left out
RAN_WITH = ("bench/gpu/residency.sh", "bench/gpu/build_cuda.sh", "bench/gpu/hold.cu")


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


def unit_text(build: Path, devices_text: str, lacks: tuple = ()) -> str:
    """The unit the server role writes for this llama-server on a machine whose
    ``/proc/devices`` is ``devices_text`` (``lacks``: names whose DeviceAllow line is left out)."""
    devices = CharDevices().process(devices_text.splitlines())
    names = tuple(n for n in device_names(tuple(devices), cuda=True) if n not in lacks)
    settings = load_settings("gpu-residency", {"python_env_backend": "venv"})
    return render_unit(settings, [f"{build}/bin/llama-server", *ARGS], "gpu-residency", devices=names)


def node_majors() -> tuple:
    """The majors of the ``/dev/nvidia*`` character nodes, read as ``wait_healthy.on_its_cards`` reads them."""
    return tuple(os.major(os.stat(n).st_rdev) for n in sorted(glob.glob("/dev/nvidia*"))
                 if stat.S_ISCHR(os.stat(n).st_mode))  # fmt: skip


def verdict(processes: tuple, pid: int, cards: tuple, log: str, unit: str, devices_text: str, majors: tuple) -> dict:
    """What the unit's health check says of a llama-server (``pid``) from the product's reads:
    the unit's allowed names, those its rule denies (``denied_names``), and ``residency``."""
    denied = denied_names(unit, devices_text, majors)
    allows = [line.split("=", 1)[1].split()[0][len("char-"):] for line in unit.splitlines()
              if line.startswith("DeviceAllow=char-")]  # fmt: skip
    return {"unit_allows": allows, "unit_denies": list(denied),
            "residency": residency(processes, pid, cards, 1, log, denied) or "on the card"}  # fmt: skip


def wrapped(build: Path, out: Path, name: str, wrap: str) -> Path:
    """A build dir whose bin/llama-server runs the real one inside ``wrap`` (a mount namespace)."""
    bindir = out / f"wrap-{name}"
    (bindir / "bin").mkdir(parents=True, exist_ok=True)
    script = bindir / "bin" / "llama-server"
    script.write_text(f'#!/bin/sh\nexec unshare -m sh -c \'{wrap} exec "$0" "$@"\' {build}/bin/llama-server "$@"\n')
    script.chmod(0o755)
    return bindir


def serve(build: Path, out: Path, name: str, wrap: str = "", lacks: tuple = ()) -> dict:
    """One smoke run through the build proof's own code; its verdicts and the health check's,
    the unit rendered without the DeviceAllow lines of ``lacks``."""
    bindir = wrapped(build, out, name, wrap) if wrap else build
    log = out / "logs" / f"{name}.log"
    found: dict = {"case": name}
    processes: list = []
    real_gpu_mib = proof._gpu_mib

    def seen(pid: int):  # what the residency check reads, taken while the server runs
        processes.extend(compute_apps())
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
        found["processes"] = [p._asdict() for p in processes]
        devices = Path("/proc/devices").read_text()
        found.update(verdict(tuple(processes), found["pid"], cards, text, unit_text(build, devices, lacks), devices,
                             node_majors()))  # fmt: skip
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
        "unit_denies": serve(args.build, args.out, "unit-denies", wrap=deny, lacks=UNIT_LACKS),
        "busy_card": [busy(args.build, args.hold, args.out, keep) for keep in (1024, 512, 256, 128, 48)],
    }
    result["provenance"] = provenance.stamp(__file__, extra=RAN_WITH)
    (args.out / "gpu-residency.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

# Runs on the host (standard library only, imports nothing from llamarack; run by llamarack.remote.command).
"""Wait until a llama-server answers /health with 200, or give up; then, given the
unit's residency line, check it serves from its cards.

    python3 -c SOURCE URL UNIT SECONDS [RESIDENCY]

llama-server answers 503 while it loads. Gives up at once when the unit is
no longer active (it crashed and waits to restart), else after SECONDS.
RESIDENCY ("UUID[,UUID...] WEIGHTS_MIB", a CUDA unit's own line): the unit's
MainPID must be listed by ``nvidia-smi --query-compute-apps`` on every card,
holding at least the weights (``residency``, which the audit runs too): a
CUDA build whose device nodes are denied answers /health from the CPU.
Exit 0: healthy (and on its cards).
"""

import collections
import re
import subprocess
import sys
import time
import urllib.request
from typing import Optional

App = collections.namedtuple("App", "pid name used_mib gpu_uuid")


def main(url, unit, seconds):
    deadline = time.monotonic() + float(seconds)
    while time.monotonic() < deadline:
        # First: a unit that died is known at once, without waiting on its address
        # (one the host lacks would hold a connect for the whole timeout).
        if subprocess.run(["systemctl", "is-active", "-q", unit]).returncode != 0:
            return f"{unit} stopped before {url} answered 200 (its journal follows)"
        try:
            # Short: a loading llama-server answers 503 at once; the service is down meanwhile.
            with urllib.request.urlopen(url, timeout=min(2.0, max(0.1, deadline - time.monotonic()))) as r:
                if r.status == 200:
                    return 0
        except Exception:
            pass
        time.sleep(0.5)
    return f"no 200 from {url} within {seconds} s"


# What llama.cpp logs when it leaves the card out, by cause (its load log, verbosity 4
# for the layer count; the CUDA lines at any verbosity).
OFFLOADED = re.compile(r"offloaded (\d+)/(\d+) layers to GPU")
NO_DEVICE = re.compile(r"no CUDA-capable device is detected|no usable GPU found|failed to initialize CUDA[^\n]*")


def residency(processes: tuple, pid: int, cards: tuple, weights_mib: int, log: str = "",
              denied: tuple = ()) -> Optional[str]:  # fmt: skip
    """Why the served process ``pid`` is not where it was planned, or None when it is:
    nvidia-smi lists it on every planned card (``cards``: their UUIDs), holding at least the
    planned weights (``weights_mib``, across them), and its load log (``log``, where it
    says) offloaded every layer. ``processes``: the ``GpuProcesses`` fact; ``denied``: the
    driver's device names (``/proc/devices``) that the unit's device rule does not allow."""
    mine = [p for p in processes if p.pid == pid]
    held = sum(p.used_mib or 0 for p in mine)
    layers = OFFLOADED.findall(log)
    done, total = (int(n) for n in layers[-1]) if layers else (None, None)
    if not mine:
        if denied:
            return f"device denied: the unit does not allow {', '.join(denied)}, so llama-server serves from the CPU"
        if NO_DEVICE.search(log):
            return f"no CUDA device: llama-server is on no card ({NO_DEVICE.search(log).group(0)}); it serves from the CPU"
        if done is not None and done < total:
            return f"fewer layers offloaded than planned: {done}/{total}, and the process is on no card"
        return f"CPU fallback: nvidia-smi lists llama-server (pid {int(pid)}) on no card"
    missing = [c for c in cards if c not in {p.gpu_uuid for p in mine}]
    if missing:
        return f"llama-server is not on the planned card {', '.join(missing)}"
    if done is not None and done < total:
        return f"fewer layers offloaded than planned: {done}/{total}"
    if held < weights_mib:
        return f"llama-server holds {held} MiB on the card, less than the planned weights ({weights_mib} MiB)"
    return None


def compute_apps() -> tuple:
    """``nvidia-smi --query-compute-apps``, as the ``GpuProcesses`` fact reads it."""
    out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,process_name,used_gpu_memory,gpu_uuid",
                          "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=60).stdout
    apps = []
    for line in out.splitlines():
        f = [x.strip() for x in line.split(",")]
        if len(f) == 4 and f[0].isdigit():
            apps.append(App(int(f[0]), f[1], int(f[2]) if f[2].isdigit() else None, f[3]))
    return tuple(apps)


def on_its_cards(unit: str, spec: str):
    """None when the unit's process is on its cards (``spec``: its residency line), else why."""
    cards, weights = spec.split()
    pid = subprocess.run(["systemctl", "show", "-p", "MainPID", "--value", unit], capture_output=True,
                         text=True).stdout.strip()  # fmt: skip
    why = residency(compute_apps(), int(pid or 0), tuple(cards.split(",")), int(weights))
    return f"{unit} answers /health but does not serve from its cards: {why}" if why else None


if __name__ == "__main__":
    status = main(*sys.argv[1:4])
    if status == 0 and len(sys.argv) > 4 and sys.argv[4].strip():
        status = on_its_cards(sys.argv[2], sys.argv[4]) or 0
    sys.exit(status)

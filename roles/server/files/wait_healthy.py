# Runs on the host (standard library only, imports nothing from llamarack; run by llamarack.remote.command).
"""Wait until a llama-server answers /health with 200, or give up; then, given the
unit's residency line, check it serves from its cards.

    python3 -c SOURCE URL UNIT SECONDS [RESIDENCY]

llama-server answers 503 while it loads. Gives up at once when the unit is
no longer active (it crashed and waits to restart), else after SECONDS.
RESIDENCY ("UUID[,UUID...] WEIGHTS_MIB", a CUDA unit's own line): the unit's
MainPID must be listed by ``nvidia-smi --query-compute-apps`` on every card,
holding at least the weights (``residency``, which the audit runs too): a
CUDA build whose device nodes are denied answers /health from the CPU. A
server asleep (``--sleep-idle-seconds``: it freed the model and the cards'
memory) serves all the same: its ``/props`` says ``is_sleeping`` (asking does
not wake it), and its residency is checked once a request has woken it.
Exit 0: healthy (and on its cards, or asleep).

The unit runs it too, as its ``ExecStartPost=`` (a copy at ``<root>/libexec/unit_check.py``):
the unit then counts as started only once it answers from its cards, at boot as at a
switch; a refusal is printed after ``REFUSED`` for the audit to find in the journal.
"""

import collections
import glob
import json
import os
import re
import stat
import subprocess
import sys
import time
import urllib.request
from typing import Optional

App = collections.namedtuple("App", "pid name used_mib gpu_uuid")
# What the check prints before its refusal: the journal line the audit reads back.
REFUSED = "llamarack unit check: "


def alive(unit: str) -> bool:
    """Whether ``unit`` runs, or is starting (its ``ExecStartPost=``: this check), not waiting
    to restart after a crash (``activating``/``auto-restart``)."""
    shown = subprocess.run(["systemctl", "show", "-p", "ActiveState", "-p", "SubState", unit],
                           capture_output=True, text=True).stdout  # fmt: skip
    props = dict(line.split("=", 1) for line in shown.splitlines() if "=" in line)
    state, sub = props.get("ActiveState", ""), props.get("SubState", "")
    return state in ("active", "reloading") or (state == "activating" and not sub.startswith("auto-restart"))


def main(url, unit, seconds):
    deadline = time.monotonic() + float(seconds)
    while time.monotonic() < deadline:
        # First: a unit that died is known at once, without waiting on its address
        # (one the host lacks would hold a connect for the whole timeout).
        if not alive(unit):
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
    for line in out.split("\n"):
        raw = line.split(",")  # the name, between the pid and the memory, may hold commas
        f = [x.strip() for x in raw]
        if len(f) >= 4 and f[0].isdigit():
            apps.append(App(int(f[0]), ",".join(raw[1:-2]).strip(), int(f[-2]) if f[-2].isdigit() else None, f[-1]))
    return tuple(apps)


def denied_names(unit_text: str, devices_text: str, majors: tuple) -> tuple:
    """The names (``/proc/devices``) of the driver's device majors (``majors``: those of the
    ``/dev/nvidia*`` nodes) that the unit's ``DeviceAllow=char-NAME`` lines allow under none
    of their names: what its device rule keeps llama-server from. () without such lines."""
    allowed = {line.split("=", 1)[1].split()[0][len("char-"):] for line in unit_text.split("\n")
               if line.startswith("DeviceAllow=char-")}  # fmt: skip
    names: dict = {}
    characters = False
    for line in devices_text.splitlines():
        fields = line.split()
        if line.strip().endswith("devices:"):
            characters = line.strip() == "Character devices:"
        elif characters and len(fields) == 2 and fields[0].isdigit():
            names.setdefault(int(fields[0]), []).append(fields[1])
    if not allowed:
        return ()
    kept = [names.get(m, []) for m in dict.fromkeys(majors)]
    return tuple(dict.fromkeys(n for group in kept if not allowed & set(group) for n in group))


def _read(path: str) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def asleep(health_url: str, unit_text: str) -> bool:
    """Whether the server whose /health is ``health_url`` is asleep, as its /props says (with the
    key its ExecStart's ``--api-key-file`` names, where it names one)."""
    found = re.search(r"^ExecStart=.*?--api-key-file\s+\"?([^\s\"]+)", unit_text, re.M)
    token = _read(found.group(1)).split("\n", 1)[0].strip() if found else ""
    request = urllib.request.Request(health_url.rsplit("/", 1)[0] + "/props",
                                     headers={"Authorization": f"Bearer {token}"} if token else {})  # fmt: skip
    try:
        with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(request, timeout=5) as r:
            return json.loads(r.read()).get("is_sleeping") is True
    except Exception:
        return False


def on_its_cards(unit: str, spec: str, url: str = ""):
    """None when the unit's process is on its cards (``spec``: its residency line), or asleep
    (``url``: its /health), else why: from nvidia-smi's compute apps, this start's journal and
    the unit's device rule."""
    cards, weights = spec.split()
    shown = subprocess.run(["systemctl", "show", "-p", "MainPID", "-p", "InvocationID", "-p", "FragmentPath", unit],
                           capture_output=True, text=True).stdout  # fmt: skip
    props = dict(line.split("=", 1) for line in shown.splitlines() if "=" in line)
    invocation = props.get("InvocationID", "")
    log = subprocess.run(["journalctl", f"_SYSTEMD_INVOCATION_ID={invocation}", "-o", "cat", "-q", "--no-pager"],
                         capture_output=True, text=True).stdout if invocation else ""  # fmt: skip
    majors = tuple(os.major(os.stat(n).st_rdev) for n in sorted(glob.glob("/dev/nvidia*"))
                   if stat.S_ISCHR(os.stat(n).st_mode))  # fmt: skip
    denied = denied_names(_read(props.get("FragmentPath", "")), _read("/proc/devices"), majors)
    why = residency(compute_apps(), int(props.get("MainPID") or 0), tuple(cards.split(",")), int(weights), log, denied)
    if why and url and asleep(url, _read(props.get("FragmentPath", ""))):
        print(f"{unit} is asleep (--sleep-idle-seconds): its residency is checked once it wakes")
        return None
    return f"{unit} answers /health but does not serve from its cards: {why}" if why else None


if __name__ == "__main__":
    status = main(*sys.argv[1:4])
    if status == 0 and len(sys.argv) > 4 and sys.argv[4].strip():
        status = on_its_cards(sys.argv[2], sys.argv[4], sys.argv[1]) or 0
    if status != 0:
        print(REFUSED + str(status), file=sys.stderr, flush=True)
        sys.exit(1)

#!/usr/bin/env python3
"""Rolling changes through the lab rack behind its gateway, under a steady load.

    python3 bench/rollout_bench.py     (as root; the lab rack up with its gateway, converged)

A bounded load (``bench/loadgen.py``: ``/completion`` through the gateway,
``lab-gw:8000``, CONCURRENCY at a time) runs during each case, and stops when
the case ends. Recorded per case: the load's sent, ok, failed, p50 and p99; the
rollout's exit status, each host's final state and how many times it was
deployed; each host's llama-server (MainPID, NRestarts) before and after.

- baseline: the load alone, the rack quiet;
- bump: ``llamarack rollout inventory/lab.py --data llamacpp_commit=BUMP``, a
  later llama.cpp commit of the lab's mirror (``mirror.GOOD_BUMP``), canary first;
- converged: the same rollout again: nothing to change, no server restarted;
- canary_fails: a rollout back to the base commit through
  ``bench/deploys/fails_gate.py``, which stops the canary's llama-server after the
  deploy: the rollout stops there, the canary drained, the rest untouched;
- revert: a fresh rollout back to the base commit (the drained canary included);
- driver_upgrade: ``llamarack rollout inventory/lab.py roles.driver.upgrade.driver_upgrade
  --data nvidia_driver_version=UPGRADE``: each host unheld, its driver upgraded within
  the branch from the lab's apt repository, rebooted, gated;
- driver_hold: the project's deploy rolled after it (the driver held again, nothing restarted);
- plain_pyinfra: the same bump with ``pyinfra -y inventory/lab.py deploy.py``, no
  gateway drain: its failed requests are what the rollout is measured against.

The rack is left on the base commit and the default driver (loaded, then a plain deploy
without load at the end).
Wall times are figures, not bounds: the lab's hosts share this machine's cores.
Writes bench/results/rollout.json, with a summary: each case's failed requests and its
p50 and p99 against the baseline's. ``--baseline-only`` measures the quiet baseline
again into an existing result (its own time noted) and leaves the cases as they are.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "lab")]

from llamarack_lab import driver, mirror, services  # noqa: E402
from llamarack_lab.fake_nvidia import deb  # noqa: E402
from llamarack_lab import rack as rackmod  # noqa: E402
from llamarack_lab.pytest_plugin import parse_pyinfra_totals, pyinfra_command  # noqa: E402

from converged_bench import _cpu, _pyinfra_version  # noqa: E402  (this folder's)
from loadgen import Load  # noqa: E402

INVENTORY = ROOT / "inventory/lab.py"
JOURNAL = ROOT / ".llamarack/rollout-lab.json"
RESULT = ROOT / "bench/results/rollout.json"
GATEWAY, GATEWAY_PORT = "lab-gw", 8000
CONCURRENCY, N_PREDICT = 4, 8
BASELINE_REQUESTS = 5000  # a few seconds of load: enough that the first (cold) requests do not set the p99
CASE_LIMIT_S = 5400  # the load's own bound for one case
SERVER = "systemctl show -p MainPID -p NRestarts --value llamarack-server.service | tr '\\n' ' '"
DRIVER = "nvidia-smi --query-gpu=driver_version --format=csv,noheader | sort -u"
DRIVER_UPGRADE = "roles.driver.upgrade.driver_upgrade"  # shipped with llamarack


def servers(rack, names: list) -> dict:
    return {n: subprocess.run(rack.ssh_command(n, SERVER), capture_output=True, text=True, timeout=60).stdout.strip()
            for n in names}  # fmt: skip


def under_load(url: str, action, requests: int = 10**6) -> dict:
    """``action()``'s record, with the load that ran while it did (stopped when it returns)."""
    load = Load(url, requests=requests, concurrency=CONCURRENCY, time_limit=CASE_LIMIT_S, n_predict=N_PREDICT)
    load.start()
    started = time.monotonic()
    try:
        outcome = action() if action else {}  # without an action, the load runs its count out
    finally:
        if action:
            load.stop.set()
    record = load.wait()
    return {**outcome, "seconds": round(time.monotonic() - started, 1), "load": record}


# The lab's hosts share this machine's two cores with each other and with the load: a
# llama-bench run of the tiny model during a rollout measures that contention, not the
# build (tg128 fell to 6% of its quiet record in a run here), so the lab's gate takes no
# bench figure (--bench-fraction 1); the gate's arithmetic is tested in tests/unit/test_rollout.py.
LAB_GATE = ("--bench-fraction", "1")


def rollout(*args: str, env: dict | None = None) -> dict:
    """A fresh ``llamarack rollout`` of the lab inventory: its exit status, each host's final
    state and deploy count (its "deploying" lines), its last lines."""
    JOURNAL.unlink(missing_ok=True)
    r = subprocess.run([sys.executable, "-m", "llamarack", "rollout", str(INVENTORY), *LAB_GATE, *args],
                       cwd=ROOT,
                       env=dict(os.environ, **(env or {})), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=CASE_LIMIT_S)  # fmt: skip
    hosts = json.loads(JOURNAL.read_text())["hosts"] if JOURNAL.exists() else {}
    deployed = {h: len(re.findall(rf"^\S+ {re.escape(h)}: deploying$", r.stdout, re.M)) for h in hosts}
    totals = [int(v) if v != "-" else 0 for v in re.findall(r"^\s*Grand total\s+\S+\s+(\S+)", r.stdout, re.M)]
    return {"returncode": r.returncode, "states": {h: v["state"] for h, v in hosts.items()},
            "why": {h: v["why"] for h, v in hosts.items() if v["state"] == "failed"},
            "deploys": deployed, "changed_operations": sum(totals), "tail": r.stdout.splitlines()[-12:]}


def plain_deploy(*data: str) -> dict:
    args = [w for item in data for w in ("--data", item)]
    r = subprocess.run([*pyinfra_command(), "-y", str(INVENTORY), str(ROOT / "deploy.py"), *args], cwd=ROOT,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=CASE_LIMIT_S)  # fmt: skip
    if r.returncode != 0:
        raise SystemExit(f"plain deploy failed (rc {r.returncode}):\n{r.stdout[-4000:]}")
    return {"returncode": r.returncode, "changed_operations": parse_pyinfra_totals(r.stdout)["success"]}


def drivers(rack, names: list) -> dict:
    return {n: subprocess.run(rack.ssh_command(n, DRIVER), capture_output=True, text=True, timeout=60).stdout.strip()
            for n in names}  # fmt: skip


def case(rack, serving: list, url: str, action) -> dict:
    before, driver_before = servers(rack, serving), drivers(rack, serving)
    record = under_load(url, action)
    after, driver_after = servers(rack, serving), drivers(rack, serving)
    record["restarted"] = sorted(h for h in serving if before[h] != after[h])
    record["driver"] = {h: [driver_before[h], driver_after[h]] for h in serving}
    return record


def driver_cases(rack, serving: list, url: str) -> dict:
    """The driver upgrade with reboot rolled, then the project's deploy rolled after it."""
    upgrade = ("--data", f"nvidia_driver_version={deb.UPGRADE_VERSION}-1")
    return {"driver_upgrade": case(rack, serving, url, lambda: rollout(str(DRIVER_UPGRADE), *upgrade)),
            "driver_hold": case(rack, serving, url, lambda: rollout())}


def summary(result: dict) -> dict:
    """Each case's failed requests, p50 and p99 (s), and those against the quiet baseline's."""
    base = result["baseline"]["load"]
    out = {}
    for name, v in result.items():
        if isinstance(v, dict) and "load" in v:
            load = v["load"]
            out[name] = {"sent": load["sent"], "failed": load["failed"], "p50_s": load["p50_s"], "p99_s": load["p99_s"]}
            if name != "baseline" and base["p50_s"] and load["p50_s"]:
                out[name].update(p50_x=round(load["p50_s"] / base["p50_s"], 2), p99_x=round(load["p99_s"] / base["p99_s"], 2))
    return out


def baseline_only(url: str) -> int:
    result = json.loads(RESULT.read_text())
    result["baseline"] = under_load(url, None, requests=BASELINE_REQUESTS)
    result["baseline"]["when"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    result["summary"] = summary(result)
    RESULT.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result["summary"], indent=1))
    return 0


def main(argv: list) -> int:
    rack = rackmod.load()
    if rack is None or not rackmod.healthy(rack):
        raise SystemExit("no healthy lab rack is up: llamarack lab up, then deploy it until it converges")
    url = f"http://{rack.host(GATEWAY)['ip']}:{GATEWAY_PORT}"
    if argv == ["--baseline-only"]:
        return baseline_only(url)
    serving = [h.name for h in rack.hosts if h.name != GATEWAY]
    bump = mirror.add_named_commit(services.prepare(), "lab-bench-bump", "lab bench: a later llama.cpp",
                                   mirror.GOOD_BUMP)  # fmt: skip
    canary = serving[0]
    result = {
        "benchmark": "rollout",
        "when": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": {"cpu": _cpu(), "cores": os.cpu_count(), "pyinfra": _pyinfra_version(),
                    "serving_hosts": len(serving), "gateway": GATEWAY},
        "load": {"url": url, "api": "/completion", "concurrency": CONCURRENCY, "n_predict": N_PREDICT},
        "bump": bump,
        "baseline": under_load(url, None, requests=BASELINE_REQUESTS),
    }
    result["bump_rollout"] = case(rack, serving, url, lambda: rollout("--data", f"llamacpp_commit={bump}"))
    result["converged_rollout"] = case(rack, serving, url, lambda: rollout("--data", f"llamacpp_commit={bump}"))
    result["canary_fails"] = case(rack, serving, url, lambda: rollout(
        str(ROOT / "bench/deploys/fails_gate.py"), "--canary", canary, env={"LLAMARACK_BENCH_FAIL_GATE": canary}))
    result["revert_rollout"] = case(rack, serving, url, lambda: rollout("--canary", canary))
    result.update(driver_cases(rack, serving, url))
    result["plain_pyinfra"] = case(rack, serving, url, lambda: plain_deploy(f"llamacpp_commit={bump}"))
    for h in serving:
        driver.set_driver(rack, h, deb.DEFAULT_VERSION, "ok")
    result["restore"] = plain_deploy()
    JOURNAL.unlink(missing_ok=True)
    result["summary"] = summary(result)
    RESULT.write_text(json.dumps(result, indent=1) + "\n")
    failed = {k: v["load"]["failed"] for k, v in result.items() if isinstance(v, dict) and "load" in v}
    print(f"{RESULT}: failed requests per case: {failed}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

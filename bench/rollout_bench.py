#!/usr/bin/env python3
"""Rolling changes through the lab rack behind its gateway, under a steady paced load.

    python3 bench/rollout_bench.py [--three-way-only | --baseline-only | --table]
        (as root; the lab rack up with its gateway, converged)

The load (``bench/loadgen.py``, through the gateway ``lab-gw:8000``): CONCURRENCY clients,
each starting a ``/completion`` of N_PREDICT tokens at most every PACE_S seconds (a closed
loop's millisecond 503s would multiply an outage's failures), STREAM_SHARE of them streamed
(SSE), every answer's body checked. It starts LEAD_S before each case's action and goes on
SETTLE_S after the action returns: the gateway puts a restarted server back only after two
checks 2 s apart, and the requests that fail meanwhile count too.

- baseline: the load alone for BASELINE_S, the rack quiet;
- three_way: the same unit change (THREE_WAY_CHANGE, a context size: every serving host's
  llama-server restarts, nothing is built) made three ways, the rack put back on its own
  settings by a plain deploy without load before each: ``llamarack rollout`` as a new user
  runs it (the default gate), ``pyinfra --serial`` (pyinfra's own flag: each operation on one
  host after the other, no drain) and plain ``pyinfra`` (every host at once);
- bump_rollout: ``llamarack rollout inventory/lab.py --data llamacpp_commit=BUMP``, a later
  llama.cpp commit of the lab's mirror (``mirror.GOOD_BUMP``), canary first;
- converged_rollout: the same rollout again: nothing to change, no server restarted;
- canary_fails: a rollout back to the base commit through ``bench/deploys/fails_gate.py``,
  which stops the canary's llama-server after the deploy: the rollout stops there, the
  canary drained, the rest untouched;
- revert_rollout: a fresh rollout back to the base commit (the drained canary included);
- driver_upgrade: ``llamarack rollout inventory/lab.py roles.driver.upgrade.driver_upgrade --data
  nvidia_driver_version=UPGRADE``: each host unheld, its driver upgraded within the branch
  from the lab's apt repository, rebooted, gated;
- driver_hold: the project's deploy rolled after it (the driver held again, nothing restarted).

Every rollout runs with the default gate but the two that measure a new build (bump_rollout,
revert_rollout), which pass LAB_GATE (why: its comment, and docs/rollout.md); theirs record
the figures their gate compared and what the default gate would have said (``bench_gate``).

Per case: the load's summary (sent, failed, seconds with a failure, failures by reason, p50,
p99, the streams' first token) and every request's record (``requests``, each
``loadgen.COMPACT_FIELDS``); the action's window on the load's clock (``action_s``), its
exit status, each host's state and deploys (a rollout), how many of its stage's hosts received
their build and model from the one that made it, its changed operations; each
host's llama-server (MainPID, NRestarts) and driver before and after. The rack is left on
the base commit and the default driver (loaded, then a plain deploy without load).

Writes bench/results/rollout.json, stamped by ``bench/provenance.py`` (the commit, whether
the tree was clean, this script's and the load generator's sha256, the command, the
machine), with a summary per case (against the baseline's latencies). Wall times are
figures, not bounds: the lab's hosts share this machine's cores. ``--three-way-only``: the
baseline and three_way alone (a few minutes). ``--baseline-only``: the quiet baseline
again, into a result this commit and these scripts wrote (else refused: one result, one
version of its script). ``--table``: the result as docs/benchmarks.md's table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "lab"), str(ROOT / "bench")]

from llamarack_lab import driver, mirror, services  # noqa: E402
from llamarack_lab.fake_nvidia import deb  # noqa: E402
from llamarack_lab import rack as rackmod  # noqa: E402
from llamarack_lab.pytest_plugin import parse_pyinfra_totals, pyinfra_command  # noqa: E402

import provenance  # noqa: E402  (this folder's)
from converged_bench import _cpu, _pyinfra_version  # noqa: E402
from loadgen import COMPACT_FIELDS, Load  # noqa: E402
from rollout_report import LABELS, WAYS, cases, summary, table  # noqa: E402, F401 (the result's summary and table)

INVENTORY = ROOT / "inventory/lab.py"
DEPLOY = ROOT / "deploy.py"
JOURNAL = ROOT / ".llamarack/rollout-lab.json"
RESULT = ROOT / "bench/results/rollout.json"
GATEWAY, GATEWAY_PORT = "lab-gw", 8000
# 4 clients, a request each at most every 0.25 s: at most 16 a second, which the lab's two
# shared cores answer without queueing (a tiny-model completion takes milliseconds).
CONCURRENCY, PACE_S, STREAM_SHARE, N_PREDICT = 4, 0.25, 0.25, 16
LEAD_S, SETTLE_S = 3.0, 10.0  # the load before each action, and after it returns
BASELINE_S = 60.0
CASE_LIMIT_S = 5400  # the load's own bound for one case
# The three-way comparison's change: the unit's command line alone (every llama-server
# restarts with it; nothing is built or measured); a plain deploy without it puts it back.
THREE_WAY_CHANGE = "server_ctx_size=1024"
SERVER = "systemctl show -p MainPID -p NRestarts --value llamarack-server.service | tr '\\n' ' '"
DRIVER = "nvidia-smi --query-gpu=driver_version --format=csv,noheader | sort -u"
DRIVER_UPGRADE = "roles.driver.upgrade.driver_upgrade"  # shipped with llamarack
# The gate's llama-bench comparison: the product's default fraction (roles.rollout.Options;
# not imported here: pyinfra's CLI package patches threading for gevent, and the load's
# clients are threads). tests/unit/test_rollout_bench.py holds the two equal.
DEFAULT_BENCH_FRACTION = 0.25

# The gate compares llama-bench's figures after a new build with the host's record before
# it. On a real rack both are the build's: measured on the host's own cards while it is
# drained (and, with server_bench = "stopped", its units stopped). In the lab the five hosts
# share this machine's two cores: the drained host's llama-bench runs beside the three hosts
# that answer the load, HAProxy, the load's clients and pyinfra, and the record before it
# was made at another moment under another load (a plain deploy measures all four hosts at
# once). The ratio is those two moments' contention: in one run here the bump's tg128 was
# 117 t/s against 2,549 before, and the bump (mirror.GOOD_BUMP) changes only a README, not
# one line of code. So the lab's rollouts of a new build take no bench figure
# (--bench-fraction 1) and record what the default gate would have said (``bench_gate``);
# every other lab rollout runs with the default gate.
LAB_GATE = ("--bench-fraction", "1")


def servers(rack, names: list) -> dict:
    return {n: subprocess.run(rack.ssh_command(n, SERVER), capture_output=True, text=True, timeout=60).stdout.strip()
            for n in names}  # fmt: skip


def drivers(rack, names: list) -> dict:
    return {n: subprocess.run(rack.ssh_command(n, DRIVER), capture_output=True, text=True, timeout=60).stdout.strip()
            for n in names}  # fmt: skip


def under_load(url: str, action=None, seconds: float = 0.0) -> dict:
    """``action()``'s record, with the load that ran from LEAD_S before it to SETTLE_S after
    it returned: its summary and every request's record. Without an action, the load alone
    for ``seconds``."""
    load = Load(url, requests=10**7, concurrency=CONCURRENCY, time_limit=seconds or CASE_LIMIT_S,
                n_predict=N_PREDICT, pace=PACE_S, stream_share=STREAM_SHARE)  # fmt: skip
    load.start()
    outcome, window = {}, {}
    try:
        if action:
            load.stop.wait(LEAD_S)
            began = load.since_start()
            outcome = action()
            ended = load.since_start()
            window = {"seconds": round(ended - began, 1), "action_s": [round(began, 1), round(ended, 1)]}
            load.stop.wait(SETTLE_S)
    finally:
        if action:
            load.stop.set()
    summary = load.wait()
    return {**outcome, **window, "load": summary, "requests": [r.compact() for r in sorted(load.records,
                                                                                        key=lambda r: r.index)]}


def gated_notes(output: str) -> dict:
    """{host: what its gate checked} from a rollout's output (its "gated (...)" lines)."""
    return dict(re.findall(r"^\S+ (\S+): gated \((.*)\)$", output, re.M))


def bench_gate(notes: dict, fraction: float = DEFAULT_BENCH_FRACTION) -> dict:
    """{host: [each figure the gate compared, with what a gate of ``fraction`` says of it]}
    from the gate's notes (``roles.rollout.bench_verdict``'s "TEST NEW t/s (was OLD)")."""
    out = {}
    for host, said in notes.items():
        figures = []
        for unit, test, new, old in re.findall(r"(?:([^,;]+?): )?(pp512|tg128) (\S+) t/s \(was ([0-9.]+)\)", said):
            value = None if new == "None" else float(new)
            figures.append({"unit": unit.strip() or None, "test": test, "tokens_per_second": value,
                            "before": float(old), "ratio": round(value / float(old), 3) if value else None,
                            "default_gate": "passes" if value and value >= (1 - fraction) * float(old)
                            else "refuses"})  # fmt: skip
        if figures:
            out[host] = figures
    return out


def rollout(*args: str, env: dict | None = None, gate: tuple = ()) -> dict:
    """A fresh ``llamarack rollout`` of the lab inventory (``gate``: its gate's options; none:
    the default gate): its exit status, each host's final state and deploy count (its
    "deploying" lines), what each gate checked, its last lines."""
    JOURNAL.unlink(missing_ok=True)
    argv = [sys.executable, "-m", "llamarack", "rollout", str(INVENTORY), *gate, *args]
    r = subprocess.run(argv, cwd=ROOT, env=dict(os.environ, **(env or {})), stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=CASE_LIMIT_S)  # fmt: skip
    hosts = json.loads(JOURNAL.read_text())["hosts"] if JOURNAL.exists() else {}
    deployed = {h: len(re.findall(rf"^\S+ {re.escape(h)}: deploying$", r.stdout, re.M)) for h in hosts}
    totals = [int(v) if v != "-" else 0 for v in re.findall(r"^\s*Grand total\s+\S+\s+(\S+)", r.stdout, re.M)]
    notes = gated_notes(r.stdout)
    stage = [line for line in r.stdout.splitlines() if "(stage) | " in line]
    return {"command": shlex.join(["llamarack", *argv[3:]]).replace(str(ROOT) + "/", ""),
            "returncode": r.returncode, "states": {h: v["state"] for h, v in hosts.items()},
            # the stage (every host, none drained), then each host's seconds from drained to done
            "staged": {h: bool(v.get("staged")) for h, v in hosts.items()},
            "drained_s": {h: v.get("drained_s") for h, v in hosts.items()},
            # the stage's hosts that received a build or a model another made ("... not compiling it")
            "stage_received": {"builds": sum("not compiling it" in line for line in stage),
                               "models": sum("not making it" in line for line in stage)},
            "why": {h: v["why"] for h, v in hosts.items() if v["state"] == "failed"},
            "deploys": deployed, "changed_operations": sum(totals), "gated": notes,
            **({"bench_gate": bench_gate(notes)} if gate else {}), "tail": r.stdout.splitlines()[-12:]}  # fmt: skip


def pyinfra_deploy(flags: tuple = (), data: tuple = (), must: bool = False) -> dict:
    """``pyinfra -y [FLAGS] inventory/lab.py deploy.py [--data ...]``: its exit status and
    changed operations (``must``: a failure stops the bench; the rack's state is unknown)."""
    argv = [*pyinfra_command(), "-y", *flags, str(INVENTORY), str(DEPLOY), *[w for d in data for w in ("--data", d)]]
    started = time.monotonic()
    r = subprocess.run(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=CASE_LIMIT_S)  # fmt: skip
    if r.returncode != 0 and must:
        raise SystemExit(f"plain deploy failed (rc {r.returncode}):\n{r.stdout[-4000:]}")
    try:
        changed = parse_pyinfra_totals(r.stdout)["success"]
    except AssertionError:  # no totals: it stopped before its operations
        changed = None
    return {"command": shlex.join(["pyinfra", *argv[len(pyinfra_command()):]]).replace(str(ROOT) + "/", ""),
            "returncode": r.returncode, "changed_operations": changed, "wall_s": round(time.monotonic() - started, 1),
            **({"tail": r.stdout.splitlines()[-12:]} if r.returncode else {})}  # fmt: skip


def case(rack, serving: list, url: str, action) -> dict:
    before, driver_before = servers(rack, serving), drivers(rack, serving)
    record = under_load(url, action)
    after, driver_after = servers(rack, serving), drivers(rack, serving)
    record["restarted"] = sorted(h for h in serving if before[h] != after[h])
    record["driver"] = {h: [driver_before[h], driver_after[h]] for h in serving}
    return record


def three_way(rack, serving: list, url: str) -> dict:
    """THREE_WAY_CHANGE made three ways under the same load, the rack put back on its own
    settings (a plain deploy without load) before each."""
    data = (THREE_WAY_CHANGE,)
    ways = {"rollout": lambda: rollout("--data", THREE_WAY_CHANGE),
            "serial": lambda: pyinfra_deploy(("--serial",), data),
            "parallel": lambda: pyinfra_deploy((), data)}  # fmt: skip
    out = {"change": THREE_WAY_CHANGE}
    for way in WAYS:
        restore = pyinfra_deploy(must=True)
        out[way] = case(rack, serving, url, ways[way])
        out[way]["put_back_before"] = restore
        out[way]["every_host_restarted"] = out[way]["restarted"] == sorted(serving)
    out["put_back"] = pyinfra_deploy(must=True)
    return out


def driver_cases(rack, serving: list, url: str) -> dict:
    """The driver upgrade with reboot rolled, then the project's deploy rolled after it."""
    upgrade = ("--data", f"nvidia_driver_version={deb.UPGRADE_VERSION}-1")
    return {"driver_upgrade": case(rack, serving, url, lambda: rollout(str(DRIVER_UPGRADE), *upgrade)),
            "driver_hold": case(rack, serving, url, lambda: rollout())}


def rollout_cases(rack, serving: list, url: str) -> dict:
    """The llama.cpp bump rolled, converged, stopped by its canary, reverted; the driver cases."""
    bump = mirror.add_named_commit(services.prepare(), "lab-bench-bump", "lab bench: a later llama.cpp",
                                   mirror.GOOD_BUMP)  # fmt: skip
    canary, to_bump = serving[0], ("--data", f"llamacpp_commit={bump}")
    fails = {"env": {"LLAMARACK_BENCH_FAIL_GATE": canary}}
    out = {"bump": bump}
    out["bump_rollout"] = case(rack, serving, url, lambda: rollout(*to_bump, gate=LAB_GATE))
    out["converged_rollout"] = case(rack, serving, url, lambda: rollout(*to_bump))
    out["canary_fails"] = case(rack, serving, url, lambda: rollout(
        str(ROOT / "bench/deploys/fails_gate.py"), "--canary", canary, **fails))
    out["revert_rollout"] = case(rack, serving, url, lambda: rollout("--canary", canary, gate=LAB_GATE))
    out.update(driver_cases(rack, serving, url))
    for h in serving:
        driver.set_driver(rack, h, deb.DEFAULT_VERSION, "ok")
    out["restore"] = pyinfra_deploy(must=True)
    return out


def dumps(value, depth: int = 0) -> str:
    """JSON, indent 1, each list of plain values on one line: a request's record is one line,
    not seven."""
    inner = " " * (depth + 1)
    if isinstance(value, dict) and value:
        body = ",\n".join(f"{inner}{json.dumps(str(k))}: {dumps(v, depth + 1)}" for k, v in value.items())
        return "{\n" + body + "\n" + " " * depth + "}"
    if isinstance(value, list) and any(isinstance(v, (dict, list)) for v in value):
        return "[\n" + ",\n".join(inner + dumps(v, depth + 1) for v in value) + "\n" + " " * depth + "]"
    return json.dumps(value)


def header(url: str, serving: list) -> dict:
    """The result's first keys: what ran (filled in by ``write``), where, and the load's shape."""
    return {
        "benchmark": "rollout",
        "provenance": None,
        "machine": {"cpu": _cpu(), "cores": os.cpu_count(), "load_average": [round(x, 2) for x in os.getloadavg()],
                    "python": platform.python_version(), "pyinfra": _pyinfra_version(),
                    "serving_hosts": len(serving), "gateway": GATEWAY},
        "load": {"url": url, "api": "/completion", "concurrency": CONCURRENCY, "pace_s": PACE_S,
                 "stream_share": STREAM_SHARE, "n_predict": N_PREDICT, "lead_s": LEAD_S, "settle_s": SETTLE_S,
                 "requests_fields": list(COMPACT_FIELDS)},
    }  # fmt: skip


def same_version(result: dict, argv: list) -> None:
    """Refuses to add to a result that another commit or version of this script wrote: one
    result, one version of what measured it."""
    was, now = result.get("provenance") or {}, provenance.stamp(__file__, argv=argv)
    if (was.get("commit"), was.get("scripts")) != (now["commit"], now["scripts"]):
        raise SystemExit(f"{RESULT.name} was written at commit {str(was.get('commit'))[:10]} by other scripts than "
                         "these: run the whole bench, not --baseline-only")  # fmt: skip


def write(result: dict, argv: list, adding: bool = False) -> None:
    """The result with its stamp (``adding``: a part measured again, the earlier run's stamp kept in ``runs``)."""
    stamp = provenance.stamp(__file__, argv=argv)
    result["provenance"] = provenance.joined(result.get("provenance"), stamp) if adding else stamp
    result["summary"] = summary(result)
    RESULT.write_text(dumps(result) + "\n")
    print(json.dumps({k: {"sent": v["sent"], "failed": v["failed"], "seconds_with_failure": v["seconds_with_failure"]}
                      for k, v in result["summary"].items()}, indent=1))  # fmt: skip


def parse(argv: list) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    which = p.add_mutually_exclusive_group()
    which.add_argument("--three-way-only", action="store_true", help="the baseline and the three-way comparison alone")
    which.add_argument("--baseline-only", action="store_true", help="the quiet baseline again, into the result")
    which.add_argument("--table", action="store_true", help="print the result as docs/benchmarks.md's table")
    return p.parse_args(argv)


def main(argv: list) -> int:
    args = parse(argv)
    if args.table:
        print(table(json.loads(RESULT.read_text())), end="")
        return 0
    rack = rackmod.load()
    if rack is None or not rackmod.healthy(rack):
        raise SystemExit("no healthy lab rack is up: llamarack lab up, then deploy it until it converges")
    url = f"http://{rack.host(GATEWAY)['ip']}:{GATEWAY_PORT}"
    serving = [h.name for h in rack.hosts if h.name != GATEWAY]
    if args.baseline_only:
        result = json.loads(RESULT.read_text())
        same_version(result, argv)
        result["baseline"] = {**under_load(url, seconds=BASELINE_S), "when": provenance.now()}
        write(result, argv, adding=True)
        return 0
    result = {**header(url, serving), "baseline": under_load(url, seconds=BASELINE_S)}
    result["three_way"] = three_way(rack, serving, url)
    if not args.three_way_only:
        result.update(rollout_cases(rack, serving, url))
    JOURNAL.unlink(missing_ok=True)
    write(result, argv)
    print(f"{RESULT}; python3 bench/rollout_bench.py --table prints its table")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

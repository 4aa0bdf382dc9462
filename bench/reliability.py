#!/usr/bin/env python3
"""Fault injection on the lab rack: does a failed deploy lose anything?

    flock /tmp/llamarack-lab.lock python3 bench/reliability.py [--only FAULT ...] [--reuse] [--list]

Brings the default rack up once (``--reuse``: the rack that is up, left up),
deploys lab-v100-a and lab-v100-b until they serve the tiny model, then for
each fault, on a converged host:

1. takes a snapshot of the deployment (``llamarack_lab.faults.snapshot``);
2. starts a poller on the served ``/health`` (4 a second, each bounded to 2 s,
   the lab host's address only), starts a deploy that has new work to do (a
   setting changed: the model converted to f32, a llama.cpp commit, the
   listen address...) and injects the fault into it;
3. checks: the old deployment answered throughout (poller) and still serves
   after the run (``/health`` and a ``/completion``); no file outside the
   staging areas changed (``faults.changed_outside_staging``);
4. re-runs without the fault: it must succeed, and the run after it must
   change nothing; then goes back to the lab's settings for the next fault.

Before each model fault every model artifact but the served one is removed,
so the change always has its whole work to do. Writes
bench/results/reliability.json (every fault's figures, the machine noted).
``survived`` is all three; ``nothing_lost`` all but the poller's (a fault
whose run restarts the server by design, a unit switch or a reboot, is
marked ``restarts``: its outage is measured). The poller goes on for
SETTLE_S after the failed run: what a dropped run left going on the host
(a unit switch, a convert) ends meanwhile.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shlex
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from llamarack_lab import driver as drivermod  # noqa: E402
from llamarack_lab import faults, mirror, services  # noqa: E402
from llamarack_lab import host as hostmod  # noqa: E402
from llamarack_lab import rack as rackmod  # noqa: E402
from llamarack_lab.fake_nvidia import deb  # noqa: E402
from llamarack_lab.hub_server import HubServer  # noqa: E402
from llamarack.layout import UNIT_PATH  # noqa: E402

INVENTORY = ROOT / "inventory/lab.py"
DEPLOY = ROOT / "deploy.py"
A, B = "lab-v100-a", "lab-v100-b"
NEW_MODEL = ["model_convert_outtype=f32"]  # a new artifact, the same build
OUT = ROOT / "bench/results/reliability.json"
LOGS = Path("/tmp/llamarack-reliability")
SETTLE_S = 10.0
# The lines of a deploy's output worth keeping in the results: what failed, and pyinfra's total;
# not pyinfra's closing words nor make's recipe lines.
TELLING = re.compile(r"error|fail|killed|refus|rolled back|mismatch|not enough|grand total", re.I)
CLOSING = re.compile(r"Error: executed \d+ commands|No hosts remaining|Disconnecting from hosts|\*\*\* \[")


@dataclass
class Ctx:
    rack: rackmod.Rack
    deploy: Optional[faults.Deploy] = None
    notes: list = field(default_factory=list)
    hub: Optional[HubServer] = None


@dataclass
class Fault:
    name: str
    what: str
    data: list  # the failed run's --data
    rerun: list  # the re-run's --data (the fault gone)
    victim: str = A
    hosts: tuple = (A,)
    setup: Optional[Callable] = None  # before the run (the snapshot is taken before it)
    inject: Optional[Callable] = None  # in a thread, while the run goes
    cleanup: Optional[Callable] = None  # after the failed run
    restarts: bool = False  # the failed run restarts the server by design
    may_change: tuple = ()  # paths outside staging the fault's own step may change
    expect_fail: bool = True


# --- injections -------------------------------------------------------------------


def at_convert_then(action):
    def inject(ctx: Ctx, f: Fault):
        if faults.wait_on_host(ctx.rack, f.victim, faults.staged("convert"), timeout=900):
            action(ctx, f)
        else:
            ctx.notes.append("the convert step never started")
    return inject


def cut_ssh(ctx, f):
    time.sleep(1.0)  # inside the converter's run
    faults.cut_ssh(ctx.rack, f.victim)


def reboot(ctx, f):
    time.sleep(1.0)
    ctx.rack.ssh(f.victim, "systemctl reboot", timeout=30)
    ip, deadline = ctx.rack.host(f.victim)["ip"], time.monotonic() + 60
    while hostmod.ssh_banner(ip) and time.monotonic() < deadline:  # until it is down
        time.sleep(0.1)


def fault_hub(kind):
    def setup(ctx, f):
        ctx.hub = HubServer({services.HUB_REPO: services.prepare_hub()}, host="10.77.0.1").start()
        if kind == "cut":
            ctx.hub.drop_after("model.safetensors", 1_000_000, times=2)  # the try and its one retry
        else:
            ctx.hub.corrupt("model.safetensors")
        f.data = f.data + [f"model_hf_endpoint={ctx.hub.url}"]
    return setup


def stop_hub(ctx, f):
    gets = ctx.hub.downloads("model.safetensors")
    ctx.notes.append(f"hub: {len(gets)} GET(s) of model.safetensors, bytes sent {[g.sent for g in gets]}")
    ctx.hub.stop()


def kill_quantize(ctx, f):
    # Kills the first llama-quantize that starts on the host (SIGKILL, as the OOM killer would).
    r = ctx.rack.ssh(f.victim, "timeout 900 sh -c 'until pkill -KILL -x llama-quantize; do sleep 0.02; done'",
                     timeout=960)  # fmt: skip
    ctx.notes.append("llama-quantize killed" if r.returncode == 0 else "no llama-quantize ran")


def stop_killer(ctx, f):
    ctx.rack.ssh(f.victim, "pkill -f 'until pkill -KILL -x llama-quantize' || true")


def small_staging(ctx, f):
    staging = "/opt/llamarack/models/.staging"
    r = ctx.rack.ssh(f.victim, f"mkdir -p {shlex.quote(staging)} && mount -t tmpfs -o size=5m,mode=700 llamarack-full {shlex.quote(staging)}")
    if r.returncode != 0:
        raise RuntimeError(f"cannot mount a small tmpfs on {staging}: {r.stderr}")


def unmount_staging(ctx, f):
    ctx.rack.ssh(f.victim, "umount /opt/llamarack/models/.staging")


def break_driver(ctx, f):
    ctx.notes.append(drivermod.set_driver(ctx.rack, f.victim, version="550.144.03"))


def mend_driver(ctx, f):
    ctx.notes.append(drivermod.set_driver(ctx.rack, f.victim, version=deb.DEFAULT_VERSION, state="ok"))


def unreachable(on):
    def act(ctx, f):
        faults.reject_ssh(ctx.rack, f.victim, on)
    return act


def truncate_record(ctx, f):
    ctx.rack.ssh(f.victim, "truncate -s 7 /opt/llamarack/state/gpus.json")


def kill_at_switch(ctx, f):
    if faults.wait_on_host(ctx.rack, f.victim, f"[ -e {shlex.quote(UNIT_PATH + '.prev')} ]", timeout=900):
        ctx.deploy.kill()
        ctx.notes.append("pyinfra SIGKILLed with the unit switch under way")
    else:
        ctx.notes.append("the unit switch never started")


def broken_commit() -> str:
    return mirror.add_commit(services.prepare(), "lab-test-broken", "lab test: does not compile",
                             {"tools/server/server.cpp": "\n#error broken on purpose by the lab tests\n"})  # fmt: skip


FAULTS = [  # the quick ones first
    Fault("ssh-cut", "every SSH session to the host killed while the model converts",
          NEW_MODEL, NEW_MODEL, inject=at_convert_then(cut_ssh)),
    Fault("hub-cut", "the hub cuts model.safetensors at 1 MB, on the try and on its one retry",
          NEW_MODEL + ["model_fetch_retries=1"], NEW_MODEL, setup=fault_hub("cut"), cleanup=stop_hub),
    Fault("hub-wrong-sha", "the hub serves other bytes for model.safetensors (sha256 differs)",
          NEW_MODEL, NEW_MODEL, setup=fault_hub("corrupt"), cleanup=stop_hub),
    Fault("quantize-fails", "llama-quantize SIGKILLed on the model step",
          NEW_MODEL, NEW_MODEL, inject=kill_quantize, cleanup=stop_killer),
    Fault("disk-full", "the model staging fills up (5 MiB left) during the convert step",
          NEW_MODEL, NEW_MODEL, setup=small_staging, cleanup=unmount_staging),
    Fault("truncated-state", "the GPU record (state/gpus.json) cut to 7 bytes",
          [], [], setup=truncate_record, may_change=("/opt/llamarack/state/gpus.json",), expect_fail=False),
    Fault("sigkill-at-switch", "pyinfra SIGKILLed while the unit switch runs (a new context)",
          ["server_ctx_size=1024", "llamarack_roles=server"], [], inject=kill_at_switch, restarts=True,
          may_change=(UNIT_PATH, UNIT_PATH + ".prev")),
    Fault("health-fails", "a new unit that never answers /health (listens on an address the host lacks)",
          ["server_listen=10.99.99.99"], [], restarts=True),
    Fault("host-unreachable", "one host refuses SSH at the start; the other must go on",
          NEW_MODEL, NEW_MODEL, victim=B, hosts=(A, B), setup=unreachable(True), cleanup=unreachable(False),
          expect_fail=False),
    Fault("driver-mismatch", "a driver upgrade waiting for its reboot (NVML library/module mismatch)",
          NEW_MODEL, [], setup=break_driver, cleanup=mend_driver),
    Fault("reboot", "the host reboots while the model converts",
          NEW_MODEL, NEW_MODEL, inject=at_convert_then(reboot), restarts=True),
    Fault("build-fails", "a llama.cpp commit that does not compile", ["llamacpp_commit=BROKEN"], []),
]


# --- one fault ----------------------------------------------------------------------


def serving(ip: str, wait: float = 0) -> bool:
    deadline = time.monotonic() + wait
    while True:
        if faults.health(ip) == 200 and faults.completion(ip):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(1)


def base(ctx: Ctx, hosts) -> tuple:
    rc, out, s = faults.run(INVENTORY, DEPLOY, list(hosts))
    if rc != 0:
        raise RuntimeError(f"deploy with the lab's settings failed on {hosts} (rc {rc}):\n{out[-5000:]}")
    return rc, out, s


def one(ctx: Ctx, f: Fault) -> dict:
    rack = ctx.rack
    ip = rack.host(f.victim)["ip"]
    ctx.notes = []
    res = {"fault": f.name, "what": f.what, "victim": f.victim, "restarts": f.restarts}
    for h in f.hosts:
        faults.prune_models(rack, h)
    if not serving(ip):
        base(ctx, f.hosts)
    before = faults.snapshot(rack, f.victim)
    if f.setup:
        f.setup(ctx, f)
    data = [d.replace("BROKEN", broken_commit()) for d in f.data]
    poller = faults.Poller(ip)
    poller.start()
    log = LOGS / f"{f.name}.log"
    ctx.deploy = faults.Deploy(INVENTORY, DEPLOY, list(f.hosts), data, log=log).start()
    injector = None
    if f.inject:
        injector = threading.Thread(target=f.inject, args=(ctx, f), daemon=True)
        injector.start()
    rc, out, seconds = ctx.deploy.wait()
    settled = time.monotonic() + SETTLE_S
    if f.cleanup:
        f.cleanup(ctx, f)
    if injector:
        injector.join(timeout=60)
    if f.name == "reboot":
        rackmod.wait_booted(rack, 180, names=[f.victim])
    after_ok = serving(ip, wait=120 if f.restarts else 0)
    # What a dropped run left going on the host (a switch, a convert) ends meanwhile: still watched.
    time.sleep(max(0.0, settled - time.monotonic()))
    during = poller.stop()
    after_ok = after_ok and serving(ip)
    after = faults.snapshot(rack, f.victim)
    changed = faults.changed_outside_staging(before, after)
    res.update(
        failed_run={"rc": rc, "seconds": seconds, "log": str(log), "excerpt": excerpt(out)},
        during=during, serving_after=after_ok,
        changed_outside_staging=[p for p in changed if p not in f.may_change],
        changed_by_the_faults_own_step=[p for p in changed if p in f.may_change],
    )
    if f.name == "host-unreachable":
        # The other host made and serves the new artifact in that same run.
        made = rack.ssh(A, "grep -c '\"outtype\": \"f32\"' /opt/llamarack/models/current/stamp.json")
        res["other_host_went_on"] = made.stdout.strip() not in ("", "0")
    rerun = [faults.run(INVENTORY, DEPLOY, list(f.hosts), f.rerun) for _ in range(2)]
    res["rerun"] = {"rc": rerun[0][0], "seconds": rerun[0][2], "excerpt": excerpt(rerun[0][1], 1)}
    res["converged"] = {"rc": rerun[1][0], "changes": faults.changes(rerun[1][1]), "seconds": rerun[1][2]}
    res["notes"] = list(ctx.notes)
    res["nothing_lost"] = bool(
        (rc != 0 or not f.expect_fail)
        and after_ok
        and not res["changed_outside_staging"]
        and rerun[0][0] == 0 and rerun[1][0] == 0 and res["converged"]["changes"] == 0
        and res.get("other_host_went_on", True)
    )
    res["served_throughout"] = during["failures"] == 0
    res["survived"] = res["nothing_lost"] and res["served_throughout"]
    if f.rerun or f.data:
        base(ctx, f.hosts)  # back to the lab's settings for the next fault
    return res


def excerpt(output: str, lines: int = 4) -> list:
    """The last ``lines`` telling lines of a deploy's output (else its last two that say more
    than pyinfra's closing words), spaces squeezed, each cut at 500 characters; the whole
    output stays in the run's log."""
    squeezed = [" ".join(x.split())[:500] for x in output.splitlines()[-40:]
                if x.strip() and not CLOSING.search(x)]  # fmt: skip
    return [x for x in squeezed if TELLING.search(x)][-lines:] or squeezed[-2:]


def machine() -> dict:
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = bool(subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--", ".", ":!bench/results"],
                                capture_output=True, text=True).stdout.strip())  # fmt: skip
    return {"cpu": cpu, "cores": os.cpu_count(), "kernel": platform.release(),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "commit": commit + ("+dirty" if dirty else ""), "python": platform.python_version()}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", action="append", choices=[f.name for f in FAULTS], help="run only this fault (repeatable)")
    p.add_argument("--reuse", action="store_true", help="use the rack that is up and leave it up")
    p.add_argument("--list", action="store_true")
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--table", action="store_true", help="print the results file as the README's table")
    args = p.parse_args()
    if args.table:
        print(table(json.loads(args.out.read_text())))
        return
    if args.list:
        for f in FAULTS:
            print(f"{f.name:20} {f.what}")
        return
    chosen = [f for f in FAULTS if not args.only or f.name in args.only]
    LOGS.mkdir(parents=True, exist_ok=True)
    started_at = time.monotonic()
    existing = rackmod.load()
    started = False
    if existing is not None and args.reuse and rackmod.healthy(existing):
        rack = existing
    else:
        if existing is not None:
            raise SystemExit("a lab rack is already up: `llamarack lab down` first, or --reuse")
        rack = rackmod.up()
        started = not args.reuse
    results, report = [], {"survived": "none run"}
    try:
        ctx = Ctx(rack)
        t0 = time.monotonic()
        base(ctx, (A, B))
        setup_s = round(time.monotonic() - t0, 1)
        for f in chosen:
            print(f"--- {f.name}: {f.what}", flush=True)
            t = time.monotonic()
            try:
                r = one(ctx, f)
            except Exception as e:  # a fault the bench itself could not carry out: recorded, never hidden
                r = {"fault": f.name, "what": f.what, "survived": False, "error": f"{type(e).__name__}: {e}"}
                try:
                    base(ctx, f.hosts)
                except RuntimeError as e2:
                    r["error"] += f"; then the lab settings did not deploy: {str(e2)[:500]}"
            r["seconds"] = round(time.monotonic() - t, 1)
            results.append(r)
            print(json.dumps({k: r.get(k) for k in ("fault", "survived", "seconds", "error")}), flush=True)
            report = write_report(args.out, results, chosen, bool(args.only), setup_s, started_at)
    finally:
        if started:
            rackmod.down()
    print(f"{report['survived']} faults survived; {args.out}")


def table(report: dict) -> str:
    """The README's table of a results file."""
    rows = ["| fault | failed run | old deployment served | re-run | changed outside staging | survived |",
            "| --- | --- | --- | --- | --- | --- |"]
    for r in report["faults"]:
        if "error" in r:
            rows.append(f"| {r['fault']}: {r['what']} | the bench failed: {r['error'][:120]} | | | | no |")
            continue
        run, during = r["failed_run"], r["during"]
        served = ("throughout" if not during["failures"] else
                  f"{during['failures']} of {during['requests']} /health failed ({during['longest_outage_s']} s)")
        served += "; after: yes" if r["serving_after"] else "; after: NO"
        rerun = f"rc {r['rerun']['rc']} ({r['rerun']['seconds']} s), then {r['converged']['changes']} changes"
        outside = ", ".join(r["changed_outside_staging"]) or "nothing"
        if r["changed_by_the_faults_own_step"]:
            outside += " (its own step: " + ", ".join(p.rsplit("/", 1)[-1] for p in r["changed_by_the_faults_own_step"]) + ")"
        survived = "yes" if r["survived"] else ("**no**: served with gaps, nothing lost" if r.get("nothing_lost")
                                                else "**no**")
        rows.append(f"| {r['fault']}: {r['what']} | rc {run['rc']} ({run['seconds']} s) | {served} | {rerun} "
                    f"| {outside} | {survived} |")
    m = report["machine"]
    rows.append(f"\n{report['survived']} survived, nothing lost in {report['nothing_lost']}; {m['cpu']}, {m['cores']} cores, {m['date'][:10]}, "
                f"commit {m['commit'][:10]}, {report['total_s']:.0f} s in all.")
    return "\n".join(rows)


def write_report(path: Path, results: list, chosen: list, only: bool, setup_s: float, started_at: float) -> dict:
    survived = [r["fault"] for r in results if r["survived"]]
    kept = [r["fault"] for r in results if r.get("nothing_lost")]
    report = {
        "schema": "llamarack-reliability/1",
        "machine": machine(),
        "command": "flock /tmp/llamarack-lab.lock python3 bench/reliability.py"
                   + "".join(f" --only {f.name}" for f in chosen if only),
        "staging": " ".join(faults.__doc__.split("The staging areas,")[1].split("Everything else")[0].split()),
        "baseline_deploy_s": setup_s,
        "total_s": round(time.monotonic() - started_at, 1),
        "survived": f"{len(survived)} of {len(results)}",
        "nothing_lost": f"{len(kept)} of {len(results)}",
        "not_survived": [r["fault"] for r in results if not r["survived"]],
        "lost_something": [r["fault"] for r in results if not r.get("nothing_lost")],
        "not_run": [f.name for f in chosen if f.name not in {r["fault"] for r in results}],
        "faults": results,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1) + "\n")
    return report


if __name__ == "__main__":
    main()

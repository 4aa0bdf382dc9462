#!/usr/bin/env python3
"""Fault injection on the lab rack: does a failed deploy lose anything?

    flock /tmp/llamarack-lab.lock python3 bench/reliability.py [--only FAULT ...] [--reuse] [--list]

Brings the default rack up once (``--reuse``: the rack that is up, left up),
deploys lab-v100-a, lab-v100-b and the gateway lab-gw (HAProxy in front of
the rack) until the two hosts serve the tiny model, then for each fault, on a
converged host:

1. takes a snapshot of the deployment (``llamarack_lab.faults.snapshot``);
2. starts two pollers on the served ``/health`` (each 4 a second, each request
   bounded to 2 s): one through the gateway, as the rack's users reach it, and
   one on the host's own address; starts a deploy that has new work to do (a
   setting changed: the model converted to f32, a llama.cpp commit, the
   listen address...) and injects the fault into it;
3. collects the fault's evidence that it acted where it was meant to: what
   its own steps measured on the host when it hit (the converter's processes
   running, SSH sessions killed, the staging's free bytes after the fetch
   finished, the record's size, a new boot), the lab's own counters (bytes
   the hub sent per GET, packets the firewall rule turned away) and the
   lines of the failed run's output that only the fault explains (ENOSPC in
   the convert step, a SHA-256 mismatch, the rollback, the compiler's #error);
4. checks: the rack answered throughout (the gateway's poller; the host's own
   outage is recorded beside it as ``during_host``) and the host still serves
   after the run (``/health`` and a ``/completion``); no file outside the
   staging areas changed (``faults.changed_outside_staging``);
5. re-runs without the fault: it must succeed, and the run after it must
   change nothing, by pyinfra's count and by the host's real state (files
   by content, mode and owner, packages and holds, the server's PID and
   restarts); then goes back to the lab's settings for the next fault.

Before each model fault every model artifact but the served one is removed
(and for the hub's faults the blob cache, so the fetch downloads), so the
change always has its whole work to do. Writes
bench/results/reliability.json (every fault's figures and evidence, the
machine, the command line as it ran), stamped by ``bench/provenance.py``. A fault whose evidence does not all
hold did not fire (``outcome``: ``not fired``), whatever its run did
(``reliability_report``); one that fired ``survived`` when all of 4 and 5
held; ``nothing_lost`` is all but the poller's (a fault whose run restarts
the server by design, a unit switch or a reboot, is marked ``restarts``: its
outage is measured). The poller goes on for SETTLE_S after the failed run:
what a dropped run left going on the host (a unit switch, a convert) ends
meanwhile.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import io
import json
import os
import platform
import re
import shlex
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "lab"), str(ROOT / "bench")]  # this checkout's, whichever pip installed

from llamarack_lab import driver as drivermod  # noqa: E402
from llamarack_lab import faults, mirror, services  # noqa: E402
from llamarack_lab import host as hostmod  # noqa: E402
from llamarack_lab import rack as rackmod  # noqa: E402
from llamarack_lab.fake_nvidia import deb  # noqa: E402
from llamarack_lab.hub_server import HubServer  # noqa: E402
from llamarack.layout import UNIT_PATH, Layout  # noqa: E402
from roles.gateway.plan import BACKEND, server_name  # noqa: E402
from roles.gateway.settings import GatewaySettings  # noqa: E402
from roles.model.sandbox import PIPELINE_USER  # noqa: E402
from tests.lab.deploying import STATE  # noqa: E402

import provenance  # noqa: E402
from reliability_report import (  # noqa: E402
    SCHEMA, count_proof, driver_versions, judge, key_values, line_proof, proof, rejected_packets, summary, table,
    this_command,
)  # fmt: skip

INVENTORY = ROOT / "inventory/lab.py"
DEPLOY = ROOT / "deploy.py"
A, B = "lab-v100-a", "lab-v100-b"
GATEWAY_PORT = GatewaySettings().port  # the rack's endpoint on the lab's gateway: the setting's default
NEW_MODEL = ["model_convert_outtype=f32"]  # a new artifact, the same build
OUT = ROOT / "bench/results/reliability.json"
LOGS = Path("/tmp/llamarack-reliability")
SETTLE_S = 10.0
COMMAND = ""  # the command line that ran (main)
STAGING = Layout(faults.ROOT).staging
GPU_RECORD = f"{Layout(faults.ROOT).state}/gpus.json"
HUB_FILE = "model.safetensors"
# The model's converter at work: the pipeline user's processes running convert_hf_to_gguf.py (the
# bracket keeps the root shell that runs the pattern from matching it).
CONVERTER = f"-u {shlex.quote(PIPELINE_USER)} -f '[c]onvert_hf_to_gguf'"
# What tells one boot of a lab host from the next: its boot id and the start time of its PID 1.
BOOT = "echo boot=$(cat /proc/sys/kernel/random/boot_id)-$(cut -d' ' -f22 /proc/1/stat)"
# The lines of a deploy's output worth keeping in the results: what failed, and pyinfra's total;
# not pyinfra's closing words nor make's recipe lines.
TELLING = re.compile(r"error|fail|killed|refus|rolled back|mismatch|not enough|no space|grand total", re.I)
CLOSING = re.compile(r"Error: executed \d+ commands|No hosts remaining|Disconnecting from hosts|\*\*\* \[")


@dataclass
class Ctx:
    rack: rackmod.Rack
    deploy: Optional[faults.Deploy] = None
    notes: list = field(default_factory=list)
    hub: Optional[HubServer] = None
    seen: dict = field(default_factory=dict)  # what the fault's own steps measured on the host, for its evidence


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
    # (ctx, fault, rc, output) -> proofs that the fault acted where it was meant to (reliability_report);
    # called once the host is back, before the re-runs. None: no evidence, the fault did not fire.
    evidence: Optional[Callable] = None
    restarts: bool = False  # the failed run restarts the server by design
    may_change: tuple = ()  # paths outside staging the fault's own step may change
    expect_fail: bool = True


# --- injections -------------------------------------------------------------------


def when_on_host(ctx: Ctx, f: Fault, test: str, then: str, timeout: int = 900) -> None:
    """Run the shell ``then`` on the victim as soon as ``test`` holds there (checked every 20 ms,
    in the same SSH session); what it prints as ``key=value`` goes into ``ctx.seen``."""
    wait = f"until {test}; do sleep 0.02; done"
    r = ctx.rack.ssh(f.victim, f"timeout {timeout} sh -c {shlex.quote(wait)} && {{ {then}; }}", timeout=timeout + 60)
    ctx.seen.update(key_values(r.stdout))
    if r.returncode == 124:
        ctx.notes.append(f"never held on the host: {test}")


def at_convert(then: str) -> Callable:
    """An injection: ``then`` on the host once the converter runs, after it prints how many
    converter processes ran at that moment (``converting=N``)."""
    def inject(ctx: Ctx, f: Fault):
        when_on_host(ctx, f, f"pgrep {CONVERTER} >/dev/null", f"echo converting=$(pgrep -c {CONVERTER}); {then}")
    return inject


def boot(ctx: Ctx, f: Fault) -> str:
    return key_values(ctx.rack.ssh(f.victim, BOOT).stdout).get("boot", "")


def remember_boot(ctx, f):
    ctx.seen["boot_before"] = boot(ctx, f)


def reboot_at_convert(ctx, f):
    at_convert("systemctl reboot")(ctx, f)
    ip, deadline = ctx.rack.host(f.victim)["ip"], time.monotonic() + 60
    while hostmod.ssh_banner(ip) and time.monotonic() < deadline:  # until it is down
        time.sleep(0.1)


def fault_hub(kind):
    def setup(ctx, f):
        faults.drop_blob_cache(ctx.rack, f.victim)  # else the fetch takes the file from the cache: no GET
        ctx.hub = HubServer({services.HUB_REPO: services.prepare_hub()}, host="10.77.0.1").start()
        if kind == "cut":
            ctx.hub.drop_after(HUB_FILE, 1_000_000, times=2)  # the try and its one retry
        else:
            ctx.hub.corrupt(HUB_FILE)
        f.data = f.data + [f"model_hf_endpoint={ctx.hub.url}"]
    return setup


def stop_hub(ctx, f):
    ctx.seen["hub_sent"] = [g.sent for g in ctx.hub.downloads(HUB_FILE)]
    ctx.seen["hub_size"] = ctx.hub.repo(services.HUB_REPO).files[HUB_FILE].size
    ctx.notes.append(f"hub: {len(ctx.seen['hub_sent'])} GET(s) of {HUB_FILE}, bytes sent {ctx.seen['hub_sent']}")
    ctx.hub.stop()


def kill_quantize(ctx, f):
    # Kills the first llama-quantize that starts on the host (SIGKILL, as the OOM killer would).
    r = ctx.rack.ssh(f.victim, "timeout 900 sh -c 'until pkill -KILL -x llama-quantize; do sleep 0.02; done'",
                     timeout=960)  # fmt: skip
    ctx.seen["quantize_killed"] = int(r.returncode == 0)
    ctx.notes.append("llama-quantize killed" if r.returncode == 0 else "no llama-quantize ran")


def stop_killer(ctx, f):
    ctx.rack.ssh(f.victim, "pkill -f 'until pkill -KILL -x llama-quantize' || true")


def roomy_staging(ctx, f):
    # A tmpfs of 2 GiB (a limit: it holds only what is written): the fetch's check of the free
    # space (the files and 1 GiB kept free) passes, and the download completes.
    r = ctx.rack.ssh(f.victim, f"mkdir -p {shlex.quote(STAGING)} && "
                               f"mount -t tmpfs -o size=2g,mode=711 llamarack-full {shlex.quote(STAGING)}")
    if r.returncode != 0:
        raise RuntimeError(f"cannot mount a tmpfs on {STAGING}: {r.stderr}")


# Once the fetch is done and the convert starts: the staging's tmpfs shrinks to what it holds
# plus 64 KiB, so the converter's output (megabytes) cannot be written. Prints whether the fetch
# had finished (its log's last line), the remount, and the bytes left.
FILL_STAGING = (f"s={shlex.quote(STAGING)}; echo fetched=$(cat $s/*/fetch.log | grep -c 'file(s) in place under'); "
                "used=$(df -k --output=used $s | tail -n 1 | tr -d ' '); "
                "mount -o remount,size=$((used + 64))k $s && echo remounted=1; "
                "echo free_bytes=$(df -B1 --output=avail $s | tail -n 1 | tr -d ' ')")


def fill_at_convert(ctx, f):
    when_on_host(ctx, f, faults.staged("convert"), FILL_STAGING)


def unmount_staging(ctx, f):
    ctx.rack.ssh(f.victim, f"umount {shlex.quote(STAGING)}")


def break_driver(ctx, f):
    ctx.seen["driver"] = drivermod.set_driver(ctx.rack, f.victim, version="550.144.03")
    ctx.notes.append(ctx.seen["driver"])


def mend_driver(ctx, f):
    ctx.notes.append(drivermod.set_driver(ctx.rack, f.victim, version=deb.DEFAULT_VERSION, state="ok"))


def refuse_ssh(ctx, f):
    faults.reject_ssh(ctx.rack, f.victim, True)


def allow_ssh(ctx, f):
    ctx.seen["rejected"] = rejected_packets(faults.ssh_rule_listing(ctx.rack, f.victim))
    faults.reject_ssh(ctx.rack, f.victim, False)


def truncate_record(ctx, f):
    r = ctx.rack.ssh(f.victim, f"truncate -s 7 {GPU_RECORD} && echo size=$(stat -c %s {GPU_RECORD})")
    ctx.seen.update(key_values(r.stdout))


def kill_at_switch(ctx, f):
    if faults.wait_on_host(ctx.rack, f.victim, f"[ -e {shlex.quote(UNIT_PATH + '.prev')} ]", timeout=900):
        ctx.deploy.kill()
        ctx.seen["at_switch"] = 1
        ctx.notes.append("pyinfra SIGKILLed with the unit switch under way")
    else:
        ctx.notes.append("the unit switch never started")


def broken_commit() -> str:
    return mirror.add_commit(services.prepare(), "lab-test-broken", "lab test: does not compile",
                             {"tools/server/server.cpp": "\n#error broken on purpose by the lab tests\n"})  # fmt: skip


# --- evidence: each fault shows that it acted where it was meant to ------------------


def converting(ctx) -> dict:
    return count_proof("the converter ran when the fault hit (its processes)", ctx.seen.get("converting"))


def ssh_cut_evidence(ctx, f, rc, out):
    return [converting(ctx),
            count_proof("SSH sessions killed (the injecting one spared: pyinfra's)", ctx.seen.get("killed"))]


def reboot_evidence(ctx, f, rc, out):
    before, after = ctx.seen.get("boot_before"), boot(ctx, f)
    return [converting(ctx), proof("the host booted again (boot id, PID 1's start)", before and after and after != before,
                                   {"before": before, "after": after})]  # fmt: skip


def hub_evidence(kind):
    def evidence(ctx, f, rc, out):
        sent, size = ctx.seen.get("hub_sent") or [], ctx.seen.get("hub_size")
        seen = {"bytes_sent_per_get": sent, "file_size": size}
        if kind == "cut":
            return [proof(f"the hub cut every GET of {HUB_FILE} short (its own count)",
                          sent and all(n < size for n in sent), seen),
                    line_proof("the fetcher saw the cut", out, r"download failed after \d+ attempt")]
        return [proof(f"the hub sent the whole of its wrong {HUB_FILE} (its own count)", size in sent, seen),
                line_proof("the fetcher refused the bytes", out, r"sha256 mismatch")]
    return evidence


def quantize_evidence(ctx, f, rc, out):
    return [count_proof("pkill found and killed a llama-quantize", ctx.seen.get("quantize_killed")),
            line_proof("the quantize step's output ends killed", out, r"\bKilled\b")]


def disk_full_evidence(ctx, f, rc, out):
    left = ctx.seen.get("free_bytes")
    return [count_proof("the fetch had finished (fetch.log: all files in place)", ctx.seen.get("fetched")),
            proof("the staging shrank to what it held plus 64 KiB", ctx.seen.get("remounted") == 1
                  and isinstance(left, int) and left < 1 << 20, {"free_bytes": left}),
            # ENOSPC as the OS words it, or as the converter's short write (gguf-py's OSError
            # "N requested and M written" when the disk took only part of a block)
            line_proof("the convert step hit ENOSPC", out,
                       r"No space left on device|OSError: \d+ requested and \d+ written")]  # fmt: skip


def truncated_evidence(ctx, f, rc, out):
    return [proof("the GPU record was 7 bytes when the run started", ctx.seen.get("size") == 7, ctx.seen.get("size"))]


def switch_evidence(ctx, f, rc, out):
    return [count_proof("the unit switch was under way (.prev present)", ctx.seen.get("at_switch")),
            proof("pyinfra died of SIGKILL", rc == -9, rc)]


def health_evidence(ctx, f, rc, out):
    return [line_proof("the new unit failed its check and was rolled back", out, r"rolled back")]


def unreachable_evidence(ctx, f, rc, out):
    return [count_proof("SSH connections turned away by the lab's rule (its packet count)", ctx.seen.get("rejected"))]


def driver_evidence(ctx, f, rc, out):
    package, module = driver_versions(ctx.seen.get("driver"))
    return [proof("the driver package and the loaded module differ", package and module and package != module,
                  ctx.seen.get("driver")),
            line_proof("preflight refused the host", out, r"driver-reboot-needed")]  # fmt: skip


def build_evidence(ctx, f, rc, out):
    return [line_proof("the compiler stopped at the commit's #error", out, r"#error broken on purpose")]


FAULTS = [  # the quick ones first
    Fault("ssh-cut", "every SSH session to the host killed while the model converts",
          NEW_MODEL, NEW_MODEL, inject=at_convert(faults.CUT_SSH), evidence=ssh_cut_evidence),
    Fault("hub-cut", "the hub cuts model.safetensors at 1 MB, on the try and on its one retry",
          NEW_MODEL + ["model_fetch_retries=1"], NEW_MODEL, setup=fault_hub("cut"), cleanup=stop_hub,
          evidence=hub_evidence("cut")),
    Fault("hub-wrong-sha", "the hub serves other bytes for model.safetensors (sha256 differs)",
          NEW_MODEL, NEW_MODEL, setup=fault_hub("corrupt"), cleanup=stop_hub, evidence=hub_evidence("corrupt")),
    Fault("quantize-fails", "llama-quantize SIGKILLed on the model step",
          NEW_MODEL, NEW_MODEL, inject=kill_quantize, cleanup=stop_killer, evidence=quantize_evidence),
    Fault("disk-full", "the model staging fills up (64 KiB left) once the fetch is done, as the convert starts",
          NEW_MODEL, NEW_MODEL, setup=roomy_staging, inject=fill_at_convert, cleanup=unmount_staging,
          evidence=disk_full_evidence),
    Fault("truncated-state", "the GPU record (state/gpus.json) cut to 7 bytes",
          [], [], setup=truncate_record, may_change=(GPU_RECORD,), expect_fail=False, evidence=truncated_evidence),
    Fault("sigkill-at-switch", "pyinfra SIGKILLed while the unit switch runs (a new context)",
          ["server_ctx_size=1024", "llamarack_roles=server"], [], inject=kill_at_switch, restarts=True,
          # the switch itself, detached, goes on to its end: the new unit, and the one before it kept
          may_change=(UNIT_PATH, UNIT_PATH + ".prev", Layout(faults.ROOT).previous_unit), evidence=switch_evidence),
    Fault("health-fails", "a new unit that never answers /health (listens on an address the host lacks)",
          ["server_listen=10.99.99.99"], [], restarts=True, evidence=health_evidence),
    Fault("host-unreachable", "one host refuses SSH at the start; the other must go on",
          NEW_MODEL, NEW_MODEL, victim=B, hosts=(A, B), setup=refuse_ssh, cleanup=allow_ssh,
          expect_fail=False, evidence=unreachable_evidence),
    Fault("driver-mismatch", "a driver upgrade waiting for its reboot (NVML library/module mismatch)",
          NEW_MODEL, [], setup=break_driver, cleanup=mend_driver, evidence=driver_evidence),
    Fault("reboot", "the host reboots while the model converts",
          NEW_MODEL, NEW_MODEL, setup=remember_boot, inject=reboot_at_convert, restarts=True, evidence=reboot_evidence),
    Fault("build-fails", "a llama.cpp commit that does not compile", ["llamacpp_commit=BROKEN"], [],
          evidence=build_evidence),
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


# The gateway's own counters for a server, from HAProxy's stats CSV: what it sent there, the
# connections it retried there and the requests it moved off it to another, and the checks that
# took it out of service.
GATEWAY_COUNTERS = {"sent": "stot", "retried": "wretr", "redispatched": "wredis", "taken_down": "chkdown"}


def gateway_counts(rack, host: str) -> Optional[dict]:
    """GATEWAY_COUNTERS of the gateway's servers for ``host`` (its units, summed), read from
    its stats page; None where the rack has no gateway."""
    if rack.gateway is None:
        return None
    url = f"http://{rack.gateway.ip}:{GatewaySettings().stats_port}/stats;csv"
    with urllib.request.urlopen(url, timeout=10) as r:
        rows = [row for row in csv.DictReader(io.StringIO(r.read().decode().removeprefix("# ")))
                if row.get("pxname") == BACKEND and unit_of(row.get("svname") or "", host)]  # fmt: skip
    if not rows:
        raise RuntimeError(f"the gateway's stats page has no server of {host}")
    return {k: sum(int(row.get(col) or 0) for row in rows) for k, col in GATEWAY_COUNTERS.items()}


def unit_of(svname: str, host: str) -> bool:
    """Whether the gateway's server ``svname`` is one of ``host``'s units (``server_name``)."""
    prefix = server_name(host, 0)[:-1]
    return svname.startswith(prefix) and svname[len(prefix):].isdigit()


def pollers(rack, ip: str) -> dict:
    """The failed run's pollers of /health: ``during`` through the rack's gateway (where the
    rack has one; else the host's own address), ``during_host`` on the host's own address."""
    rack_side = faults.Poller(rack.gateway.ip, port=GATEWAY_PORT) if rack.gateway else faults.Poller(ip)
    return {"during": rack_side.start(), "during_host": faults.Poller(ip).start()}


def failed_run(ctx: Ctx, f: Fault) -> dict:
    """The run with the fault in it, the pollers asking /health throughout; then the host back
    (a reboot waited for) and settled: its rc, output, seconds, log, the pollers' summaries,
    and whether the host serves after it."""
    rack, ip = ctx.rack, ctx.rack.host(f.victim)["ip"]
    if f.setup:
        f.setup(ctx, f)
    data = [d.replace("BROKEN", broken_commit()) for d in f.data]
    counted = gateway_counts(rack, f.victim)
    polling = pollers(rack, ip)
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
    during = {k: p.stop() for k, p in polling.items()}
    if counted is not None:  # what the gateway did with the host's share of the requests meanwhile
        during["gateway"] = {k: n - counted[k] for k, n in gateway_counts(rack, f.victim).items()}
    return {"rc": rc, "out": out, "seconds": seconds, "log": str(log), "serving_after": after_ok and serving(ip),
            **during}  # fmt: skip


def reruns(ctx: Ctx, f: Fault) -> dict:
    """The re-run without the fault, and the run after it, which must change nothing: by
    pyinfra's count and by the hosts' real state (``tests.lab.deploying.STATE``: every file
    of the deployment by content, mode and owner, the package selections and holds, the
    server's PID and restarts), taken before and after it."""
    rc, out, seconds = faults.run(INVENTORY, DEPLOY, list(f.hosts), f.rerun)
    before = {h: ctx.rack.ssh(h, STATE).stdout for h in f.hosts}
    rc2, out2, seconds2 = faults.run(INVENTORY, DEPLOY, list(f.hosts), f.rerun)
    after = {h: ctx.rack.ssh(h, STATE).stdout for h in f.hosts}
    return {"rerun": {"rc": rc, "seconds": seconds, "excerpt": excerpt(out, 1)},
            "converged": {"rc": rc2, "changes": faults.changes(out2), "seconds": seconds2,
                          "state_unchanged": before == after and all(before.values()),
                          "state_changed_on": [h for h in f.hosts if before[h] != after[h]]}}  # fmt: skip


def one(ctx: Ctx, f: Fault) -> dict:
    rack = ctx.rack
    ctx.notes, ctx.seen = [], {}
    res = {"fault": f.name, "what": f.what, "victim": f.victim, "restarts": f.restarts}
    for h in f.hosts:
        faults.prune_models(rack, h)
    if not serving(rack.host(f.victim)["ip"]):
        base(ctx, f.hosts)
    before = faults.snapshot(rack, f.victim)
    run = failed_run(ctx, f)
    rc = run["rc"]
    # Whether the fault acted where it was meant to: without it, the fault did not fire.
    evidence = f.evidence(ctx, f, rc, run["out"]) if f.evidence else []
    changed = faults.changed_outside_staging(before, faults.snapshot(rack, f.victim))
    res.update(
        failed_run={"rc": rc, "seconds": run["seconds"], "log": run["log"], "excerpt": excerpt(run["out"])},
        evidence=evidence, during=run["during"], during_host=run["during_host"], gateway=run.get("gateway"),
        serving_after=run["serving_after"],
        changed_outside_staging=[p for p in changed if p not in f.may_change],
        changed_by_the_faults_own_step=[p for p in changed if p in f.may_change],
    )
    if f.name == "host-unreachable":
        # The other host made and serves the new artifact in that same run.
        made = rack.ssh(A, "grep -c '\"outtype\": \"f32\"' /opt/llamarack/models/current/stamp.json")
        res["other_host_went_on"] = made.stdout.strip() not in ("", "0")
    res.update(reruns(ctx, f))
    res["notes"] = list(ctx.notes)
    res["seen_on_the_host"] = dict(ctx.seen)
    res["nothing_lost"] = bool(
        (rc != 0 or not f.expect_fail)
        and run["serving_after"]
        and not res["changed_outside_staging"]
        and res["rerun"]["rc"] == 0 and res["converged"]["rc"] == 0 and res["converged"]["changes"] == 0
        and res["converged"]["state_unchanged"]
        and res.get("other_host_went_on", True)
    )
    res["served_throughout"] = run["during"]["failures"] == 0
    res["host_served_throughout"] = run["during_host"]["failures"] == 0
    if f.rerun or f.data:
        base(ctx, f.hosts)  # back to the lab's settings for the next fault
    return judge(res)


def excerpt(output: str, lines: int = 4) -> list:
    """The last ``lines`` telling lines of a deploy's output (else its last two that say more
    than pyinfra's closing words), spaces squeezed, each cut at 500 characters; the whole
    output stays in the run's log."""
    squeezed = [" ".join(x.split())[:500] for x in output.splitlines()[-40:]
                if x.strip() and not CLOSING.search(x)]  # fmt: skip
    return [x for x in squeezed if TELLING.search(x)][-lines:] or squeezed[-2:]


def machine() -> dict:
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
    return {"cpu": cpu, "cores": os.cpu_count(), "kernel": platform.release(),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "python": platform.python_version()}  # fmt: skip


def main() -> None:
    global COMMAND
    COMMAND = this_command()  # as typed, every flag in it (--reuse, --only...), and flock around it
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
    results, report = [], {"fired": "none run", "survived": "none run"}
    try:
        ctx = Ctx(rack)
        t0 = time.monotonic()
        base(ctx, (A, B) + ((rack.gateway.name,) if rack.gateway else ()))
        setup_s = round(time.monotonic() - t0, 1)
        for f in chosen:
            print(f"--- {f.name}: {f.what}", flush=True)
            t = time.monotonic()
            try:
                r = one(ctx, f)
            except Exception as e:  # a fault the bench itself could not carry out: recorded, never hidden
                r = judge({"fault": f.name, "what": f.what, "error": f"{type(e).__name__}: {e}"})
                try:
                    base(ctx, f.hosts)
                except RuntimeError as e2:
                    r["error"] += f"; then the lab settings did not deploy: {str(e2)[:500]}"
            r["seconds"] = round(time.monotonic() - t, 1)
            results.append(r)
            print(json.dumps({k: r.get(k) for k in ("fault", "outcome", "seconds", "error")}), flush=True)
            report = write_report(args.out, results, chosen, setup_s, started_at)
    finally:
        if started:
            rackmod.down()
    print(f"{report['fired']} faults fired, {report['survived']} survived; {args.out}")


def write_report(path: Path, results: list, chosen: list, setup_s: float, started_at: float) -> dict:
    report = {
        "schema": SCHEMA,
        "provenance": provenance.stamp(__file__, cmd=COMMAND),
        "machine": machine(),
        "command": COMMAND,
        "staging": " ".join(faults.__doc__.split("The staging areas,")[1].split("Everything else")[0].split()),
        "baseline_deploy_s": setup_s,
        "total_s": round(time.monotonic() - started_at, 1),
        **summary(results, [f.name for f in chosen]),
        "faults": results,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1) + "\n")
    return report


if __name__ == "__main__":
    main()

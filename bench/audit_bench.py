#!/usr/bin/env python3
"""What ``llamarack audit`` of the lab rack costs, against a bare ``ssh HOST true`` fan-out to the same hosts.

    python3 bench/audit_bench.py [--reps 7] [--reuse] [--hosts N [--batch B]]     (as root, under the lab lock)

Uses the rack that is up with ``--reuse`` (it must be converged: the audit
must find no drift), else brings up the default 4-host rack (``--hosts N``:
N hosts through the rack's own inventory) and deploys it until it converges
(``pyinfra -y INVENTORY deploy.py``), and takes it down at the end.
Then, alternating so both see the same load:

- audit_s: wall time of ``llamarack audit INVENTORY --json`` (exit 0, every host
  reachable, no drift), median of --reps;
- ssh_true_fan_out_s: wall time of ``ssh HOST true`` to every host at once (the
  lab's own ssh command line), median of --reps; and their ratio (a figure, not a bound: the
  lab's hosts share this machine's cores, so it follows the minute it is taken);
- audit_control_cpu_s: the audit's CPU on this machine (its ssh children included), and
  split: its own Python, its ssh children;
- audit_remote_commands_per_host: from one ``--debug`` run (goal: 1);
- remote_script_cpu_s: per host, the CPU (user + sys) of the one script the
  audit sends, run once more under the host's ``bash`` ``time``;
- where_the_cpu_goes: one host's script in parts (every read; the two nvidia-smi
  queries; the facts one shared python3 answers; the shell commands, and each of those
  alone), and the CPU of
  one ``ssh HOST true`` here with OpenSSH's default key exchange and with curve25519;
- floor: a lower bound on the audit's wall time here from CPU alone (``floor``): the
  fan-out's CPU plus what any audit through pyinfra's facts with one python3 per host
  spends before it reads a fact, over the cores;
- the machine (CPU model, cores) and the load average before and after.

The lab's hosts are containers on this machine: their sshd, their script and
the audit's own Python share its cores (2 here), so both figures are CPU-bound.

Writes bench/results/audit.json (``audit-<N>hosts.json`` for another N).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from llamarack_lab import rack as rackmod  # noqa: E402
from llamarack_lab.pytest_plugin import count_remote_work, pyinfra_command  # noqa: E402

from converged_bench import _cpu, _pyinfra_version, ssh_fan_out  # noqa: E402  (this folder's)

ENV = {**os.environ, "PYTHONPATH": str(ROOT)}  # this checkout's llamarack, whatever is installed


# ``python3 -m llamarack audit ...`` (the same entry point, so the same ``os._exit`` without
# the interpreter's teardown), and just before that exit one stderr line with the CPU the
# audit's own Python used and the CPU its children (one ssh per host, all waited) used.
AUDIT_CLI = """
import json, os, resource, sys
def _exit(status, _exit=os._exit):
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    print("audit-cpu " + json.dumps([own.ru_utime + own.ru_stime, kids.ru_utime + kids.ru_stime]), file=sys.stderr)
    sys.stderr.flush()
    _exit(status)
os._exit = _exit
sys.argv = ["llamarack", *sys.argv[1:]]
from llamarack.entry import entry
entry()
"""


def audit(inventory: Path, *args: str) -> tuple[float, float, dict, str]:
    """(wall seconds, CPU seconds here, report, stderr) of one audit; it must find every host converged."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    r = subprocess.run([sys.executable, "-c", AUDIT_CLI, "audit", str(inventory), "--json", *args], cwd=ROOT,
                       env=ENV, capture_output=True, text=True, timeout=600)  # fmt: skip
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    if r.returncode != 0:
        raise SystemExit(f"audit exit {r.returncode}:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return wall, cpu, json.loads(r.stdout), r.stderr


def audit_reads_by_host(inventory: Path) -> dict:
    """{host: the facts the audit reads there} for every host of the inventory, from its settings."""
    from llamarack import openssh
    from llamarack.audit import audit_reads
    from llamarack.settings import settings_for

    return {h.name: audit_reads(settings_for(h)) for h in openssh.load_inventory(str(inventory))}


def remote_script_cpu(rack, reads: dict) -> dict:
    """Per host: user + sys seconds of the audit's one script (``reads``: ``audit_reads_by_host``),
    one run by the host's bash ``time``."""
    from llamarack.facts.reading import FactsTogether

    return {h.name: round(_bash_cpu(rack, h.name, {"all": FactsTogether().command(reads=reads[h.name])}, 1)["all"], 3)
            for h in rack.hosts}  # fmt: skip


def _split_cpu(stderr: str) -> tuple:
    """(the audit's own Python, its ssh children) CPU seconds from its ``audit-cpu`` line."""
    line = [x for x in stderr.splitlines() if x.startswith("audit-cpu ")][-1]
    return tuple(json.loads(line.split(" ", 1)[1]))


def _bash_cpu(rack, host: str, scripts: dict, reps: int) -> dict:
    """Median CPU (user + sys, seconds) of each of ``scripts`` run by the host's ``sh``, timed by its bash."""
    import shlex

    body = ["TIMEFORMAT='%3U %3S'"] + [f"echo part {name} >&2; time ( sh -c {shlex.quote(text)} >/dev/null 2>&1 )"
                                       for name, text in scripts.items()]  # fmt: skip
    runs: dict = {}
    for _ in range(reps):
        err = subprocess.run(rack.ssh_command(host, "bash -s"), input="\n".join(body), capture_output=True,
                             text=True, timeout=120).stderr.splitlines()  # fmt: skip
        for mark, times in zip(err, err[1:]):
            if mark.startswith("part "):
                runs.setdefault(mark.split()[1], []).append(sum(map(float, times.split())))
    return {name: round(statistics.median(v), 4) for name, v in runs.items()}


def where_the_cpu_goes(rack, reads: dict, reps: int = 9) -> dict:
    """What one host's script is made of, and what one ssh connection costs here: the
    figures that bound the audit's ratio on this machine, where hosts and control share
    the cores. The script's parts (medians, seconds of the host's CPU): every fact read
    together, the two nvidia-smi queries, the facts one shared python3 answers
    (``host_run``, and the shell commands' twins: ``host_twin``), and the facts that are
    shell commands. And the CPU of one ``ssh HOST true`` on this side, with the lab's
    command line (OpenSSH's default key exchange, sntrup761x25519) and with
    ``-o KexAlgorithms=curve25519-sha256``: the
    fan-out's own cost, shown, not changed (the audit uses the same ssh defaults)."""
    from llamarack.facts import GpuProcesses
    from llamarack.facts.gpu import NvidiaSmi
    from llamarack.facts.reading import FactsTogether, answered_by_python3

    host = rack.hosts[0].name
    reads = reads[host]
    smi = tuple(r for r in reads if r.fact in (NvidiaSmi, GpuProcesses))
    python = tuple(r for r in reads if answered_by_python3(r))
    shell = tuple(r for r in reads if r not in smi and r not in python)
    parts = {"all": reads, "nvidia_smi": smi, "host_runs_python3": python, "shell_commands": shell}
    each = {f"shell_{i}": (r,) for i, r in enumerate(shell)}  # one shell read alone: spread thin, or one big one?
    script = _bash_cpu(rack, host, {k: FactsTogether().command(reads=v) for k, v in {**parts, **each}.items()}, reps)
    shell_each = {repr(r): script[f"shell_{i}"] for i, r in enumerate(shell)}
    script = {k: script[k] for k in parts}
    command = rack.ssh_command(host, "true")
    client = {name: round(_child_cpu([command[0], *extra, *command[1:]], reps, stdin=subprocess.DEVNULL), 4)
              for name, extra in (("default_kex", []), ("curve25519_kex", ["-o", "KexAlgorithms=curve25519-sha256"]))}
    return {"host": host, "reads": {k: len(v) for k, v in parts.items()}, "remote_script_cpu_s": script,
            "shell_command_cpu_s": dict(sorted(shell_each.items(), key=lambda kv: -kv[1])),
            "ssh_true_client_cpu_s": client}  # fmt: skip


def _child_cpu(argv: list, reps: int, **run) -> float:
    """Median CPU (user + sys, seconds) of ``argv`` run here ``reps`` times, its children included."""
    runs = []
    for _ in range(reps):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        subprocess.run(argv, check=True, **run)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        runs.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return statistics.median(runs)


def floor(rack, parts: dict, fan_out_hosts_cpu: float, reps: int = 9) -> dict:
    """A lower bound on the audit's wall time here, from CPU alone: what the bare fan-out
    spends (the ssh clients here, and the hosts' sshd), plus what any audit that reads
    the hosts' facts through pyinfra's fact classes, with one python3 per host, spends
    before it reads a single fact: this machine's python3 starting as the audit's does
    (its site included), ``import pyinfra.api`` as the audit imports it (pyinfra's facts,
    inventory loader and ``make_unix_command`` each import all of it), each host's ``python3 -I -S`` starting,
    and each host's two nvidia-smi queries (the real one refuses two --query-* in one
    call). The hosts and this machine share its cores, so the bound is that CPU over the
    cores, with no core ever idle: no llamarack code, no fact read, nothing printed."""
    start = _child_cpu([sys.executable, "-c", "pass"], reps, cwd=ROOT, env=ENV)
    # as the audit imports it: the collector off (llamarack.cli.audit), invoke refused
    # (llamarack.openssh._without_invoke)
    importing = "import gc, sys; gc.disable(); sys.modules['invoke'] = None; import pyinfra.api"
    pyinfra_api = _child_cpu([sys.executable, "-c", importing], reps, cwd=ROOT, env=ENV) - start
    host_python = _bash_cpu(rack, parts["host"], {"python3": "python3 -I -S -c pass"}, reps)["python3"]
    n, cores = len(rack.hosts), os.cpu_count() or 1
    clients = parts["ssh_true_client_cpu_s"]["default_kex"] * n
    smi = parts["remote_script_cpu_s"]["nvidia_smi"]
    cpu = {"ssh_clients": clients, "hosts_sshd": fan_out_hosts_cpu, "audit_python_start": start,
           "import_pyinfra_api": pyinfra_api, "hosts_python3_start": host_python * n, "hosts_nvidia_smi": smi * n}
    total = sum(cpu.values())
    return {"cpu_s": {k: round(v, 3) for k, v in cpu.items()}, "total_cpu_s": round(total, 3), "cores": cores,
            "audit_s_at_least": round(total / cores, 3),
            "fan_out_s_at_least": round((clients + fan_out_hosts_cpu) / cores, 3)}  # fmt: skip


def _lab_cpu() -> float:
    """CPU seconds the lab's hosts have used (their cgroup), 0.0 where it cannot be read."""
    for base in ("/sys/fs/cgroup/unified", "/sys/fs/cgroup"):
        try:
            with open(f"{base}/llamarack-lab/cpu.stat") as f:
                return int(next(line.split()[1] for line in f if line.startswith("usage_usec"))) / 1e6
        except (OSError, StopIteration):
            continue
    return 0.0


def _measured(fn, *args):
    """(fn's result, CPU seconds the lab hosts used meanwhile)."""
    before = _lab_cpu()
    result = fn(*args)
    return result, _lab_cpu() - before


def converge(inventory: Path) -> None:
    for _ in range(2):
        r = subprocess.run([*pyinfra_command(), "-y", str(inventory), str(ROOT / "deploy.py")], cwd=ROOT, env=ENV,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=3600)  # fmt: skip
        if r.returncode != 0:
            raise SystemExit(f"deploy failed (rc {r.returncode}):\n{r.stdout[-4000:]}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--reuse", action="store_true", help="use the rack that is up (converged)")
    ap.add_argument("--hosts", type=int, default=4, help="hosts in a rack brought up here (default 4)")
    ap.add_argument("--batch", type=int, default=0,
                    help="first deploy N hosts at a time and hardlink their identical files, as "
                         "bench/converged_bench.py does (16 hosts fit the lab's 20G tmpfs only so, and "
                         "only 2 at a time: with 4 the last batch had 350 MB left for a 1 GB model)")
    args = ap.parse_args()
    rack = rackmod.load()
    if rack is not None and not args.reuse:
        raise SystemExit("a lab rack is up: run 'llamarack lab down' first, or pass --reuse")
    brought_up = rack is None
    rack = rack or rackmod.up(n=args.hosts)
    inventory = ROOT / "inventory/lab.py" if len(rack.hosts) == 4 else rack.inventory_path
    try:
        if brought_up:
            if args.batch:
                import converged_bench

                subprocess.run(["mount", "-o", "remount,size=20G", "/run/llamarack-lab"], check=True)
                converged_bench.inventory = inventory
                converged_bench.deploy_in_batches(rack, args.batch)
            converge(inventory)
        hosts = [h.name for h in rack.hosts]
        # Bytecode as an installed package has it (pip compiles on install; PYTHONDONTWRITEBYTECODE
        # would otherwise have every run compile this checkout's modules again).
        subprocess.run([sys.executable, "-m", "compileall", "-q", "llamarack", "roles", "inventory"], cwd=ROOT,
                       check=True, stdout=subprocess.DEVNULL)  # fmt: skip
        audit(inventory)  # warm this machine's page cache, as any second run finds it
        ssh_fan_out(rack)
        load_before = os.getloadavg()
        audits, cpus, splits, fan_outs, hosts_cpu, fan_out_hosts_cpu = [], [], [], [], [], []
        for _ in range(args.reps):
            fan_out, used = _measured(ssh_fan_out, rack)
            fan_outs.append(fan_out)
            fan_out_hosts_cpu.append(used)
            (wall, cpu, report, stderr), used = _measured(audit, inventory)
            assert all(v["reachable"] and not v["drift"] for v in report["hosts"].values()), report
            audits.append(wall)
            cpus.append(cpu)
            splits.append(_split_cpu(stderr))
            hosts_cpu.append(used)
        load_after = os.getloadavg()
        work = count_remote_work(audit(inventory, "--debug")[3], hosts)
        reads = audit_reads_by_host(inventory)
        script_cpu = remote_script_cpu(rack, reads)
        parts = where_the_cpu_goes(rack, reads)
        bound = floor(rack, parts, statistics.median(fan_out_hosts_cpu))
    finally:
        if brought_up:
            rackmod.down()
    median_audit, median_ssh = statistics.median(audits), statistics.median(fan_outs)
    result = {
        "date": datetime.date.today().isoformat(),
        "machine": {"cpu": _cpu(), "cores": os.cpu_count(), "python": platform.python_version(),
                    "pyinfra": _pyinfra_version(), "openssh": _openssh_version()},  # fmt: skip
        "hosts": len(hosts),
        "reps": args.reps,
        "bytecode": "compiled first (python3 -m compileall), as an installed package has it",
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in load_after],
        "audit_s": {"median": round(median_audit, 3), "runs": [round(t, 3) for t in audits]},
        "ssh_true_fan_out_s": {"median": round(median_ssh, 3), "runs": [round(t, 3) for t in fan_outs]},
        "audit_over_ssh_fan_out": round(median_audit / median_ssh, 2),
        "audit_control_cpu_s": {"median": round(statistics.median(cpus), 3),
                                "python_median": round(statistics.median(p for p, _ in splits), 3),
                                "ssh_children_median": round(statistics.median(k for _, k in splits), 3)},
        # The lab's hosts share this machine's cores: what they spent (sshd, the script) counts too.
        "hosts_cpu_s": {"audit_median": round(statistics.median(hosts_cpu), 3),
                        "ssh_true_fan_out_median": round(statistics.median(fan_out_hosts_cpu), 3)},
        "audit_remote_commands_per_host": {h: v["remote_commands"] for h, v in work.items()},
        "remote_script_cpu_s": script_cpu,
        "where_the_cpu_goes": parts,
        "floor": bound,
    }
    name = "audit.json" if len(hosts) == 4 else f"audit-{len(hosts)}hosts.json"
    path = ROOT / "bench/results" / name
    # one current result: earlier runs live in git's history of this file
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return 0


def _openssh_version() -> str:
    return subprocess.run(["ssh", "-V"], capture_output=True, text=True).stderr.strip()


if __name__ == "__main__":
    sys.exit(main())

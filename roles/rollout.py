"""``llamarack rollout``: a change rolled through the rack host by host, while the gateway
answers. docs/rollout.md says the stage, the order, each host's states (pending, staging,
staged, draining, deploying, gated, done, failed), the gate and --resume.

Llamarack's own deploy is staged first: every host not done yet runs ``roles.deploy.stage``
(its build and model made beside what it serves, and proven), all at once and none drained;
only a staged host is drained, so its drained window holds the switch, the gate and the
undrain, not a build or a conversion.

Each move is written to the host's ``<root>/state/rollout.json`` (the audit's ``rollout``
item) and to ``journal_path`` in the working folder. The deploy runs as ``pyinfra -y
INVENTORY DEPLOY --limit HOST [--data K=V]``, a subprocess: the operator's own command, and
a fresh pyinfra State per host (pyinfra's API has no public way to run a deploy file, and a
State runs its operations once). Every other step is one command through the host's own
pyinfra connector (``hosts.run_one``): no SSH of its own.
"""

from __future__ import annotations

from llamarack import hosts as hostsmod  # noqa: I001  (first: pyinfra's gevent patching)

import atexit
import collections
import datetime
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Optional

import gevent

from llamarack import remote, upgrade
from llamarack.layout import API_KEY_PATH, unit_path
from llamarack.ship import SHIP_DIR_ENV

from . import audit
from .gateway.plan import server_name
from .server.files import bench_record
from .server.files.server_idle import UNIT_NAME
from .server.plan import process_drift
from .server.reads import HEALTH_MARK, RESIDENCY_MARK, ServedUnits
from .settings import settings_for

SCHEMA = "llamarack-rollout/1"
GATEWAYS = "gateways"
RECORD = "rollout.json"
COMMAND_TIMEOUT = 120  # a command's own work, beside the waits it is given
# The folder that holds this llamarack's packages (a checkout, or the site-packages of a wheel).
PACKAGES = Path(__file__).resolve().parent.parent
DEPLOY = "roles.deploy.main"  # the deploy that ships with llamarack (roles/deploy.py)
STAGE = "roles.deploy.stage"  # its making roles alone: what a rollout of it stages first
# The host record: written beside, then renamed over (a reader sees a whole record).
WRITE_RECORD = 'mkdir -p "$1" && printf "%s\\n" "$2" > "$1/$3.new" && mv -f "$1/$3.new" "$1/$3"'


class StepFailed(Exception):
    pass


@dataclass(frozen=True)
class Options:
    """How the rollout goes (the command's options; ``completion_tokens``: the gate's n_predict)."""

    canary: Optional[str] = None
    batch: int = 1
    max_fail: int = 1
    idle_timeout: float = 600.0  # each wait of a drained host: its streams on the gateways, then its units
    bench_fraction: float = 0.25
    completion_tokens: int = 4
    stage: bool = True  # llamarack's own deploy: stage every host before any is drained

    def __post_init__(self):
        if self.batch < 1 or self.max_fail < 1 or not 0 <= self.bench_fraction <= 1:
            raise ValueError(f"batch and max_fail at least 1, bench_fraction within 0..1: {self}")


def stages(deploy: str) -> bool:
    """Whether a rollout of ``deploy`` can stage first: llamarack's own deploy (``DEPLOY``, or
    the checkout's ``deploy.py``, which runs it), whose making roles ``STAGE`` runs alone.
    Another deploy's work is its own: it is done inside each host's drained window."""
    return deploy == DEPLOY or Path(deploy).resolve() == PACKAGES / "deploy.py"


def stage_line(options: Options, deploy: str) -> str:
    """Whether the rollout stages, and why not, in a line."""
    if options.stage and stages(deploy):
        return f"stage: every host not done yet, all at once, none drained ({STAGE}), then the order below"
    why = "--no-stage" if not options.stage else f"{deploy} is not llamarack's deploy ({DEPLOY})"
    return f"no stage ({why}): each host makes its change inside its drained window"


def batches(serving: list, canary: Optional[str], size: int) -> list:
    """The canary alone, then the other serving hosts in batches of ``size``, in order."""
    if not serving:
        raise ValueError("no serving host: every host of the inventory is a gateway")
    if canary is not None and canary not in serving:
        raise ValueError(f"--canary: {canary} is no serving host of the inventory (gateways are not rolled)")
    first = canary or serving[0]
    rest = [n for n in serving if n != first]
    return [[first]] + [rest[i:i + size] for i in range(0, len(rest), max(1, size))]


# What says why a deploy failed in its output: a command's own error (apt's "E:", DKMS's
# "Error!", a script's "error:"), pyinfra's per-host "Error:"; not pyinfra's closing lines.
_ERROR_LINE = re.compile(r"(^|\s)(E:|Error!|Error:|error:|Traceback)")
_NOT_WHY = re.compile(r"Error: executed \d+ commands|pyinfra error: No hosts remaining")


def deploy_errors(tail: list, most: int = 3) -> list:
    """The last ``most`` lines of a failed deploy's output that say why, else its last lines."""
    lines = [ln.strip() for ln in tail if ln.strip()]
    why = [ln for ln in lines if _ERROR_LINE.search(ln) and not _NOT_WHY.search(ln)]
    return (why or lines)[-most:]


def bench_verdict(before: Optional[dict], after: Optional[dict], fraction: float) -> tuple:
    """(why the new figures fail, or None; what was compared), from ``state/bench.json``
    before and after the deploy: only a record of a new build or model is compared, unit by
    unit (each unit llama-bench measured, against the same unit's figures before; a record
    from before units were listed has one figure for every unit)."""
    key = (after or {}).get("key")
    if not after or key == (before or {}).get("key"):
        return None, "no new llama-bench record (no new build or model measured)"
    if not before:
        return None, f"llama-bench measured {key}: no record before it to compare with"
    units = [u for u in bench_record.entries(after) if "as" not in u]
    compared, slower = [], []
    for unit in units:
        name = unit.get("name")
        was = bench_record.of_unit(before, name) if name else before
        said = f"{name}: " if len(units) > 1 else ""
        for test in ("pp512", "tg128"):
            old = ((was or {}).get(test) or {}).get("tokens_per_second")
            new = (unit.get(test) or {}).get("tokens_per_second")
            if not old:
                continue
            compared.append(f"{said}{test} {new} t/s (was {old})")
            if not new or new < (1 - fraction) * old:
                slower.append(f"{said}llama-bench {test} {new} t/s is below {1 - fraction:.2f} of the record's "
                              f"{old} t/s")  # fmt: skip
    return ("; ".join(slower) or None), ", ".join(compared) or "the record before has no figures"


def marked(lines: list, mark: str) -> str:
    """The value of a unit's comment line ``mark...`` (its health URL, its residency), or ''."""
    return next((line[len(mark):].strip() for line in lines if line.startswith(mark)), "")


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def seconds_between(start: str, end: str) -> int:
    return int((datetime.datetime.fromisoformat(end) - datetime.datetime.fromisoformat(start)).total_seconds())


def journal_path(inventory: str) -> Path:
    """Where the rollout of ``inventory`` is recorded for --resume (in the working folder)."""
    stem = re.sub(r"[^A-Za-z0-9_.-]", "_", Path(inventory).stem) or "inventory"
    return Path(".llamarack") / f"rollout-{stem}.json"


@dataclass
class Journal:
    """The rollout's local record (``journal_path``): what --resume goes on from."""

    path: Path
    data: dict = field(default_factory=dict)

    @classmethod
    def new(cls, path: Path, inventory: str, deploy: str, data: tuple, options: Options, order: list) -> "Journal":
        journal = cls(path, {"schema": SCHEMA, "inventory": inventory, "deploy": deploy, "data": list(data),
                             "options": asdict(options), "order": order, "started": now(),
                             "hosts": {n: {"state": "pending", "why": None, "at": None, "staged": False}
                                       for b in order for n in b}})  # fmt: skip
        journal.save()
        return journal

    @classmethod
    def load(cls, path: Path) -> Optional["Journal"]:
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            return None
        if data.get("schema") != SCHEMA:
            raise ValueError(f"{path} is not a rollout record ({SCHEMA})")
        return cls(path, data)

    def state(self, name: str) -> str:
        return self.data["hosts"][name]["state"]

    def staged(self, name: str) -> bool:
        """Whether ``name``'s stage succeeded in this rollout (a record without the key: no)."""
        return bool(self.data["hosts"][name].get("staged"))

    def unfinished(self) -> bool:
        return {h["state"] for h in self.data["hosts"].values()} not in ({"done"}, {"pending"})

    def move(self, name: str, state: str, why: Optional[str] = None) -> None:
        """Record ``name``'s new state; whether it was staged stays, and from draining to done
        the seconds it was drained (``drained_s``)."""
        entry, at = self.data["hosts"][name], now()
        entry.update(state=state, why=why, at=at, staged=self.staged(name) or state == "staged")
        if state == "draining":
            entry["drained_at"], entry["drained_s"] = at, None
        elif state == "done" and entry.get("drained_at"):
            entry["drained_s"] = seconds_between(entry["drained_at"], at)
        self.save()

    def drained(self) -> dict:
        """{host: the seconds it was drained} of the hosts this rollout took from drained to done."""
        return {n: h["drained_s"] for n, h in self.data["hosts"].items() if h.get("drained_s") is not None}

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        new = self.path.with_name(self.path.name + ".new")
        new.write_text(json.dumps(self.data, indent=1) + "\n")
        os.replace(new, self.path)


@dataclass(frozen=True)
class HostPlan:
    """What the rollout needs of a serving host's settings."""

    state_dir: str
    units_json: str
    bench: str
    port: int
    listen: str
    key_file: str
    health_timeout: int

    @classmethod
    def of(cls, host) -> "HostPlan":
        s = settings_for(host)
        return cls(s.layout.state, s.layout.state_file("units.json"), s.layout.bench_record, s.server.port,
                   s.server.listen, API_KEY_PATH if s.server.api_key_file else "", s.server.health_timeout)


def pyinfra_argv(inventory: str, deploy_file: str, *args: str) -> list:
    """``pyinfra -y INVENTORY DEPLOY ARGS...`` as this machine runs pyinfra."""
    exe = shutil.which("pyinfra")
    return [*([exe] if exe else [sys.executable, "-m", "pyinfra"]), "-y", inventory, deploy_file, *args]


def package_env() -> dict:
    """The environment of a deploy this command runs: the deploy imports the llamarack this
    command runs from (its checkout, or its wheel), not another install."""
    return dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(PACKAGES), os.environ.get("PYTHONPATH")])))


class Pyinfra:
    """The rollout's one boundary with the hosts (tests put a fake in its place): a shell
    command through a host's own pyinfra connector, and the deploy on one host through
    pyinfra's CLI, its output passed on as it comes."""

    def __init__(self, inventory: str, deploy_file: str, data: tuple, echo: Callable = print):
        self.inventory, self.deploy_file, self.data, self.echo = inventory, deploy_file, tuple(data), echo
        self._builds_dir: Optional[str] = None

    def builds_dir(self) -> str:
        """The directory the stage's runs share builds through (``ship.SHIP_DIR_ENV``): one
        compile per build across them. Private to this command, removed when it ends."""
        if self._builds_dir is None:
            self._builds_dir = tempfile.mkdtemp(prefix="llamarack-rollout-builds-")
            atexit.register(shutil.rmtree, self._builds_dir, True)
        return self._builds_dir

    def run(self, host, command: str, timeout: float):
        return hostsmod.run_one(host, command, int(timeout))

    def deploy(self, name: str, deploy_file: Optional[str] = None) -> tuple:
        """(exit status, the output's last lines) of the deploy (``deploy_file``, else the
        rollout's) limited to host ``name``. Another deploy (the stage, which runs on every
        host at once) has its lines marked with the host's name."""
        args = pyinfra_argv(self.inventory, deploy_file or self.deploy_file, "--limit", name,
                            *[w for item in self.data for w in ("--data", item)])  # fmt: skip
        # the stage's runs (one per host, all at once) make each build once between them
        env = package_env() | ({SHIP_DIR_ENV: self.builds_dir()} if deploy_file else {})
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        tail = collections.deque(maxlen=60)  # enough to hold the error of the command that failed
        mark = f"{name} (stage) | " if deploy_file else ""
        for line in proc.stdout:
            self.echo(mark + line.rstrip("\n"))
            tail.append(line.rstrip("\n"))
        return proc.wait(), list(tail)


class Rollout:
    """One rollout: the serving hosts (``chosen``: {name: pyinfra Host}) moved batch by batch
    (``journal``'s order), drained and undrained on ``gateways``, through ``boundary``."""

    def __init__(self, boundary, chosen: dict, gateways: list, journal: Journal, options: Options,
                 echo: Callable = print, stage: Optional[str] = None):  # fmt: skip
        self.boundary, self.hosts, self.gateways = boundary, chosen, gateways
        self.journal, self.options, self.echo = journal, options, echo
        self.started = journal.data.get("started") or now()
        self.stage_deploy = stage  # the deploy that stages each host first; None: no stage

    def run(self) -> int:
        """Stage every host not done yet (``stage``), then roll every batch not done yet, its
        hosts staged; stop after a failed canary or ``max_fail`` failures, a failed stage
        included. The number of failed hosts."""
        order = self.journal.data["order"]
        unstaged = self.stage()
        failed = list(unstaged)
        stop = bool(failed) and (order[0][0] in failed or len(failed) >= self.options.max_fail)
        for number, batch in enumerate(order):
            if stop:
                break
            todo = [n for n in batch if self.journal.state(n) != "done" and n not in unstaged]
            if not todo:
                continue
            gevent.joinall([gevent.spawn(self.roll, name) for name in todo])
            failed += [n for n in todo if self.journal.state(n) == "failed"]
            stop = bool(failed) and ((number == 0 and failed[-1] in batch) or len(failed) >= self.options.max_fail)
        if not stop:
            drained = ", ".join(f"{n} {s} s" for n, s in self.journal.drained().items())
            self.echo(f"rollout done{': ' + self.failures(failed, unstaged) if failed else ''}"
                      + (f" (drained: {drained})" if drained else ""))  # fmt: skip
            return len(failed)
        left = [n for b in order for n in b if self.journal.state(n) in ("pending", "staged")]
        self.echo(f"rollout stopped: {self.failures(failed, unstaged)}; untouched: {', '.join(left) or 'none'}; "
                  "go on with --resume")  # fmt: skip
        return len(failed)

    @staticmethod
    def failures(failed: list, unstaged: list) -> str:
        drained = [n for n in failed if n not in unstaged]
        return "; ".join(filter(None, [drained and f"{', '.join(drained)} failed (left drained)",
                                       unstaged and f"{', '.join(unstaged)} failed to stage (serving on, "
                                                    "not drained)"]))  # fmt: skip

    def stage(self) -> list:
        """Run the stage deploy on every host not done and not staged yet, all at once and none
        drained; the hosts whose stage failed (each left serving what it served)."""
        todo = [n for b in self.journal.data["order"] for n in b
                if self.journal.state(n) != "done" and not self.journal.staged(n)]  # fmt: skip
        if not self.stage_deploy or not todo:
            return []
        self.echo(f"stage: {', '.join(todo)}, all at once, none drained: each makes its build and model beside "
                  "what it serves, and proves them")  # fmt: skip
        gevent.joinall([gevent.spawn(self.stage_one, name) for name in todo])
        return [n for n in todo if not self.journal.staged(n)]

    def stage_one(self, name: str) -> None:
        host = self.hosts[name]
        try:
            plan = HostPlan.of(host)
            self.move(host, plan, "staging")
            status, tail = self.boundary.deploy(name, self.stage_deploy)
            if status != 0:
                raise StepFailed(f"its stage exited {status}, nothing drained: " + " / ".join(deploy_errors(tail)))
            self.move(host, plan, "staged")
        except Exception as e:  # as roll's: this host fails, the others go on
            self.move(host, None, "failed", str(e) if isinstance(e, StepFailed) else f"{type(e).__name__}: {e}")

    def roll(self, name: str) -> None:
        host = self.hosts[name]
        try:
            self.steps(host, HostPlan.of(host))
        except Exception as e:  # StepFailed says why; anything else: this host fails, the others go on
            self.move(host, None, "failed", str(e) if isinstance(e, StepFailed) else f"{type(e).__name__}: {e}")

    def steps(self, host, plan: HostPlan) -> None:
        units = self.units(host, plan)
        self.move(host, plan, "draining")
        self.on_gateways("drain", host, units, "drain", "wait-empty", self.options.idle_timeout)
        self.command(host, remote.command("server_idle", "idle", plan.units_json, str(plan.port), plan.listen,
                                          str(self.options.idle_timeout), plan.key_file),
                     self.options.idle_timeout, "wait idle")  # fmt: skip
        before = self.read_json(host, plan.bench)
        self.move(host, plan, "deploying")
        status, tail = self.boundary.deploy(host.name)
        if status != 0:
            raise StepFailed(f"the deploy exited {status}: " + " / ".join(deploy_errors(tail)))
        units = self.units(host, plan)
        notes = self.gate(host, plan, units, before)
        self.move(host, plan, "gated", notes)
        self.on_gateways("undrain", host, units, "ready", "wait-up", plan.health_timeout)
        self.move(host, plan, "done")

    def gate(self, host, plan: HostPlan, units: list, before: Optional[dict]) -> str:
        """Fail unless every unit answers /health from its cards and gives a completion, and a
        new llama-bench record is within the fraction of the one before; what was checked."""
        wait, resident = plan.health_timeout, 0
        for unit in units:
            lines = self.read(host, unit_path(unit["unit"])) or []
            url = marked(lines, HEALTH_MARK) or unit["url"] + "/health"
            cards = marked(lines, RESIDENCY_MARK)  # none on a CPU build: nothing to be resident on
            resident += bool(cards)
            self.command(host, remote.command("wait_healthy", url, unit["unit"], str(wait), ""), wait,
                         f"{unit['unit']}: /health")  # fmt: skip
            self.command(host, remote.command("completion_probe", unit["url"], str(self.options.completion_tokens),
                                              str(wait), plan.key_file), wait, f"{unit['unit']}: a completion")
            if cards:  # after the completion, which wakes a unit asleep (--sleep-idle-seconds): on its cards
                self.command(host, remote.command("wait_healthy", url, unit["unit"], str(wait), cards), wait,
                             f"{unit['unit']}: residency")  # fmt: skip
        self.provenance(host, plan, units)
        why, compared = bench_verdict(before, self.read_json(host, plan.bench), self.options.bench_fraction)
        if why:
            raise StepFailed(why)
        where = "on their cards" if resident == len(units) else "no residency to check (a CPU build)"
        return f"{len(units)} unit(s) healthy, {where}, completing; {compared}"

    def provenance(self, host, plan: HostPlan, units: list) -> None:
        """Fail unless each unit's process, by its own /props, serves the model and runs the build
        its unit file names (``process_drift``): a deploy that switched files without a restart."""
        reply = self.command(host, ServedUnits().command(plan.state_dir, health=True), 0, "read its units")
        try:
            found = ServedUnits().process(reply.output)
        except Exception as e:  # the host's answer is data: unreadable is a failed gate, not a traceback
            raise StepFailed(f"its units are unreadable: {e}")
        for unit in units:
            why = process_drift(found.get(unit["unit"]))
            if why:
                raise StepFailed(f"{unit['unit']}: {why}")

    def units(self, host, plan: HostPlan) -> list:
        reply = self.command(host, remote.command("server_idle", "units", plan.units_json, str(plan.port),
                                                  plan.listen), 0, "list its units")  # fmt: skip
        try:
            listed = json.loads(reply.output[-1])["units"]
        except (ValueError, KeyError, IndexError, TypeError):
            raise StepFailed(f"its units are unreadable: {reply.output[-1:]}")
        if not listed or not all(UNIT_NAME.fullmatch(str(u.get("unit"))) for u in listed):
            raise StepFailed(f"no llamarack unit listed: {listed}")
        return listed

    def on_gateways(self, step: str, host, units: list, state: str, wait: str, timeout: float) -> None:
        """Set the servers of ``host``'s ``units`` to ``state``, then ``wait`` within ``timeout`` for
        them: ``haproxy_runtime.py`` on every gateway, side by side."""
        names = [server_name(host.name, u["index"]) for u in units]
        for args, limit in ((("set", state), 0), ((wait, str(timeout)), timeout)):
            jobs = [gevent.spawn(self.boundary.run, gw, remote.command("haproxy_runtime", *args, *names),
                                 limit + COMMAND_TIMEOUT) for gw in self.gateways]  # fmt: skip
            gevent.joinall(jobs)
            replies = [job.value or hostsmod.Reply(gw.name, error=repr(job.exception))
                       for gw, job in zip(self.gateways, jobs)]  # fmt: skip
            failed = [f"{r.name}: {why_of(r)}" for r in replies if not r.ok]
            if failed:
                raise StepFailed(f"{step} on the gateway: " + "; ".join(failed))

    def command(self, host, command: str, timeout: float, what: str):
        reply = self.boundary.run(host, command, timeout + COMMAND_TIMEOUT)
        if not reply.ok:
            raise StepFailed(f"{what}: {why_of(reply)}")
        return reply

    def read(self, host, path: str) -> Optional[list]:
        """A file's lines on ``host``; None when it has none (an unreachable host fails)."""
        reply = self.boundary.run(host, remote.argv("cat", path), COMMAND_TIMEOUT)
        if not reply.reachable:
            raise StepFailed(f"read {path}: {reply.error}")
        return reply.output if reply.ok else None

    def read_json(self, host, path: str) -> Optional[dict]:
        lines = self.read(host, path)
        try:
            return json.loads("\n".join(lines)) if lines else None
        except ValueError:
            return None

    def move(self, host, plan: Optional[HostPlan], state: str, why: Optional[str] = None) -> None:
        """Record ``host``'s new state: printed, in the local journal, and in the host's
        ``state/rollout.json`` (a failed host's, where it can still be written)."""
        self.journal.move(host.name, state, why)
        self.echo(f"{now()} {host.name}: {state}" + (f" ({why})" if why else ""))
        record = json.dumps({"schema": SCHEMA, "state": state, "why": why, "at": now(), "started": self.started},
                            sort_keys=True)  # fmt: skip
        try:
            plan = plan or HostPlan.of(host)
            reply = self.boundary.run(host, remote.argv("sh", "-c", WRITE_RECORD, "sh", plan.state_dir, record,
                                                        RECORD), COMMAND_TIMEOUT)  # fmt: skip
        except Exception as e:  # a failed host's record: as far as it goes
            reply = hostsmod.Reply(host.name, error=f"{type(e).__name__}: {e}")
        if not reply.ok and state != "failed":
            raise StepFailed(f"write {RECORD}: {why_of(reply)}")


def why_of(reply) -> str:
    """Why a command failed, in a line: the connection's error, or its last words."""
    if reply.error:
        return reply.error
    words = [line for line in (reply.stderr or reply.output) if line.strip()]
    return " / ".join(words[-3:]) or "it failed without a word"


def rack(inventory: str, data: tuple) -> tuple:
    """(serving hosts {name: Host} in inventory order, gateway hosts) of ``inventory``."""
    loaded = hostsmod.load(inventory, (), hostsmod.parse_data(data) or None)
    gateways = [h for h in loaded if GATEWAYS in h.groups]
    return {h.name: h for h in loaded if GATEWAYS not in h.groups}, gateways


def dry_plan(chosen: dict, order: list, templates: tuple = ()) -> str:
    """The order, and what the deploy would do to each host (``plan-upgrade``'s steps from one
    audit read per host, all at once): nothing is changed."""
    audits = {a.name: a for a in audit.run(list(chosen.values()), templates)}
    out = []
    for number, batch in enumerate(order):
        out.append("canary:" if number == 0 else f"batch {number}:")
        out += [f"  {line}" for name in batch for line in upgrade.host_lines(
            audits[name], "refused by preflight (the deploy would fail it)",
            "nothing changes (drained, deployed, gated and undrained all the same)")]
    out += upgrade.made_lines(list(audits.values()))
    return "\n".join(out) + "\n"


@dataclass(frozen=True)
class Request:
    """What the operator asked for (the command line)."""

    inventory: str
    deploy: Optional[str] = None
    data: tuple = ()
    options: Options = Options()
    resume: bool = False
    dry: bool = False
    templates: tuple = ()


def start(request: Request, journal: Optional[Journal], serving: list) -> Journal:
    """The journal to roll from: the one on file (--resume), or a new one. ValueError when
    the request cannot go on (nothing to resume, an unfinished rollout on file)."""
    path = journal_path(request.inventory)
    if request.resume:
        if journal is None:
            raise ValueError(f"--resume: no rollout on file ({path})")
        gone = [n for b in journal.data["order"] for n in b if n not in serving]
        if gone:
            raise ValueError(f"--resume: {', '.join(gone)} no longer serving hosts of the inventory")
        return journal
    if journal is not None and journal.unfinished():
        left = {n: h["state"] for n, h in journal.data["hosts"].items() if h["state"] != "done"}
        raise ValueError(f"an unfinished rollout is on file ({path}: {left}): go on with --resume, "
                         "or remove the file to start again")  # fmt: skip
    order = batches(serving, request.options.canary, request.options.batch)
    deploy = request.deploy or DEPLOY
    return Journal.new(path, request.inventory, deploy, request.data, request.options, order)


def main(request: Request, echo: Callable = print, boundary=None) -> int:
    """Run (or, --dry, show) a rollout. Exit status: 0 every host done, 1 a host failed,
    2 refused before any host was touched."""
    try:
        serving, gateways = rack(request.inventory, request.data)
        if request.dry:
            order = batches(list(serving), request.options.canary, request.options.batch)
            echo(f"gateways: {', '.join(g.name for g in gateways) or 'none (nothing to drain)'}")
            echo(stage_line(request.options, request.deploy or DEPLOY))
            echo(dry_plan(serving, order, request.templates).rstrip("\n"))
            return 0
        journal = start(request, Journal.load(journal_path(request.inventory)), list(serving))
    except ValueError as e:
        echo(f"rollout refused: {e}")
        return 2
    data, options = journal.data, Options(**journal.data["options"])
    if request.resume:
        echo(f"resuming the rollout of {data['started']} from {journal.path} (its order, options, deploy and data)")
        if data["data"] != list(request.data):  # the hosts were loaded with the request's own data
            serving, gateways = rack(request.inventory, tuple(data["data"]))
    if not gateways:
        echo(f"no host in group {GATEWAYS}: nothing to drain; each host is still waited idle, deployed and gated")
    echo("order: " + " | ".join(", ".join(b) for b in data["order"]))
    boundary = boundary or Pyinfra(request.inventory, data["deploy"], tuple(data["data"]), echo)
    stage = STAGE if options.stage and stages(data["deploy"]) else None
    echo(stage_line(options, data["deploy"]))
    failed = Rollout(boundary, serving, gateways, journal, options, echo, stage).run()
    return 1 if failed else 0

"""``llamarack audit``: what each host runs, against what its settings would deploy.

One remote command per host (``FactsTogether`` of every fact below, run
through the host's own pyinfra connector: ``llamarack/hosts.py``), hosts in
parallel, nothing changed. The wanted side is computed by the same
settings loader and planners the deploy uses (the build stamp, the env
pins, the model record, the unit text), so "no drift" means "a deploy now
would change nothing" (but for writing a missing GGUF shape record, the
header's reading kept beside the file: it changes nothing that serves, and
``GgufShape`` reads the header without it).

The JSON (``--json``) is one object, schema ``llamarack-audit/1``:

    {"schema": "llamarack-audit/1",
     "hosts": {NAME: {"reachable": bool, "error": str | null,
                      "drift": [ITEM, ...],
                      "items": {ITEM: {"found": ..., "wanted": ..., "drift": bool}}}}}

ITEM is one of ``ITEMS``; ``wanted`` is null where the settings ask
nothing of the item (the GPUs, the free disk). Exit status: 0 no drift, 1
drift on some host, 2 a host unreachable or its facts unreadable.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from typing import Any, Optional

from pyinfra.facts.files import FileContents, Link, Sha1File, Sha256File
from pyinfra.facts.server import LinuxDistribution

from llamarack.roles.llamacpp.reads import BenchRecord, BuildRecord, BuildSeals, LlamacppBuilds, LlamaServerFlags
from llamarack.roles.driver.reads import CharDevices, GpuProcesses
from .facts import FactRead, FreeDiskBytes
from llamarack.roles.model.reads import GgufShape, ModelArtifact
from llamarack.roles.server.reads import HttpStatus, UnitState, active_since
from llamarack.roles.python_env.reads import PythonEnvPackages, RequirementsFile
from .facts.reading import FactsTogether
from .layout import UNIT_NAME, UNIT_PATH
from .roles.llamacpp.plan import plan_for_host, same_build
from .roles.model.plan import plan_from_record
from .roles.preflight.reads import gather, preflight_reads
from .roles.python_env.plan import awq_plan, converter_plan, unmet
from .roles.server.plan import PlanError, health_url, parse_pin, wanted_unit
from .roles.toolchain.plan import plan_toolchain
from .rules import build_archs, driver_warnings, evaluate
from .settings import Settings, settings_for

SCHEMA = "llamarack-audit/1"
ITEMS = ("gpus", "rules", "driver", "toolchain", "awq_env", "converter_env", "build", "model", "unit",
         "service", "health", "gpu_processes", "disk", "bench")  # fmt: skip
ENV_PACKAGES = ("torch", "transformers", "accelerate", "autoawq", "numpy")
SCRIPT_TIMEOUT_S = 120  # the connection and the whole script of one host


def audit_reads(settings: Settings, verify: bool = False) -> tuple[FactRead, ...]:
    """Everything the audit looks at on a host, and nothing else: what the rules read
    (``gather``), the deploy's facts that the wanted side is planned from, and what the
    audit only reports (build record and seals, unit text and state, the rollback pin,
    /health, GPU processes, disk). ``verify``: also the sha256 of every sealed file of
    the current build and of the served model.gguf (``verify_reads``)."""
    layout, root = settings.layout, settings.general.root
    rules = tuple(r for r in preflight_reads(settings) if r.fact is not LinuxDistribution)  # preflight's own OS check
    return tuple(dict.fromkeys(rules + verify_reads(settings, verify) + (
        FactRead.of(PythonEnvPackages, env=layout.env("awq")),
        FactRead.of(PythonEnvPackages, env=layout.env("convert")),
        FactRead.of(RequirementsFile, path=layout.converter_requirements),
        FactRead.of(LlamacppBuilds, root=root),
        FactRead.of(BuildSeals, root=root),
        FactRead.of(Sha1File, path=UNIT_PATH),
        FactRead.of(FileContents, path=layout.rollback_pin),
        FactRead.of(BuildRecord, root=root),
        FactRead.of(ModelArtifact, path=layout.current_model),
        FactRead.of(Link, path=layout.current_build),
        FactRead.of(Link, path=layout.current_model),
        FactRead.of(LlamaServerFlags, root=root),
        FactRead.of(GgufShape, path=f"{layout.current_model}/model.gguf"),
        FactRead.of(FileContents, path=UNIT_PATH),
        FactRead.of(UnitState, unit=UNIT_NAME),
        FactRead.of(HttpStatus, url=health_url(settings)),
        FactRead.of(GpuProcesses),
        FactRead.of(FreeDiskBytes, path=root),
        FactRead.of(BenchRecord, path=layout.bench_record),
    ) + ((FactRead.of(Link, path=layout.draft_model), FactRead.of(GgufShape, path=f"{layout.draft_model}/model.gguf"))
         if settings.model.draft_repo else ())))  # the draft the unit names


def verify_reads(settings: Settings, verify: bool) -> tuple[FactRead, ...]:
    """``--verify``: the current build's files hashed against its seal, and the served GGUF."""
    if not verify:
        return ()
    return (FactRead.of(BuildSeals, root=settings.general.root, sha256="current"),
            FactRead.of(Sha256File, path=f"{settings.layout.current_model}/model.gguf"))  # fmt: skip


@dataclass
class Item:
    found: Any
    wanted: Any = None
    drift: bool = False


@dataclass
class HostAudit:
    name: str
    reachable: bool = True
    error: Optional[str] = None
    items: dict = field(default_factory=dict)

    @property
    def drift(self) -> list[str]:
        return [k for k, v in self.items.items() if v.drift]

    def to_json(self) -> dict:
        return {"reachable": self.reachable, "error": self.error, "drift": self.drift,
                "items": {k: {"found": v.found, "wanted": v.wanted, "drift": v.drift} for k, v in self.items.items()}}


class _Answers:
    """The facts one host answered, looked up as the roles read them."""

    def __init__(self, reads: tuple, answers: dict):
        self.values = {r: answers[i].value for i, r in enumerate(reads)
                       if i in answers and answers[i].status == 0 and answers[i].error is None}  # fmt: skip
        self.unreadable = [repr(r) for i, r in enumerate(reads) if r not in self.values]

    def __call__(self, fact: type, **kwargs):
        return self.values.get(FactRead.of(fact, **kwargs))

    def read(self, fact: type, **kwargs):
        """As ``llamarack.facts.read``: an unreadable fact reads as its default."""
        key = FactRead.of(fact, **kwargs)
        return self.values[key] if key in self.values else fact().default()


def audit_host(name: str, settings: Settings, reads: tuple, answers: dict, templates: tuple = (),
               verify: bool = False) -> HostAudit:
    """The audit of one host from the answers to ``audit_reads`` (pure: no host is asked)."""
    fact = _Answers(reads, answers)
    audit = HostAudit(name)
    items = audit.items
    layout, root = settings.layout, settings.general.root
    cuda = settings.llamacpp.backend == "cuda"

    facts = gather(settings, read=fact.read)
    gpus = [{"name": g.name, "memory_mib": g.memory_mib, "compute_cap": g.compute_cap, "uuid": g.uuid}
            for g in facts.gpus]  # fmt: skip
    items["gpus"] = Item(gpus)
    failures = evaluate(settings, facts)
    items["rules"] = Item([f.message(name) for f in failures], [], drift=bool(failures))

    packages = facts.driver_packages
    module = facts.module.version if facts.module else None
    library = facts.driver.driver_version or facts.driver.library_version
    held = all(p.held for p in packages) if packages else None
    items["driver"] = Item(
        {"packages": {p.name: p.version for p in packages}, "held": held, "module": module, "library": library,
         "state": facts.driver.state, "warnings": list(driver_warnings(facts.driver))},
        {"held": settings.driver.hold_packages, "module": "same as the library"},
        drift=bool(packages) and held != settings.driver.hold_packages or bool(module and library and module != library),
    )  # fmt: skip

    if cuda:
        plan = plan_toolchain(settings, facts)
        found = {"toolkits": [t.version for t in facts.toolkits], "gcc": facts.gcc.default}
        wanted = {"toolkit": settings.toolchain.cuda_version,
                  "host_compiler": plan.host_compiler if plan else None}  # fmt: skip
        items["toolchain"] = Item(found, wanted, drift=plan is None or not plan.toolkit_installed)
    else:
        items["toolchain"] = Item({"gcc": facts.gcc.default}, {"backend": "cpu"})

    archs = build_archs(settings, facts) if cuda else ()
    awq_env = fact(PythonEnvPackages, env=layout.env("awq"))
    awq = awq_plan(settings, layout.env("awq"), archs)
    items["awq_env"] = _env_item(awq_env, awq)
    convert_env = fact(PythonEnvPackages, env=layout.env("convert"))
    lines = fact(RequirementsFile, path=layout.converter_requirements)
    convert = converter_plan(settings, layout.env("convert"), lines,
                             convert_env.python_version if convert_env else settings.python_env.python_version) \
        if lines is not None else None  # fmt: skip
    items["converter_env"] = _env_item(convert_env, convert)

    builds, record = fact(LlamacppBuilds, root=root), fact(BuildRecord, root=root)
    wanted_stamp = plan_for_host(settings, facts).stamp
    proof = (record or {}).get("proof") or {}
    current = builds.current if builds else None
    files, files_drift = _build_files(fact(BuildSeals, root=root), current,
                                      fact(BuildSeals, root=root, sha256="current") if verify else None)
    items["build"] = Item(
        {"stamp": current, "commit": (record or {}).get("commit"),
         "cuda_archs": (record or {}).get("cuda_archs"), "smoke": proof.get("variant") if proof else None,
         "smoke_tokens_per_second": proof.get("tokens_per_second"), "files": files},
        {"stamp": wanted_stamp, "commit": settings.llamacpp.commit, "files": "as sealed"},
        drift=not same_build(current, wanted_stamp) or files_drift,
    )  # fmt: skip

    served = fact(ModelArtifact, path=layout.current_model)
    asked = (served.record or {}).get("asked", {}) if served else {}
    matches = served is not None and plan_from_record(settings, served) is not None
    found = {"stamp": served.stamp if served else None, "repo": asked.get("repo"), "revision": asked.get("revision"),
             "quant": asked.get("quant"), "untouched": bool(served and served.untouched)}
    wanted = {"repo": settings.model.repo, "revision": settings.model.revision, "quant": settings.model.quant,
              "untouched": True}
    sha_ok = True
    if verify:
        sealed = (((served.record or {}) if served else {}).get("gguf") or {}).get("sha256")
        found["sha256"] = fact(Sha256File, path=f"{layout.current_model}/model.gguf")
        wanted["sha256"] = sealed
        sha_ok = bool(sealed) and found["sha256"] == sealed
    items["model"] = Item(found, wanted, drift=not matches or not served.untouched or not sha_ok)  # fmt: skip

    unit_lines = fact(FileContents, path=UNIT_PATH)
    unit_text = "\n".join(unit_lines) + "\n" if unit_lines else None
    items["unit"] = _unit_item(settings, fact, facts.gpus, unit_text, templates)

    state = fact(UnitState, unit=UNIT_NAME) or {}
    items["service"] = Item(
        {"active": state.get("ActiveState"), "sub": state.get("SubState"), "pid": int(state.get("MainPID") or 0),
         "since": _iso(active_since(state)), "restarts": int(state.get("NRestarts") or 0)},
        {"active": "active", "sub": "running"},
        drift=(state.get("ActiveState"), state.get("SubState")) != ("active", "running"),
    )  # fmt: skip
    status = fact(HttpStatus, url=health_url(settings))
    items["health"] = Item(status, 200, drift=status != 200)

    processes = fact(GpuProcesses) or ()
    pid = items["service"].found["pid"]
    others = [{"pid": p.pid, "name": p.name, "used_mib": p.used_mib} for p in processes if p.pid != pid]
    # The write-up measures only with nobody else on the card.
    items["gpu_processes"] = Item({"llama_server": [p.used_mib for p in processes if p.pid == pid], "others": others},
                                  {"others": []}, drift=bool(others))  # fmt: skip
    items["disk"] = Item({"free_bytes": fact(FreeDiskBytes, path=root)})
    items["bench"] = bench_item(settings, fact(BenchRecord, path=layout.bench_record),
                                _target(fact(Link, path=layout.current_build)),
                                _target(fact(Link, path=layout.current_model)))  # fmt: skip

    if fact.unreadable:
        audit.error = "unreadable facts: " + ", ".join(fact.unreadable)
    return audit


def _build_files(seals, current: Optional[str], deep) -> tuple[Any, bool]:
    """The current build's files against its seal: ("as sealed" | "not sealed" | what differs,
    drift). ``deep`` (``--verify``): the sha256 of each sealed file as well."""
    if seals is None or current is None:
        return None, False
    if current in seals.unsealed:
        return "not sealed (proven before builds were sealed: the next deploy seals it)", True
    changed = list(seals.changed.get(current) or [])
    if deep is not None:
        if deep.sha256 is None or deep.sha256["name"] != current:
            changed.append("sha256 not read")
        else:
            changed += [c for c in deep.sha256["changed"] if c not in changed]
    return (changed or "as sealed"), bool(changed)


def _env_item(env, plan) -> Item:
    found = {"python": env.python_version, **{p: env.packages.get(p) for p in ENV_PACKAGES if p in env.packages}} \
        if env else None  # fmt: skip
    if plan is None:
        return Item(found, None, drift=env is None)
    problems = unmet(plan, env.packages, env.python_version) if env else ["no env"]
    return Item(found, {"require": list(plan.require), "unmet": problems}, drift=bool(problems))


def _unit_item(settings: Settings, fact: _Answers, gpus: tuple, unit_text: Optional[str], templates: tuple) -> Item:
    layout, root = settings.layout, settings.general.root
    found = {"sha256": hashlib.sha256(unit_text.encode()).hexdigest() if unit_text else None,
             "exec_start": next((line.split("=", 1)[1] for line in (unit_text or "").splitlines()
                                 if line.startswith("ExecStart=")), None)}  # fmt: skip
    build_dir, model_dir = _target(fact(Link, path=layout.current_build)), _target(fact(Link, path=layout.current_model))
    flags = fact(LlamaServerFlags, root=root)
    shape = fact(GgufShape, path=f"{layout.current_model}/model.gguf")
    if not (build_dir and model_dir and flags and shape):
        return Item(found, {"sha256": None, "why": "no current build or model to plan from"}, drift=True)
    draft_dir = _target(fact(Link, path=layout.draft_model)) if settings.model.draft_repo else None
    draft_shape = fact(GgufShape, path=f"{layout.draft_model}/model.gguf") if draft_dir else None
    draft = (f"{layout.models}/{draft_dir}", draft_shape) if draft_shape else None
    devices = tuple(fact(CharDevices)) if settings.llamacpp.backend == "cuda" else ()
    try:
        unit, ctx = wanted_unit(settings, flags, f"{layout.builds}/{build_dir}", f"{layout.models}/{model_dir}",
                                shape, gpus, templates, draft=draft, devices=devices)  # fmt: skip
    except PlanError as e:
        return Item(found, {"sha256": None, "why": e.failure.message("")}, drift=True)
    wanted = {"sha256": hashlib.sha256(unit.encode()).hexdigest(), "ctx_size": ctx.ctx_size}
    # `llamarack rollback` pinned the unit in place: a deploy keeps it while the settings
    # still want the unit it replaced (so it is no drift); a pin it would drop is.
    pin = parse_pin(fact(FileContents, path=layout.rollback_pin))
    held = bool(pin) and pin.get("unit_sha1") == fact(Sha1File, path=UNIT_PATH) and \
        pin.get("replaced_sha1") == hashlib.sha1(unit.encode()).hexdigest()  # fmt: skip
    if pin is not None:
        found["rollback_pin"] = {"held": held, **pin}
    return Item(found, wanted, drift=(found["sha256"] != wanted["sha256"] and not held) or (pin is not None and not held))


def bench_item(settings: Settings, record: Optional[dict], build: Optional[str], model: Optional[str]) -> Item:
    """llama-bench's figures for the build and model served (``state/bench.json``), beside
    the card's roofline; drift when the deploy would measure again (the record names
    another build or model) with ``server_bench`` on."""
    record = record or {}
    roof = record.get("roofline") or {}
    found = {"pp512": (record.get("pp512") or {}).get("tokens_per_second"),
             "tg128": (record.get("tg128") or {}).get("tokens_per_second"),
             "roofline_tg": roof.get("tokens_per_second"), "roofline_fraction": record.get("roofline_fraction"),
             "card": roof.get("card"), "backend": record.get("backend"), "mode": record.get("mode"),
             "measured_at": _iso(record["measured_at"]) if record.get("measured_at") else None,
             "build": (record.get("key") or {}).get("build"), "model": (record.get("key") or {}).get("model")}  # fmt: skip
    if settings.server.bench == "off":
        return Item(found)
    wanted = {"build": build, "model": model}
    return Item(found, wanted, drift=record.get("key") != wanted)


def _iso(unix: Optional[float]) -> Optional[str]:
    import datetime

    return datetime.datetime.fromtimestamp(unix, datetime.timezone.utc).isoformat() if unix is not None else None


def _target(link) -> Optional[str]:
    target = (link or {}).get("link_target")
    return os.path.basename(target.rstrip("/")) if target else None


def run(chosen: list, templates: tuple = (), verify: bool = False) -> list[HostAudit]:
    """Audit each of the pyinfra hosts ``chosen`` (``llamarack.hosts.load``) with one remote
    command, all at once. A host that cannot be reached comes back with ``reachable`` False;
    one whose settings fail, with the error. ``verify``: the sha256 of the served model and
    of every sealed file of the current build."""
    from .hosts import run_each

    audits: dict = {}
    jobs: dict = {}
    scripts: dict = {}
    for host in chosen:
        try:
            settings = settings_for(host)
            reads = audit_reads(settings, verify)
            together = FactsTogether()
            scripts[host] = together.command(reads=reads)
        except Exception as e:  # bad settings: this host only
            audits[host.name] = HostAudit(host.name, error=f"{type(e).__name__}: {e}")
            continue
        jobs[host.name] = (settings, reads, together)

    def answer(reply) -> HostAudit:
        return _audit_answer(reply, *jobs[reply.name], templates, verify)

    # Each answer is read and planned as it comes, while the slower hosts still work.
    for audit in run_each(scripts, SCRIPT_TIMEOUT_S, answer):
        audits[audit.name] = audit
    return [audits[host.name] for host in chosen]


def _audit_answer(reply, settings: Settings, reads: tuple, together: FactsTogether, templates: tuple,
                  verify: bool = False) -> HostAudit:  # fmt: skip
    if not reply.reachable:
        return HostAudit(reply.name, reachable=False, error=reply.error)
    try:
        answers = together.process(reply.output)
        if not answers:  # not one section ran: sudo refused, no sh
            why = reply.stderr[-1] if reply.stderr else "no output"
            return HostAudit(reply.name, error=f"the command failed: {why}")
        return audit_host(reply.name, settings, reads, answers, templates, verify)
    except Exception as e:  # a host whose facts cannot be processed or planned
        return HostAudit(reply.name, error=f"{type(e).__name__}: {e}")


def exit_status(audits: list[HostAudit]) -> int:
    if any(not a.reachable or a.error for a in audits):
        return 2
    return 1 if any(a.drift for a in audits) else 0


def as_json(audits: list[HostAudit]) -> dict:
    return {"schema": SCHEMA, "hosts": {a.name: a.to_json() for a in audits}}


def _brief(value: Any) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k}={_brief(v)}" for k, v in value.items() if v not in (None, [], {}))
    if isinstance(value, list):
        return "; ".join(_brief(v) for v in value) if value else "none"
    if isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value):
        return value[:12]  # a sha256: its head tells two apart
    return str(value)


def as_table(audits: list[HostAudit], colour: bool = False) -> str:
    """One block per host: a summary line, then item, found, wanted, aligned; drifted rows marked."""
    import click

    def paint(text, **style):
        return click.style(text, **style) if colour else text

    out = []
    for a in audits:
        if not a.reachable or (a.error and not a.items):
            out.append(paint(f"{a.name}: FAILED: {a.error}", fg="red", bold=True))
            continue
        drift = a.drift
        summary = f"{a.name}: {'drift in ' + ', '.join(drift) if drift else 'no drift'}"
        out.append(paint(summary, fg="yellow" if drift else "green", bold=True))
        if a.error:
            out.append(paint(f"  {a.error}", fg="red"))
        width = max(len(k) for k in a.items)
        for name, item in a.items.items():
            mark = "!" if item.drift else " "
            found = _brief(item.found)[:90]
            row = f" {mark} {name:<{width}}  {found}"
            if item.wanted not in (None, [], {}) and item.drift:
                row += f"   wanted: {_brief(item.wanted)[:90]}"
            out.append(paint(row, fg="yellow") if item.drift else row)
    return "\n".join(out) + "\n"

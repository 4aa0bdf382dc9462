"""The server role's operations: the service user, the units (plan, write, switch), /health,
``llamarack rollback`` and the bench. A unit names the build and model directories it serves,
not the ``current`` links, and is planned when the operation runs (docs/ARCHITECTURE.md, "The
server operation plans at execution time").
"""

from __future__ import annotations

import hashlib
import json
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from pyinfra import host, logger
from pyinfra.api import QuoteString, StringCommand, operation
from pyinfra.facts.files import FileContents, Link, Sha256File
from pyinfra.facts.server import Command

from llamarack import remote
from roles.llamacpp.reads import BenchRecord, BuildSeals, LlamaServerFlags
from roles.driver.reads import CharDevices, RecordedGpus
from roles.model.reads import GgufShape, ModelArtifact
from roles.server.reads import (KEY_DIGEST_SALT, NOLOGIN, SERVICE_USER_MARK, FoundUnit, HostMemory, ServedUnits,
                                SystemGroup, SystemUser, active_since, secret_digest_command, unit_cards)  # fmt: skip
from llamarack.facts import read
from llamarack.layout import API_KEY_PATH, UNIT_NAME, unit_build, unit_index, unit_name
from llamarack.operations import executing, private_upload, put_record, refusal, secret_upload, show_diff
from roles.server.files.secret_digest import digest
from roles.server.rules import account_failure
from llamarack.secrets import read_token
from roles.settings import Settings

from .files import bench_record
from .plan import (PlanError, WantedUnit, bench_args, bench_due,  # noqa: F401
                   bench_entry, bench_split_args, health_url, host_layouts, parse_pin, pin_holds,
                   process_drift, roofline, unit_model, unit_ref, unit_refs,
                   wanted_units, cache_in_place)  # fmt: skip
from .switch import detached, health_check_script, label, pin_script, retire_script, switch_script


@operation()
def system_account(user: str, home: str, setting: Optional[str] = None):
    """A system user (and its group of the same name), with no shell and no home of its own.

    + user: the account
    + home: its home (not created)
    + setting: the setting that names it, for the refusal's fix

    Made with ``SERVICE_USER_MARK`` in its GECOS field; an account llamarack did not make is
    refused, unchanged (``roles.server.rules.account_failure``, which preflight also checks)."""
    entry = read(SystemUser, user=user)
    failure = account_failure(user, home, setting, entry, read(SystemGroup, group=user))
    if failure:
        yield refusal(failure.message(host.name))
    elif entry is None:
        # --system: a uid in the system range; --user-group: a group of the same name.
        yield StringCommand("useradd", "--system", "--user-group", "--no-create-home", "--home-dir", home,
                            "--shell", NOLOGIN, "--comment", QuoteString(SERVICE_USER_MARK), user)  # fmt: skip
    elif (entry.home, entry.shell, entry.gecos) != (home, NOLOGIN, SERVICE_USER_MARK):
        yield StringCommand("usermod", "--home", home, "--shell", NOLOGIN, "--comment",
                            QuoteString(SERVICE_USER_MARK), user)  # fmt: skip
    else:
        host.noop(f"user {user} exists")


def _linked(current: str) -> Optional[str]:
    """The directory the link ``current`` (``builds/current``, ``models/current``) points at, or None."""
    target = (read(Link, path=current) or {}).get("link_target")
    if not target:
        return None
    return target if target.startswith("/") else f"{current.rsplit('/', 1)[0]}/{target}"


@operation(is_idempotent=False)
def answers_health(settings: Settings, reason: str):
    """Fail unless every llama-server unit answers ``/health`` within ``server_health_timeout``.

    + settings: the host's settings (``server_health_timeout``)
    + reason: why it is checked (for the messages), e.g. the driver role's reboot

    For a server not switched by this run but started anew anyway: after the reboot for a
    driver upgrade, the unit is the same text, yet it runs on a new driver."""
    yield StringCommand(health_check_script(settings, reason, host_name=host.name))


def _served(root: str, unit_lines) -> tuple[Optional[str], Optional[str]]:
    """The build directory name and the model file a unit's ExecStart runs (None where it names none)."""
    return unit_build(root, unit_lines), unit_model(unit_lines)


def _served_by(root: str, unit_lines) -> str:
    """"build B, model M": what a unit runs, for people."""
    build, model = _served(root, unit_lines)
    return f"build {build or '?'}, model {Path(model).parent.name if model else '?'}"


def _rollback_names(found: dict, unit: Optional[int]) -> list:
    """The units a rollback looks at: ``unit`` N's (the host's one unit when it has one and
    N is 0), else every unit file of the host (the one unit's name when there is none)."""
    if unit is None:
        return sorted(found, key=lambda n: (unit_index(n) is not None, unit_index(n) or 0)) or [UNIT_NAME]
    return [UNIT_NAME] if unit == 0 and UNIT_NAME in found else [unit_name(unit)]


@operation(is_idempotent=False)
def rollback(settings: Settings, unit: Optional[int] = None):
    """Put back, for each unit that has one, the unit that served before its last switch
    (``state/previous[@N].service``), switched in as any unit is, then pinned
    (``state/rollback[@N].json``: later deploys keep it while the settings still want the
    unit it replaced; a second rollback, forward again, removes the pin).

    + settings: the host's settings (root, ``server_health_timeout``)
    + unit: only unit N (0 for a host's one unit); None: every unit with a previous one"""
    layout, root = settings.layout, settings.general.root
    found = read(ServedUnits, state=layout.state, health=True)
    names = _rollback_names(found, unit)
    previous = {n: read(FileContents, path=layout.previous_unit_of(n)) for n in names}
    seals = read(BuildSeals, root=root)
    targets = [n for n in names if previous[n]]
    if not targets:
        yield refusal(f"{host.name}: rollback: no previous unit ({', '.join(layout.previous_unit_of(n) for n in names)})"
                      ": no switch recorded one since llamarack kept them")  # fmt: skip
        return
    tampered = [b for b in (unit_build(root, previous[n]) for n in targets) if b and seals.tampered(b)]
    if tampered:
        yield refusal(f"{host.name}: rollback: build {tampered[0]} differs from its seal; not putting it back")
        return
    refs = [unit_ref(settings, unit_index(n)) for n in targets]
    needed = []
    for ref in refs:
        now = found.get(ref.name)
        host.log(f"{label(ref.name)}: rolling back to {_served_by(root, previous[ref.name])} "
                 f"(from {_served_by(root, now.lines if now else None)})", logger.info)  # fmt: skip
        build, model = _served(root, previous[ref.name])
        needed += ([f"{layout.build(build)}/bin/llama-server"] if build else []) + ([model] if model else [])
    yield (" && ".join(f"test -e {shlex.quote(p)}" for p in dict.fromkeys(needed)) or "true") + (
        f" || {{ echo {shlex.quote(f'{host.name}: rollback: the previous unit names files that are gone')} >&2; exit 1; }}")
    for ref in refs:
        u, prev = shlex.quote(ref.path), shlex.quote(layout.previous_unit_of(ref.name))
        yield f"cp -p {prev} {u}.new && chmod 644 {u}.new"
    yield StringCommand(detached(switch_script(settings, tuple(refs)), "llamarack: roll llama-server units back"))
    for ref in refs:
        yield StringCommand(pin_script(settings, ref))


def _draft(settings: Settings) -> Optional[tuple]:
    """(directory, shape) of the draft model ``models/draft`` points at, when one is asked and read."""
    draft_dir = _linked(settings.layout.draft_model) if settings.model.draft_repo else None
    shape = read(GgufShape, path=f"{draft_dir}/model.gguf") if draft_dir else None
    return (draft_dir, shape) if shape else None


def _cards(settings: Settings, seen: tuple) -> tuple:
    """The run's GPUs: preflight's (``HostFacts.gpus``); when it had none (a driver
    that hid them until the driver role's reboot), the record that role wrote."""
    return seen or read(RecordedGpus, path=settings.layout.gpus_record) or ()


def _not_made_yet(root: str, build: bool, model: bool):
    """A refusal for a host without the current build or model; with ``--dry`` on a fresh host,
    a note that the unit follows them (earlier operations of this run make them)."""
    missing = [n for n, v in (("llama.cpp build", build), ("model", model)) if not v]
    if host.state.is_executing:
        return refusal(f"{host.name}: server: no current {' and no '.join(missing)} under {root}; "
                       "the llama.cpp and model roles make them (see their output above)")  # fmt: skip
    made = f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} made"
    return StringCommand(f"echo 'write {UNIT_NAME} once the {made}'")


@dataclass(frozen=True)
class Step:
    """What one wanted unit needs: the pin ``llamarack rollback`` wrote (None: none), whether it
    holds the unit in place (``held_by``: what that serves), and why it would be switched."""

    want: WantedUnit
    pin: Optional[dict]
    held: bool
    held_by: Optional[str]
    changed: bool  # the file is to change (``--diff`` shows how)
    running: bool
    remade: bool  # its model was sealed after it started: only a restart serves the new file
    unproven: bool  # a switch was cut off before its /health check
    moved: bool  # the unit in place serves from other cards
    stale: Optional[str] = None  # why its running process is not the one its file names (its /props)

    def switch(self, key_changed: bool) -> bool:
        return self.changed or key_changed or self.remade or self.unproven or bool(self.stale) or not self.running


def _step(settings: Settings, want: WantedUnit, found: Optional[FoundUnit], sealed_at) -> Step:
    """The unit in place (``found``) against the wanted one."""
    found_sha1, wanted_sha1 = (found.sha1 if found else None), hashlib.sha1(want.text.encode()).hexdigest()
    # `llamarack rollback` put an earlier unit back: it stays while the pin holds.
    pin = parse_pin(found.pin if found else None)
    held = pin_holds(pin, found_sha1, want.text)
    held_by = _served_by(settings.general.root, found.lines) if held else None
    changed = found_sha1 != wanted_sha1 and not held
    if changed:
        show_diff(want.ref.path, want.text, current=found.lines if found else ())
    state = found.state if found else {}
    running, since = state.get("SubState") == "running", active_since(state)
    # systemd says whole seconds: the server started in [since, since + 1).
    remade = bool(running and sealed_at and since and sealed_at >= since + 1) and not held
    unproven = bool(found and found.prev)
    if unproven:
        host.log(f"{want.ref.path} never passed its /health check (an earlier switch was cut off): "
                 "switching again", logger.warning)  # fmt: skip
    stale = process_drift(found) if running else None
    if stale:
        host.log(f"{label(want.ref.name)}: {stale}: restarting it", logger.warning)
    before = unit_cards(found.lines) if found else ()
    return Step(want, pin, held, held_by, changed, running, remade, unproven, bool(before) and before != want.cards,
                stale)  # fmt: skip


def put_secret(secret: Optional[str], path: str, mode: str, group: Optional[str], remove: str):
    """The commands that put ``secret`` into ``path`` where the host's salted digest of the
    file differs, or run ``remove`` where none is wanted and the host has one; returns
    whether either ran. The API key's file, and the gateway's copy of it for Prometheus."""
    found = read(Command, command=secret_digest_command(path))
    if secret is not None and found != digest(secret.encode(), KEY_DIGEST_SALT):
        yield from secret_upload(secret, path, mode=mode, group=group)
        return True
    if secret is None and found != "missing":
        yield remove
        return True
    return False


def _api_key(settings: Settings):
    """The API key file as the settings want it (uploaded, or removed when none is set);
    returns whether it changed."""
    key = read_token(settings.server.api_key_file, "server_api_key_file")
    return (yield from put_secret(None if key is None else key + "\n", API_KEY_PATH, "640",
                                  settings.general.service_user, f"rm -f {shlex.quote(API_KEY_PATH)}"))


def _keep_rolled_back(settings: Settings, step: Step, restart: bool):
    """Keep the unit ``llamarack rollback`` put back; with ``restart``, restart it and
    check /health."""
    name = label(step.want.ref.name)
    host.log(f"{name} runs the unit `llamarack rollback` put back ({step.held_by}); "
             "the settings still want the unit it replaced: kept (change the settings, or run "
             "`llamarack rollback` again to go forward)", logger.warning)  # fmt: skip
    if not restart:
        host.noop(f"{name} serves the unit `llamarack rollback` put back")
        return
    yield StringCommand(health_check_script(settings, "a restart of the rolled-back unit", restart=True,
                                            units=(step.want.ref,), host_name=host.name))  # fmt: skip


def _unit_check(settings: Settings, wanted: tuple):
    """The units' check after each start (their ``ExecStartPost=``): the server role's
    ``wait_healthy``, put at ``<root>/libexec/unit_check.py`` where a unit runs it and the
    host's copy differs (or is missing)."""
    path = settings.layout.unit_check
    if not any("\nExecStartPost=" in w.text for w in wanted):
        return
    source = remote.source("wait_healthy")
    if read(Sha256File, path=path) != hashlib.sha256(source.encode()).hexdigest():
        yield from put_record(path, source)


def _switch_to(settings: Settings, steps: list):
    """Stage each step's unit and switch to them (``switch_script``), releasing their
    rollback pins; units whose cards moved are all stopped first."""
    for step in steps:
        if step.pin is not None:
            host.log(f"{label(step.want.ref.name)}: the settings changed since `llamarack rollback`: its pin is "
                     "released", logger.warning)  # fmt: skip
            yield f"rm -f {shlex.quote(settings.layout.rollback_pin_of(step.want.ref.name))}"
    for step in steps:
        yield from private_upload(step.want.text, f"{step.want.ref.path}.new")
        yield f"chmod 644 {shlex.quote(step.want.ref.path)}.new"
    refs = tuple(step.want.ref for step in steps)
    yield StringCommand(detached(switch_script(settings, refs, stop_first=any(step.moved for step in steps)),
                                 "llamarack: switch llama-server units"))


def units_record(settings: Settings, wanted: tuple) -> str:
    """``state/units.json``: the host's units, as the gateway and the audit read them."""
    units = [{"index": w.ref.index or 0, "unit": w.ref.name, "port": w.ref.port, "listen": settings.server.listen,
              "parallel": w.plan.parallel, "cards": list(w.cards)} for w in wanted]  # fmt: skip
    return json.dumps({"units": units}, indent=1) + "\n"


def _retired(settings: Settings, found: dict, wanted: tuple, cards: tuple) -> tuple:
    """The units on the host that the layout no longer makes, each said with why."""
    listed = {g.uuid for g in cards}
    gone = []
    for name in sorted(set(found) - {w.ref.name for w in wanted}):
        lost = [c for c in unit_cards(found[name].lines) if c not in listed]
        why = (f"its card{'s' if len(lost) > 1 else ''} {', '.join(lost)} no longer listed by the driver" if lost
               else f"the host now serves {len(wanted)} unit{'s' if len(wanted) > 1 else ''}")  # fmt: skip
        host.log(f"retiring {name}: {why}", logger.warning)
        gone.append(unit_ref(settings, unit_index(name)))
    return tuple(gone)


def _serves(model_dir: str, build_dir: str, layout, steps: list) -> str:
    """The no-op message of a host whose units all serve as wanted."""
    head = f"llama-server serves {Path(model_dir).name} with build {Path(build_dir).name}"
    if len(steps) == 1:
        return f"{head}, {steps[0].want.plan.note}"
    return f"{head} in {len(steps)} units ({layout.reason}): " + "; ".join(
        f"{s.want.ref.name} on port {s.want.ref.port}: {s.want.plan.note}" for s in steps)


@operation()
def service(settings: Settings, gpus: tuple = (), templates: tuple = ()):
    """Serve ``models/current`` with ``builds/current`` under systemd, one unit per unit of
    the host's layout (``server_layout``); a host without GPUs serves one unit from the CPU.

    + settings: the host's settings (server, general, llamacpp backend)
    + gpus: the run's GPUs (``HostFacts.gpus``); empty: the record, read when this runs
    + templates: folders whose templates replace the role's own (the project's templates/)

    Refuses (exit 1, nothing touched) when a plan does not fit. Units the layout no longer
    makes are retired first; each unit that changed is switched in (``switch_script``: the
    others go on when one is put back). ``state/units.json`` lists the units. The API key goes
    to the host as a file (mode 640, group of the service user), never on a command line."""
    root, layout = settings.general.root, settings.layout
    build_dir, model_dir = _linked(layout.current_build), _linked(layout.current_model)
    flags = read(LlamaServerFlags, root=root)
    # Through the link (preflight's one read holds it): the same file as model_dir's.
    shape = read(GgufShape, path=f"{layout.current_model}/model.gguf") if model_dir else None
    if not (build_dir and flags and shape):
        yield _not_made_yet(root, bool(build_dir and flags), bool(shape))
        return
    draft, cards = _draft(settings), _cards(settings, gpus)
    found = read(ServedUnits, state=layout.state, health=True)
    try:
        chosen, wanted = wanted_units(settings, flags, build_dir, model_dir, shape, cards, templates, draft=draft,
                                      devices=tuple(read(CharDevices)) if settings.llamacpp.backend == "cuda" else (),
                                      in_place={n: unit_cards(f.lines) for n, f in found.items()},
                                      bench=lambda: read(BenchRecord, path=layout.bench_record),
                                      host_mib=read(HostMemory), kept_cache=cache_in_place(found))  # fmt: skip
    except PlanError as e:
        yield refusal(e.failure.message(host.name))
        return
    if chosen.contested and executing():
        logger.info(f"{host.print_prefix}server_layout auto serves {chosen.chosen}: {chosen.contested}")
    if wanted[0].memory.lowered and executing():
        logger.warning(f"{host.print_prefix}host memory: {wanted[0].memory.why()}")
    # When the served model's artifact was sealed: read through models/current, as preflight reads it.
    served = read(ModelArtifact, path=layout.current_model)
    sealed_at = (served.record or {}).get("sealed_at") if served else None
    steps = [_step(settings, w, found.get(w.ref.name), sealed_at) for w in wanted]
    record = units_record(settings, wanted)
    recorded = read(FileContents, path=layout.units_record)
    key_changed = yield from _api_key(settings)
    retired = _retired(settings, found, wanted, cards)
    yield from _unit_check(settings, wanted)
    if retired:
        yield StringCommand(retire_script(settings, retired))
    for step in steps:
        if step.remade:
            host.log(f"{model_dir} was sealed after {step.want.ref.name} started: restarting it", logger.info)
        if step.held:
            yield from _keep_rolled_back(settings, step, key_changed or step.unproven or bool(step.stale) or not step.running)
    switching = [step for step in steps if not step.held and step.switch(key_changed)]
    if switching:
        yield from _switch_to(settings, switching)
    # After the switch: one that failed (and rolled back) stops here, and the record
    # keeps naming the units that serve.
    if recorded is None or "\n".join(recorded) + "\n" != record:
        yield from put_record(layout.units_record, record)
    if not switching and not any(step.held for step in steps):
        # A pin that holds nothing (the unit in place is the one the settings want) is left
        # as it is: nothing to change, and the next switch releases it.
        host.noop(_serves(model_dir, build_dir, chosen, steps))


@operation()
def bench(settings: Settings, gpus: tuple = ()):
    """Run llama-bench (pp512, tg128) with the served flags after a new build or model, on
    every distinct unit, and record it in ``<root>/state/bench.json`` beside the roofline
    of each unit's cards (docs/planning.md, "llama-bench after a new build or model").

    + settings: the host's settings (``server_bench``: stopped, beside or off)
    + gpus: the run's GPUs (``HostFacts.gpus``)

    A record with a figure for every unit's plan does nothing (``bench_due``); alike units
    share one measurement (``_measures``), and the rival layout's units are measured too
    where the ledger cannot choose (``host_layouts``; ``_bench_one`` says how each mode
    treats the units that serve)."""
    mode, layout = settings.server.bench, settings.layout
    # Read before this operation's first command (llamarack.facts.reading's rule).
    record = read(BenchRecord, path=layout.bench_record)
    build_dir, model_dir = _linked(layout.current_build), _linked(layout.current_model)
    if mode == "off":
        host.noop("llama-bench is off (server_bench = 'off')")
        return
    if not (build_dir and model_dir):
        host.noop("llama-bench: no current build or model to measure")
        return
    key = {"build": Path(build_dir).name, "model": Path(model_dir).name}
    if record and record.get("key") == key and not isinstance(record.get("units"), list):
        host.noop(_measured(key, record))  # a record from before units were listed: its figure stands for all
        return
    flags = read(LlamaServerFlags, root=settings.general.root)
    shape = read(GgufShape, path=f"{layout.current_model}/model.gguf")
    if not (flags and shape):
        host.noop("llama-bench: the build's flags or the model's header are unreadable; not measured")
        return
    cards, draft = _cards(settings, gpus), _draft(settings)
    found = read(ServedUnits, state=layout.state, health=True)
    try:
        served, rival = host_layouts(settings, shape, cards, draft[1] if draft else None, record, key["model"])
    except PlanError as e:
        yield refusal(e.failure.message(host.name))
        return
    refs = unit_refs(settings, served, {n: unit_cards(f.lines) for n, f in found.items()})
    due = bench_due(settings, record, key, served, refs)
    if due is None:
        host.noop(_measured(key, record))
        return
    if record and record.get("key") == key:
        host.log(f"llama-bench: {due}: measuring again", logger.info)
    entries, runs = _measures(settings, (served, refs), rival if mode == "stopped" else None, cards, shape)
    for run in runs:
        yield from _bench_one(settings, run, (flags, build_dir, model_dir), key, cards)
    yield remote.command("bench_record", "join", layout.bench_record, json.dumps(entries, sort_keys=True))


def _measured(key: dict, record: dict) -> str:
    """The no-op message of a host whose record is current."""
    pp, tg = (record.get(t, {}).get("tokens_per_second") for t in ("pp512", "tg128"))
    units = record.get("units") if isinstance(record.get("units"), list) else []
    alone = [u for u in units if isinstance(u, dict) and "as" not in u]
    more = f" ({len(units)} units, {len(alone)} measured, the others as one of them)" if len(units) > 1 else ""
    return (f"llama-bench has measured build {key['build']} with model {key['model']}: "
            f"pp512 {pp} t/s, tg128 {tg} t/s{more}")  # fmt: skip


@dataclass(frozen=True)
class _Run:
    """One llama-bench run: the unit's entry in the record, its plan, the units stopped for it."""

    entry: dict
    plan: object
    stop: tuple


def _measures(settings: Settings, served: tuple, rival, cards: tuple, shape: dict) -> tuple:
    """({"units": [...], "alternative": [...]}: the record's entries, each naming its
    measurement (``part``: the n-th run) or the unit before it that llama-bench runs alike, whose
    figures it shares (``as``; ``bench_record.signature``: the same kinds of cards, the same flags); the runs)."""
    layout, refs = served
    cuda = settings.llamacpp.backend == "cuda"
    todo = [("units", layout, unit, ref.name, {"index": ref.index or 0, "port": ref.port}, (ref,))
            for ref, unit, _ in refs]  # fmt: skip
    for unit in rival.units if rival else ():
        ids = {rival.cards[i].id for i in unit.cards}
        on = tuple(ref for ref, _, uuids in refs if ids & set(uuids))
        name = f"{rival.chosen}: card{'s' if len(unit.cards) > 1 else ''} {', '.join(map(str, unit.cards))}"
        todo.append(("alternative", rival, unit, name, {}, on))
    by_uuid = {g.uuid: g for g in cards}
    entries, runs, seen = {"units": [], "alternative": []}, [], {}
    for where, lay, unit, name, place, stop in todo:
        entry = {"name": name, **place, **bench_entry(lay, unit, cuda)}
        entry["roofline"] = roofline(tuple(by_uuid[c] for c in entry["cards"] if c in by_uuid), shape)
        signature = bench_record.signature(entry)
        if signature in seen:
            entry["as"] = seen[signature]
        else:
            seen[signature] = name
            entry["part"] = settings.layout.bench_part(len(runs))
            runs.append(_Run(entry, unit.plan, stop))
        entries[where].append(entry)
    return entries, runs


def _bench_one(settings: Settings, run: _Run, served: tuple, key: dict, cards: tuple):
    """The command of one llama-bench run, on its unit's cards (CUDA_VISIBLE_DEVICES by UUID on a
    host of several cards), writing its measurement to its ``part``. With ``stopped``, the units
    on the measured cards (``run.stop``) are stopped for it and started again, and must answer /health."""
    flags, build_dir, model_dir = served
    cuda, entry, plan = settings.llamacpp.backend == "cuda", run.entry, run.plan
    args = bench_args(settings, flags, build_dir, model_dir, plan, cuda) + \
        (bench_split_args(plan) if cuda else [])  # fmt: skip
    measured = {"key": key, "mode": settings.server.bench, "backend": settings.llamacpp.backend, "on_card": cuda,
                "served": entry["served"], "roofline": entry["roofline"]}  # fmt: skip
    if len(cards) > 1:  # which unit's plan was measured, on which cards
        measured["unit"] = {"name": entry["name"], "cards": entry["cards"], "split_args": entry["split_args"]}
    run_bench = remote.command("bench_record", entry["part"], json.dumps(measured, sort_keys=True), *args)
    if len(cards) > 1 and entry["cards"]:
        run_bench = f"{remote.argv('env', 'CUDA_VISIBLE_DEVICES=' + ','.join(entry['cards']))} {run_bench}"
    where = "on the CPU build (the roofline is the card's, not this measurement's)" if not cuda else "on the card"
    refs = run.stop
    names = ", ".join(label(ref.name) for ref in refs)
    if settings.server.bench == "stopped" and refs:
        if executing():
            logger.info(f"{host.print_prefix}llama-bench {where}: {names} stopped for it and started "
                        "again (server_bench = 'stopped')")  # fmt: skip
        services = " ".join(shlex.quote(ref.name) for ref in refs)
        waits = " && ".join(remote.command("wait_healthy", health_url(settings, ref.port), ref.name,
                                           str(settings.server.health_timeout)) for ref in refs)  # fmt: skip
        yield (f"systemctl stop {services}; {run_bench}; rc=$?; systemctl start {services} && {waits} || "
               f"{{ echo {shlex.quote(names + ' did not answer /health after the bench')} >&2; exit 1; }}; "
               "exit $rc")  # fmt: skip
    else:
        if executing():
            logger.info(f"{host.print_prefix}llama-bench {where}" + (f", while {names} serves beside it "
                        "(server_bench = 'beside': they share the card)" if refs else ""))  # fmt: skip
        yield run_bench

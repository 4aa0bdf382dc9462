"""The server role's audit items: the host's units against those its layout makes, and each
unit against the one the deploy would write (a ``llamarack rollback`` pin honoured), its
service, /health and residency; who else is on the cards, the bench. A host of one unit has
the items ``unit``, ``service``, ``health``, ``residency``; a host of several has them per
unit as ``unit@N``, ``service@N``, ``health@N``, ``residency@N``."""

from __future__ import annotations

import hashlib
from typing import Optional

from pyinfra.facts.files import Link

from llamarack.audit import Item, Seen, iso, link_name
from llamarack.facts import FactRead
from llamarack.layout import UNIT_NAME, unit_index
from roles.driver.reads import CharDevices, GpuProcesses
from roles.llamacpp.reads import BenchRecord, LlamaServerFlags
from roles.model.reads import GgufShape
from roles.settings import Settings

from .files import bench_record
from .files.wait_healthy import residency
from .plan import (MIB, PlanError, WantedUnit, bench_due, parse_pin, pin_holds, process_drift, residency_checked,
                   unit_model, unit_refs, wanted_units, cache_in_place)  # fmt: skip
from .reads import (NOLOGIN, SERVICE_USER_MARK, FoundUnit, HostMemory, ServedUnits, SystemGroup, SystemUser,
                    active_since, unit_cards)  # fmt: skip


def reads(settings: Settings, verify: bool = False) -> tuple[FactRead, ...]:
    """What the wanted units are planned from (the current build's flags, the served GGUF's
    shape, the links), every unit in place with its pin, state and /health (one fact), and
    what is only reported."""
    layout = settings.layout
    draft = (FactRead.of(Link, path=layout.draft_model), FactRead.of(GgufShape, path=f"{layout.draft_model}/model.gguf"))
    return (
        FactRead.of(ServedUnits, state=layout.state, health=True),
        FactRead.of(Link, path=layout.current_build),
        FactRead.of(Link, path=layout.current_model),
        FactRead.of(LlamaServerFlags, root=settings.general.root),
        FactRead.of(GgufShape, path=f"{layout.current_model}/model.gguf"),
        FactRead.of(GpuProcesses),
        FactRead.of(BenchRecord, path=layout.bench_record),
        FactRead.of(SystemUser, user=settings.general.service_user),
        FactRead.of(SystemGroup, group=settings.general.service_user),
        FactRead.of(HostMemory),
    ) + (draft if settings.model.draft_repo else ())  # the draft the unit names


def items(seen: Seen) -> dict[str, Item]:
    settings, fact, layout = seen.settings, seen.fact, seen.settings.layout
    found = fact(ServedUnits, state=layout.state, health=True) or {}
    processes = fact(GpuProcesses) or ()
    planned, why = wanted_here(settings, fact, seen.facts.gpus, seen.templates, found)
    wanted = {w.ref.name: w for w in planned[1]} if planned else {}
    names = list(wanted) or sorted(found) or [UNIT_NAME]
    user = settings.general.service_user
    out = {"service_user": account_item(fact(SystemUser, user=user), fact(SystemGroup, group=user), settings.general.root),
           "units": units_item(found, planned, why)}  # fmt: skip
    pids = set()
    for name in names:
        suffix = "" if len(names) == 1 else f"@{unit_index(name) or 0}"
        unit_items = one_unit(settings, found.get(name), wanted.get(name), why, processes, several=bool(suffix))
        pids.add(unit_items["service"].found["pid"])
        out.update({f"{key}{suffix}": item for key, item in unit_items.items()})
    others = [{"pid": p.pid, "name": p.name, "used_mib": p.used_mib} for p in processes if p.pid not in pids]
    # The write-up measures only with nobody else on the card.
    out["gpu_processes"] = Item({"llama_server": [p.used_mib for p in processes if p.pid in pids], "others": others},
                                {"others": []}, drift=bool(others))  # fmt: skip
    in_place = {n: unit_cards(f.lines) for n, f in found.items()}
    served = (planned[0], unit_refs(settings, planned[0], in_place)) if planned else None
    out["bench"] = bench_item(settings, fact(BenchRecord, path=layout.bench_record),
                              link_name(fact(Link, path=layout.current_build)),
                              link_name(fact(Link, path=layout.current_model)), served)  # fmt: skip
    return out


def units_item(found: dict, planned: Optional[tuple], why: Optional[str]) -> Item:
    """The unit files on the host against those the host's layout makes (a unit the deploy
    would retire, or make, is drift)."""
    have = sorted(found, key=lambda n: unit_index(n) or 0)
    if not planned:
        return Item({"units": have}, {"units": None, "why": why}, drift=True)
    layout, wanted = planned
    names = [w.ref.name for w in wanted]
    memory = {k: v for k, v in wanted[0].memory.as_dict().items() if k != "units"} if wanted[0].memory else None
    return Item({"units": have}, {"units": names, "layout": layout.chosen, "reason": layout.reason,
                                  "host_ram": memory}, drift=set(have) != set(names))  # fmt: skip


def one_unit(settings: Settings, found: Optional[FoundUnit], wanted: Optional[WantedUnit], why: Optional[str],
             processes: tuple, several: bool) -> dict:  # fmt: skip
    """One unit's items: its file against the wanted one, its service (``sleeping`` while the
    server sleeps: it serves, and a request wakes it), /health, the process (its /props against
    its file), residency."""
    state = found.state if found else {}
    asleep = bool(found and found.sleeping)
    service = Item(
        {"active": state.get("ActiveState"), "sub": state.get("SubState"), "pid": int(state.get("MainPID") or 0),
         "since": iso(active_since(state)), "restarts": int(state.get("NRestarts") or 0),
         **({"sleeping": True} if asleep else {})},
        {"active": "active", "sub": "running"},
        drift=(state.get("ActiveState"), state.get("SubState")) != ("active", "running"),
    )  # fmt: skip
    status = found.health if found else None
    unit = unit_item(settings, found, wanted, why, several)
    cards = wanted.cards if wanted else unit_cards(found.lines if found else ())
    weights = (unit.wanted or {}).get("weights_mib")
    return {"unit": unit, "service": service, "health": Item(status, 200, drift=status != 200),
            "process": process_item(found),
            "residency": residency_item(settings, cards, processes, service.found["pid"], weights, asleep,
                                        found.refused if found else None)}  # fmt: skip


def process_item(found: Optional[FoundUnit]) -> Item:
    """The running process's own word (its /props) against its unit file: the model it serves
    and the build it runs (``process_drift``); drift where they differ. Nothing said (no answer,
    a build without /props): not drift, the health item speaks."""
    said = (found.props if found else None) or {}
    why = process_drift(found)
    wanted = {"model_path": unit_model(found.lines), "built": found.built} if found else None
    return Item(said or None, {**wanted, **({"why": why} if why else {})} if wanted else None, drift=bool(why))


def wanted_here(settings: Settings, fact, gpus: tuple, templates: tuple, found: Optional[dict] = None) -> tuple:
    """((layout, wanted units), None) as the deploy would plan them from what is current and
    the units ``found`` in place; or (None, why not)."""
    layout, root = settings.layout, settings.general.root
    build_dir = link_name(fact(Link, path=layout.current_build))
    model_dir = link_name(fact(Link, path=layout.current_model))
    flags = fact(LlamaServerFlags, root=root)
    shape = fact(GgufShape, path=f"{layout.current_model}/model.gguf")
    if not (build_dir and model_dir and flags and shape):
        return None, "no current build or model to plan from"
    draft_dir = link_name(fact(Link, path=layout.draft_model)) if settings.model.draft_repo else None
    draft_shape = fact(GgufShape, path=f"{layout.draft_model}/model.gguf") if draft_dir else None
    draft = (f"{layout.models}/{draft_dir}", draft_shape) if draft_shape else None
    devices = tuple(fact(CharDevices)) if settings.llamacpp.backend == "cuda" else ()
    try:
        return wanted_units(settings, flags, f"{layout.builds}/{build_dir}", f"{layout.models}/{model_dir}",
                            shape, gpus, templates, draft=draft, devices=devices,
                            in_place={n: unit_cards(f.lines) for n, f in (found or {}).items()},
                            bench=fact(BenchRecord, path=layout.bench_record),
                            host_mib=fact(HostMemory), kept_cache=cache_in_place(found or {})), None  # fmt: skip
    except PlanError as e:
        return None, e.failure.message("")


def unit_item(settings: Settings, found: Optional[FoundUnit], wanted: Optional[WantedUnit], why: Optional[str],
              several: bool = False) -> Item:  # fmt: skip
    """A unit in place against the one the deploy would write from what is current (a
    ``llamarack rollback`` pin honoured)."""
    # The unit's lines as systemd reads them: split on \n only (the connector's lines), never
    # on what str.splitlines also splits (\x85, \u2028...), which would show a line systemd does not see.
    unit_text = "\n".join(found.lines) + "\n" if found else None
    found_d = {"sha256": hashlib.sha256(unit_text.encode()).hexdigest() if unit_text else None,
               "exec_start": exec_start(unit_text or "")}
    if several:
        found_d["cards"] = list(unit_cards(found.lines if found else ()))
    if wanted is None:
        return Item(found_d, {"sha256": None, "why": why or "the host's layout makes no such unit"}, drift=True)
    plan = wanted.plan
    wanted_d = {"sha256": hashlib.sha256(wanted.text.encode()).hexdigest(), "ctx_size": plan.ctx_size,
                "weights_mib": plan.ledger.weights_on_card // MIB, "exec_start": exec_start(wanted.text),
                "host_ram": wanted.share.as_dict() if wanted.share else None}  # its share of the host's memory
    if several:
        wanted_d.update(port=wanted.ref.port, cards=list(wanted.cards))
    # `llamarack rollback` pinned the unit in place: a deploy keeps it (so it is no drift).
    pin = parse_pin(found.pin if found else None)
    held = pin_holds(pin, found.sha1 if found else None, wanted.text)
    if pin is not None:
        found_d["rollback_pin"] = {"held": held, **pin}
    # A pin that holds nothing while the unit is the wanted one changes nothing either: no drift.
    return Item(found_d, wanted_d, drift=found_d["sha256"] != wanted_d["sha256"] and not held)


def account_item(entry, group: Optional[int], home: str) -> Item:
    """A system account llamarack makes (``system_account``): found as it is, wanted made by
    llamarack with its mark, home ``home``, no shell and its own group (the deploy makes it, or
    marks one it made before it marked accounts; one it did not make is the rules' refusal)."""
    found = None if entry is None else {"uid": entry.uid, "gecos": entry.gecos, "home": entry.home,
                                        "shell": entry.shell, "own_group": group == entry.gid}  # fmt: skip
    wanted = {"gecos": SERVICE_USER_MARK, "home": home, "shell": NOLOGIN, "own_group": True}
    return Item(found, wanted, drift=found is None or any(found[k] != v for k, v in wanted.items()))


def exec_start(unit_text: str) -> Optional[str]:
    """A unit's ExecStart value (the unit's lines end at \\n only, as systemd reads them)."""
    return next((line.split("=", 1)[1] for line in unit_text.split("\n") if line.startswith("ExecStart=")), None)


def residency_item(settings: Settings, cards: tuple, processes: tuple, pid: int, weights_mib: Optional[int],
                   asleep: bool = False, refused: Optional[str] = None) -> Item:  # fmt: skip
    """Whether the served process is on its cards (``cards``: their UUIDs; nvidia-smi's
    compute apps) with at least the planned weights: a CUDA unit serving from the CPU
    answers /health all the same. A server ``asleep`` has freed its weights (not its CUDA context): it is checked
    once a request wakes it. Not running, the unit's check after its last start says why
    where it refused it (``refused``: a reboot onto a driver that denies its cards)."""
    if not residency_checked(settings):
        return Item({"backend": settings.llamacpp.backend, "server_residency": settings.server.residency})
    mine = [p for p in processes if p.pid == pid]
    found = {"pid": pid, "cards": [p.gpu_uuid for p in mine], "used_mib": sum(p.used_mib or 0 for p in mine)}
    wanted = {"cards": list(cards), "weights_mib": weights_mib}
    if not pid and refused:
        return Item({**found, "why": f"refused at its last start: {refused}"}, wanted, drift=True)
    if not pid:
        return Item({**found, "why": "not running"}, wanted)  # the service item says so
    if asleep:
        return Item({**found, "why": "asleep: it freed its weights (its CUDA context stays); checked once a request wakes it"}, wanted)
    why = residency(processes, pid, cards, weights_mib or 0)
    return Item({**found, "why": why} if why else found, wanted, drift=why is not None)


def bench_item(settings: Settings, record: Optional[dict], build: Optional[str], model: Optional[str],
               served: Optional[tuple] = None) -> Item:  # fmt: skip
    """llama-bench's figures for the build and model served (``state/bench.json``), beside
    the card's roofline, and each unit's (``units``; ``as``: another unit's measurement it
    shares); drift when the deploy would measure again (``bench_due``: the record names
    another build or model, or has no figure of a unit's plan) with ``server_bench`` on.
    ``served``: (the host's layout, its ``unit_refs``), where it could be planned."""
    record = record or {}
    roof = record.get("roofline") or {}
    found = {"pp512": (record.get("pp512") or {}).get("tokens_per_second"),
             "tg128": (record.get("tg128") or {}).get("tokens_per_second"),
             "roofline_tg": roof.get("tokens_per_second"), "roofline_fraction": record.get("roofline_fraction"),
             "card": roof.get("card"), "backend": record.get("backend"), "mode": record.get("mode"),
             "measured_at": iso(record["measured_at"]) if record.get("measured_at") else None,
             "build": (record.get("key") or {}).get("build"), "model": (record.get("key") or {}).get("model")}  # fmt: skip
    if isinstance(record.get("units"), list):
        found["units"] = _figures(bench_record.entries(record))
        if record.get("alternative"):
            found["alternative"] = _figures(e for e in bench_record.entries(record, serving=False) if "index" not in e)
    if settings.server.bench == "off":
        return Item(found)
    wanted = {"build": build, "model": model}
    if served is None:
        return Item(found, wanted, drift=record.get("key") != wanted)
    due = bench_due(settings, record or None, dict(wanted), *served)
    if "units" in found:
        wanted["units"] = [ref.name for ref, _, _ in served[1]]
    if due and record.get("key") == {"build": build, "model": model}:
        wanted["why"] = due  # the record names what is served, not every unit's plan
    return Item(found, wanted, drift=due is not None)


def _figures(entries) -> list:
    """Each unit's figures as the audit shows them."""
    return [{"name": e.get("name"), "pp512": bench_record.tokens_per_second(e, "pp512"),
             "tg128": bench_record.tokens_per_second(e, "tg128"), **({"as": e["as"]} if "as" in e else {})}
            for e in entries]  # fmt: skip

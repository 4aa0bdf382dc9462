"""The server role's audit items: the unit against the one the deploy would write (a
``llamarack rollback`` pin honoured), the service, /health, who else is on the card, the bench."""

from __future__ import annotations

import hashlib
from typing import Optional

from pyinfra.facts.files import FileContents, Link, Sha1File

from llamarack.audit import Item, Seen, iso, link_name
from llamarack.facts import FactRead
from llamarack.layout import UNIT_NAME, UNIT_PATH
from llamarack.roles.driver.reads import CharDevices, GpuProcesses
from llamarack.roles.llamacpp.reads import BenchRecord, LlamaServerFlags
from llamarack.roles.model.reads import GgufShape
from llamarack.settings import Settings

from .files.wait_healthy import residency
from .plan import MIB, PlanError, health_url, parse_pin, wanted_unit
from .reads import NOLOGIN, SERVICE_USER_MARK, HttpStatus, SystemGroup, SystemUser, UnitState, active_since

ITEMS = ("service_user", "unit", "service", "health", "residency", "gpu_processes", "bench")


def reads(settings: Settings, verify: bool = False) -> tuple[FactRead, ...]:
    """What the wanted unit is planned from (the current build's flags, the served GGUF's
    shape, the links), the unit in place and its pin, and what is only reported."""
    layout = settings.layout
    draft = (FactRead.of(Link, path=layout.draft_model), FactRead.of(GgufShape, path=f"{layout.draft_model}/model.gguf"))
    return (
        FactRead.of(Sha1File, path=UNIT_PATH),
        FactRead.of(FileContents, path=layout.rollback_pin),
        FactRead.of(Link, path=layout.current_build),
        FactRead.of(Link, path=layout.current_model),
        FactRead.of(LlamaServerFlags, root=settings.general.root),
        FactRead.of(GgufShape, path=f"{layout.current_model}/model.gguf"),
        FactRead.of(FileContents, path=UNIT_PATH),
        FactRead.of(UnitState, unit=UNIT_NAME),
        FactRead.of(HttpStatus, url=health_url(settings)),
        FactRead.of(GpuProcesses),
        FactRead.of(BenchRecord, path=layout.bench_record),
        FactRead.of(SystemUser, user=settings.general.service_user),
        FactRead.of(SystemGroup, group=settings.general.service_user),
    ) + (draft if settings.model.draft_repo else ())  # the draft the unit names


def items(seen: Seen) -> dict[str, Item]:
    settings, fact, layout = seen.settings, seen.fact, seen.settings.layout
    # The unit's lines as systemd reads them: split on \n only (the connector's lines), never
    # on what str.splitlines also splits (\x85, \u2028...), which would show a line systemd does not see.
    unit_lines = fact(FileContents, path=UNIT_PATH)
    unit_text = "\n".join(unit_lines) + "\n" if unit_lines else None
    state = fact(UnitState, unit=UNIT_NAME) or {}
    service = Item(
        {"active": state.get("ActiveState"), "sub": state.get("SubState"), "pid": int(state.get("MainPID") or 0),
         "since": iso(active_since(state)), "restarts": int(state.get("NRestarts") or 0)},
        {"active": "active", "sub": "running"},
        drift=(state.get("ActiveState"), state.get("SubState")) != ("active", "running"),
    )  # fmt: skip
    status = fact(HttpStatus, url=health_url(settings))
    pid = service.found["pid"]
    processes = fact(GpuProcesses) or ()
    others = [{"pid": p.pid, "name": p.name, "used_mib": p.used_mib} for p in processes if p.pid != pid]
    unit = unit_item(settings, fact, seen.facts.gpus, unit_text, seen.templates)
    user = settings.general.service_user
    return {
        "service_user": account_item(fact(SystemUser, user=user), fact(SystemGroup, group=user), settings.general.root),
        "unit": unit,
        "service": service,
        "health": Item(status, 200, drift=status != 200),
        "residency": residency_item(settings, seen.facts.gpus, processes, pid, (unit.wanted or {}).get("weights_mib")),
        # The write-up measures only with nobody else on the card.
        "gpu_processes": Item({"llama_server": [p.used_mib for p in processes if p.pid == pid], "others": others},
                              {"others": []}, drift=bool(others)),  # fmt: skip
        "bench": bench_item(settings, fact(BenchRecord, path=layout.bench_record),
                            link_name(fact(Link, path=layout.current_build)),
                            link_name(fact(Link, path=layout.current_model))),  # fmt: skip
    }


def unit_item(settings: Settings, fact, gpus: tuple, unit_text: Optional[str], templates: tuple) -> Item:
    """The unit in place against the one the deploy would write from what is current."""
    layout, root = settings.layout, settings.general.root
    found = {"sha256": hashlib.sha256(unit_text.encode()).hexdigest() if unit_text else None,
             "exec_start": exec_start(unit_text or "")}
    build_dir = link_name(fact(Link, path=layout.current_build))
    model_dir = link_name(fact(Link, path=layout.current_model))
    flags = fact(LlamaServerFlags, root=root)
    shape = fact(GgufShape, path=f"{layout.current_model}/model.gguf")
    if not (build_dir and model_dir and flags and shape):
        return Item(found, {"sha256": None, "why": "no current build or model to plan from"}, drift=True)
    draft_dir = link_name(fact(Link, path=layout.draft_model)) if settings.model.draft_repo else None
    draft_shape = fact(GgufShape, path=f"{layout.draft_model}/model.gguf") if draft_dir else None
    draft = (f"{layout.models}/{draft_dir}", draft_shape) if draft_shape else None
    devices = tuple(fact(CharDevices)) if settings.llamacpp.backend == "cuda" else ()
    try:
        unit, ctx = wanted_unit(settings, flags, f"{layout.builds}/{build_dir}", f"{layout.models}/{model_dir}",
                                shape, gpus, templates, draft=draft, devices=devices)  # fmt: skip
    except PlanError as e:
        return Item(found, {"sha256": None, "why": e.failure.message("")}, drift=True)
    wanted = {"sha256": hashlib.sha256(unit.encode()).hexdigest(), "ctx_size": ctx.ctx_size,
              "weights_mib": ctx.ledger.weights_on_card // MIB,
              "exec_start": exec_start(unit)}
    # `llamarack rollback` pinned the unit in place: a deploy keeps it while the settings
    # still want the unit it replaced (so it is no drift).
    pin = parse_pin(fact(FileContents, path=layout.rollback_pin))
    held = bool(pin) and pin.get("unit_sha1") == fact(Sha1File, path=UNIT_PATH) and \
        pin.get("replaced_sha1") == hashlib.sha1(unit.encode()).hexdigest()  # fmt: skip
    if pin is not None:
        found["rollback_pin"] = {"held": held, **pin}
    # A pin that holds nothing while the unit is the wanted one changes nothing either: no drift.
    return Item(found, wanted, drift=found["sha256"] != wanted["sha256"] and not held)


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


def residency_item(settings: Settings, gpus: tuple, processes: tuple, pid: int, weights_mib: Optional[int]) -> Item:
    """Whether the served process is on its cards (nvidia-smi's compute apps) with at least
    the planned weights: a CUDA unit serving from the CPU answers /health all the same."""
    if settings.llamacpp.backend != "cuda":
        return Item({"backend": "cpu"})
    cards = tuple(g.uuid for g in gpus)
    mine = [p for p in processes if p.pid == pid]
    found = {"pid": pid, "cards": [p.gpu_uuid for p in mine], "used_mib": sum(p.used_mib or 0 for p in mine)}
    wanted = {"cards": list(cards), "weights_mib": weights_mib}
    if not pid:
        return Item({**found, "why": "not running"}, wanted)  # the service item says so
    why = residency(processes, pid, cards, weights_mib or 0)
    return Item({**found, "why": why} if why else found, wanted, drift=why is not None)


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
             "measured_at": iso(record["measured_at"]) if record.get("measured_at") else None,
             "build": (record.get("key") or {}).get("build"), "model": (record.get("key") or {}).get("model")}  # fmt: skip
    if settings.server.bench == "off":
        return Item(found)
    wanted = {"build": build, "model": model}
    return Item(found, wanted, drift=record.get("key") != wanted)

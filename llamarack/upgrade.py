"""``llamarack plan-upgrade``: what a deploy with this llamarack would do to each host, and why.

Each host is read exactly as ``llamarack audit`` reads it, and every drifted item becomes
what the deploy will do about it (docs/day2.md, "Upgrading llamarack itself"): rebuild
(llama.cpp: a build input changed), re-prove (the build in place, by a new proof: nothing
is built), remake (the model artifact), install (a toolkit, a compiler or a Python env),
restart (the unit's text changed) or record (a record is written; nothing that serves
changes). A host with no line is converged. The plan is as good as the audit's agreement
with the deploy: both plan from the same settings and planners.
"""

from __future__ import annotations

import shlex
from dataclasses import asdict, dataclass

from .audit import HostAudit, Item


@dataclass(frozen=True)
class Step:
    action: str
    what: str
    why: str


def _words_changed(found, wanted) -> str:
    """What differs between two ExecStart lines, as the words only one of them has."""
    old, new = shlex.split(found or ""), shlex.split(wanted or "")
    gone, added = [w for w in old if w not in new], [w for w in new if w not in old]
    parts = ([f"drops {' '.join(gone)[:120]}"] if gone else []) + ([f"adds {' '.join(added)[:120]}"] if added else [])
    return "; ".join(parts) or "lines outside ExecStart"


def build_steps(item: Item) -> list[Step]:
    found, wanted = item.found or {}, item.wanted or {}
    if found.get("stamp") is None:
        return [Step("rebuild", "llama.cpp", "no current build")]
    if found.get("proof_failed"):
        return [Step("rebuild", f"llama.cpp {found['stamp']} beside itself",
                     f"it failed proof {found['proof_failed']} when re-proved")]
    if wanted.get("inputs_changed"):
        return [Step("rebuild", f"llama.cpp {wanted.get('stamp')}",
                     f"{', '.join(wanted['inputs_changed'])} changed (current build {found['stamp']})")]
    if found.get("files") != "as sealed":
        return [Step("rebuild", f"llama.cpp {found['stamp']} beside itself", f"its files differ: {found.get('files')}")]
    return [Step("re-prove", f"llama.cpp build {found['stamp']}",
                 f"proof {found.get('proof') or 'without an id'} -> {wanted.get('proof')}; nothing is built")]


def model_step(item: Item) -> Step:
    found, wanted = item.found or {}, item.wanted or {}
    same = all(found.get(k) == wanted.get(k) for k in ("repo", "revision", "quant", "untouched"))
    if found.get("stamp") and same and not found.get("shape_recorded"):
        return Step("record", "GGUF shape", "this llamarack's header reader reads the served GGUF again; "
                                            "nothing that serves changes")
    if found.get("stamp") and found.get("untouched") is False:
        return Step("remake", "model artifact", "the served artifact was changed after its seal")
    return Step("remake", "model artifact", f"{found.get('repo')}@{found.get('revision')} {found.get('quant')} "
                                            "-> the settings' model")


def unit_steps(item: Item, rebuilt: bool, name: str = "llama-server") -> list[Step]:
    found, wanted = item.found or {}, item.wanted or {}
    if wanted.get("sha256") is None:
        return [] if rebuilt else [Step("restart", name, wanted.get("why") or "no unit planned")]
    return [Step("restart", name, "its unit changes: " + _words_changed(found.get("exec_start"),
                                                                       wanted.get("exec_start")))]


def server_steps(items: dict, remade: bool) -> list[Step]:
    """The llama-server units' steps: units the host's layout no longer makes are retired;
    each unit (``unit``, or ``unit@N`` on a host of several) restarts when its file changes,
    its build or model is new, or it does not serve."""
    steps = []
    units = items.get("units")
    if units is not None and units.drift and (units.wanted or {}).get("units") is not None:
        gone = [n for n in (units.found or {}).get("units", []) if n not in units.wanted["units"]]
        if gone:
            steps.append(Step("retire", ", ".join(gone), f"the host's layout makes {', '.join(units.wanted['units'])}"))
    suffixes = [k[len("unit"):] for k in items if k == "unit" or k.startswith("unit@")] or [""]
    for suffix in suffixes:
        name = "llama-server" if not suffix else f"llamarack-server{suffix}"
        unit = items.get(f"unit{suffix}")
        if unit is not None and unit.drift:
            steps += unit_steps(unit, remade, name)
        elif remade:
            steps.append(Step("restart", name, "its unit names the new build or model"))
        elif any(items[n].drift for n in (f"service{suffix}", f"health{suffix}") if n in items):
            steps.append(Step("restart", name, "not serving now"))
        elif f"process{suffix}" in items and items[f"process{suffix}"].drift:
            steps.append(Step("restart", name, items[f"process{suffix}"].wanted.get("why") or "its process is not its unit's"))
    return steps


def host_steps(audit: HostAudit) -> list[Step]:
    """What the deploy would do on a host the audit read (its drifted items, in deploy order)."""
    steps: list[Step] = []
    items = audit.items
    for name in ("driver", "toolchain", "awq_env", "converter_env"):
        if name in items and items[name].drift:
            steps.append(Step("install", name.replace("_", " "), f"found {items[name].found}"[:160]))
    if "build" in items and items["build"].drift:
        steps += build_steps(items["build"])
    for name in ("pipeline_user", "service_user"):
        if name in items and items[name].drift:
            found = items[name].found
            steps.append(Step("install", name.replace("_", " "), "no such account yet" if found is None else
                              f"an account llamarack made, to be marked as its own (found {found})"))
    if "model" in items and items["model"].drift:
        steps.append(model_step(items["model"]))
    remade = any(s.action in ("rebuild", "remake") for s in steps)  # a new build or model: a new unit
    steps += server_steps(items, remade)
    if "bench" in items and items["bench"].drift and not remade:
        steps.append(Step("record", "bench", (items["bench"].wanted or {}).get("why")
                          or "no record for the build and model served"))  # fmt: skip
    if "llamarack" in items and items["llamarack"].drift:
        last = items["llamarack"].found
        steps.append(Step("record", "deployed-by", (f"last deployed by llamarack {last}" if last else
                                                    "no version recorded (deployed before llamarack recorded it)")
                          + f"; this is {items['llamarack'].wanted}"))
    return steps


def host_lines(a: HostAudit, refusal: str = "refused by preflight", nothing: str = "nothing changes") -> list:
    """A host's plan as text: why it cannot be told, or is refused, else each step."""
    if not a.reachable or a.error:
        return [f"{a.name}: cannot tell: {a.error}"]
    if refused(a):
        return [f"{a.name}: {refusal}: {'; '.join(refused(a))}"]
    steps = host_steps(a)
    head = f"{a.name}: " + (f"{len(steps)} change(s)" if steps else nothing)
    return [head] + [f"  {s.action:<9} {s.what}: {s.why}" for s in steps]


def as_text(audits: list[HostAudit]) -> str:
    lines = [line for a in audits for line in host_lines(a)]
    return "\n".join(lines + made_lines(audits)) + "\n"


def made_lines(audits: list[HostAudit]) -> list:
    """The ``builds:`` and ``models:`` the deploy makes and ships, a line each (none: none)."""
    builds, models = builds_made(audits), models_made(audits)
    return (["builds:"] + [f"  {b['line']}" for b in builds] if builds else []) + \
        (["models:"] + [f"  {m['line']}" for m in models] if models else [])  # fmt: skip


def builds_made(audits: list[HostAudit]) -> list[dict]:
    """The llama.cpp builds the deploy will make, one entry per build: on which host it is
    compiled (roles/llamacpp/ship.py: once per build key, by the first host of the run that
    reaches it, or by none where a host already holds it) and who receives it, with the bytes
    each receiving host gets (estimated from the sealed build it serves now)."""
    groups: dict = {}
    for a in audits:
        item = a.items.get("build") if a.reachable and not a.error and not refused(a) else None
        if item is not None:
            w = item.wanted or {}
            groups.setdefault(w.get("ship") or f"{w.get('stamp')}@{a.name}", []).append((a.name, item))
    made = []
    for key, members in groups.items():
        need = [name for name, item in members if item.drift and any(s.action == "rebuild" for s in build_steps(item))
                and not (item.wanted or {}).get("held")]  # fmt: skip
        if not need:
            continue
        wanted = members[0][1].wanted or {}
        holders = [name for name, item in members if (item.wanted or {}).get("held")]
        size = max((item.found or {}).get("bytes") or 0 for _, item in members)
        entry = {"stamp": wanted.get("stamp"), "shared": bool(wanted.get("ship")), "hosts": need,
                 "compiles": 0 if holders else 1 if wanted.get("ship") else len(need),
                 "source": holders[0] if holders else None, "bytes_each": size or None}  # fmt: skip
        each = f"about {size / 2**20:.0f} MiB each (the size of the build served now)" if size else "size known once built"
        if not wanted.get("ship"):
            entry["line"] = f"{entry['stamp']}: compiled on each of {', '.join(need)} (not shipped)"
        elif holders:
            entry["line"] = (f"{entry['stamp']}: nothing compiles; {', '.join(need)} receive it from {holders[0]}, "
                             f"which holds it, through this machine: {each}")  # fmt: skip
        else:
            entry["line"] = (f"{entry['stamp']}: compiled once, by the first of {', '.join(need)} to reach it"
                             + (f"; the other {len(need) - 1} receive it through this machine: {each}"
                                if len(need) > 1 else ""))  # fmt: skip
        made.append(entry)
    return made


def models_made(audits: list[HostAudit]) -> list[dict]:
    """The model artifacts the deploy will make, one entry per artifact (its stamp where the
    served record plans it, else the settings' model): with ``model_ship_artifacts`` made once
    (``llamarack/ship``: on a host whose blob cache holds the checkpoint where one does, else by
    the first host to reach it) and received by the others, with the bytes each gets
    (estimated from the GGUF it serves now); else made on each."""
    groups: dict = {}
    for a in audits:
        item = a.items.get("model") if a.reachable and not a.error and not refused(a) else None
        if item is not None and item.drift and model_step(item).action == "remake":
            w = item.wanted or {}
            label = w.get("stamp") or f"{w.get('repo')}@{w.get('revision')} {w.get('quant')}"
            groups.setdefault((label, bool(w.get("ship"))), []).append((a.name, item))
    made = []
    for (label, ship), members in groups.items():
        need = [name for name, _ in members]
        maker = next((name for name, item in members if item.wanted.get("cache_holds")), None)
        size = max((item.found or {}).get("bytes") or 0 for _, item in members)
        each = f"about {size / 2**20:.0f} MiB each (the size of the GGUF served now)" if size else "size known once made"
        entry = {"model": label, "shared": ship, "hosts": need, "makes": 1 if ship else len(need),
                 "maker": maker if ship else None, "bytes_each": size or None}  # fmt: skip
        if not ship:
            entry["line"] = f"{label}: made on each of {', '.join(need)} (not shipped)"
        else:
            where = (f"on {maker}, whose blob cache holds the checkpoint (the hub is asked for none of it)" if maker
                     else f"by the first of {', '.join(need)} to reach it (the checkpoint is fetched once)")
            rest = f"; the other {len(need) - 1} receive it through this machine: {each}" if len(need) > 1 else ""
            entry["line"] = f"{label}: made once, {where}{rest}"
        made.append(entry)
    return made


def refused(audit: HostAudit) -> list:
    """The preflight rules that would refuse the host (the deploy then changes nothing there)."""
    rules = audit.items.get("rules")
    return list(rules.found) if rules is not None and rules.drift else []


def as_json(audits: list[HostAudit]) -> dict:
    return {"schema": "llamarack-plan-upgrade/1",
            "hosts": {a.name: {"error": a.error if (a.error or not a.reachable) else None, "refused": refused(a),
                               "steps": [] if refused(a) else [asdict(s) for s in host_steps(a)]}
                      for a in audits},
            "builds": builds_made(audits), "models": models_made(audits)}

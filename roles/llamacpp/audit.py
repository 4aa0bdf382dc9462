"""The llamacpp role's audit item: the current build against the wanted stamp and its seal."""

from __future__ import annotations

import json
from typing import Any, Optional

from llamarack.audit import Item, Seen
from llamarack.facts import FactRead
from roles.settings import Settings

from .files.build_seal import BUILD_INPUTS
from .plan import plan_for_host, same_build
from .reads import BuildRecord, BuildSeals, CpuFlags, LlamacppBuilds
from .ship import build_key


def reads(settings: Settings, verify: bool = False) -> tuple[FactRead, ...]:
    """The builds, the current build's record and seals; ``verify``: its files hashed."""
    root = settings.general.root
    found = (FactRead.of(LlamacppBuilds, root=root), FactRead.of(BuildSeals, root=root),
             FactRead.of(BuildRecord, root=root), FactRead.of(CpuFlags))  # fmt: skip
    return found + ((FactRead.of(BuildSeals, root=root, sha256="current"),) if verify else ())


def items(seen: Seen) -> dict[str, Item]:
    settings, fact, root = seen.settings, seen.fact, seen.settings.general.root
    builds, seals = fact(LlamacppBuilds, root=root), fact(BuildSeals, root=root)
    record = fact(BuildRecord, root=root) or {}
    plan = plan_for_host(settings, seen.facts)
    proof = record.get("proof") or {}
    current = builds.current if builds else None
    files, files_drift = build_files(seals, current, fact(BuildSeals, root=root, sha256="current") if seen.verify else None)
    found = {"stamp": current, "commit": record.get("commit"), "cuda_archs": record.get("cuda_archs"),
             "proof": record.get("proof_id"), "smoke": proof.get("variant"),
             "smoke_tokens_per_second": proof.get("tokens_per_second"), "files": files}  # fmt: skip
    found["bytes"] = seals.bytes.get(current) if seals and current else None
    wanted = {"stamp": plan.stamp, "commit": settings.llamacpp.commit, "proof": plan.proof_id, "files": "as sealed",
              # hosts of the same key share one compile (ship.py); None: compiled on this host
              "ship": build_key(plan.stamp, plan.cmake_args, fact(CpuFlags)) if settings.llamacpp.ship_builds else None,
              "held": [name for name in (builds.newest_first() if builds else ()) if same_build(name, plan.stamp, seals)
                       and seals and name in seals.changed and not seals.tampered(name)]}  # fmt: skip
    same = same_build(current, plan.stamp, seals)
    if seals and current and seals.failed.get(current) == plan.proof_id:
        found["proof_failed"] = plan.proof_id  # the next deploy builds it again beside it
        same = False
    wanted["inputs_changed"] = [] if same else (changed_inputs(record, plan) or ["the build in place"])
    # A build of the wanted inputs proven by another proof is re-proved in place by the next deploy.
    reprove = same and found["proof"] != plan.proof_id
    return {"build": Item(found, wanted, drift=not same or files_drift or reprove)}


def changed_inputs(record: dict, plan) -> list[str]:
    """The build inputs (``BUILD_INPUTS``) the current build's record and the plan differ in."""
    planned = json.loads(plan.record())
    return [k for k in BUILD_INPUTS if json.dumps(record.get(k)) != json.dumps(planned.get(k))]


def build_files(seals, current: Optional[str], deep) -> tuple[Any, bool]:
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

"""The audit's ``rollout`` item: where ``llamarack rollout`` left the host
(``<root>/state/rollout.json``, written at each move: pending, staging, staged, draining,
deploying, gated, done, failed). Drift while the host is anywhere but done: it is staged and
not switched yet, drained on the gateway, or its stage, deploy or gate failed. A host never
rolled has no record and no drift."""

from __future__ import annotations

import json

from pyinfra.facts.files import FileContents

from llamarack.audit import Item, Seen
from llamarack.facts import FactRead

from .settings import Settings

RECORD = "rollout.json"


def reads(settings: Settings, verify: bool = False) -> tuple:
    return (FactRead.of(FileContents, path=settings.layout.state_file(RECORD)),)


def items(seen: Seen) -> dict:
    lines = seen.fact(FileContents, path=seen.settings.layout.state_file(RECORD))
    try:
        record = json.loads("\n".join(lines)) if lines else None
    except ValueError:
        record = {"state": "unreadable"}
    if not isinstance(record, dict):
        return {"rollout": Item(None)}
    found = {k: record.get(k) for k in ("state", "why", "at", "started")}
    return {"rollout": Item(found, {"state": "done"}, drift=found["state"] != "done")}

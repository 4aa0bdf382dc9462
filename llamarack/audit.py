"""``llamarack audit``'s report: its items, the answers a host gave, the JSON and the table.

Each role says what it audits (``roles/<role>/audit.py``: its items, the facts they read,
and ``items(seen)``: found against wanted, the wanted side from the deploy's own settings
loader and planners); ``roles/audit.py`` reads every role's facts of a host in one remote
command. docs/audit.md gives the items, the JSON (schema ``llamarack-audit/1``: ``wanted``
is null where the settings ask nothing of the item) and the exit status.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Optional

from .facts import FactRead

SCHEMA = "llamarack-audit/1"


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


class Answers:
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


@dataclass(frozen=True)
class Seen:
    """What one host answered, as each role's ``items(seen)`` looks at it: the host's
    settings, the rules' facts (``HostFacts``), every answer (``fact(Fact, **kwargs)``),
    the operator templates the deploy uses, and whether files are hashed (``--verify``)."""

    name: str
    settings: Any  # the host's settings (roles.settings.Settings)
    facts: Any  # what the rules read (roles.preflight.facts.HostFacts)
    fact: Answers
    templates: tuple = ()
    verify: bool = False


def iso(unix: Optional[float]) -> Optional[str]:
    """A Unix time as ISO 8601 in UTC (None stays None)."""
    import datetime

    return datetime.datetime.fromtimestamp(unix, datetime.timezone.utc).isoformat() if unix is not None else None


def link_name(link) -> Optional[str]:
    """The last part of a ``Link`` fact's target (a build's or a model's stamp), else None."""
    target = (link or {}).get("link_target")
    return os.path.basename(target.rstrip("/")) if target else None


def exit_status(audits: list[HostAudit]) -> int:
    if any(not a.reachable or a.error for a in audits):
        return 2
    return 1 if any(a.drift for a in audits) else 0


def as_json(audits: list[HostAudit]) -> dict:
    return {"schema": SCHEMA, "hosts": {a.name: a.to_json() for a in audits}}


def printable(text: str) -> str:
    """``text`` as a terminal may show it: every character that is not printable (ESC and the
    other controls, line and paragraph separators, bidi overrides, lone surrogates) spelled
    ``\\xNN``, ``\\uNNNN`` or ``\\UNNNNNNNN``. Hosts' text (a GPU process's name, an error) goes
    through here, so it cannot move the cursor, recolour or clear the operator's screen."""
    return "".join(c if c.isprintable() or c == " " else _escaped(ord(c)) for c in text)


def _escaped(code: int) -> str:
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


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
        host, error = printable(a.name), printable(str(a.error))
        if not a.reachable or (a.error and not a.items):
            out.append(paint(f"{host}: FAILED: {error}", fg="red", bold=True))
            continue
        drift = a.drift
        summary = f"{host}: {'drift in ' + ', '.join(drift) if drift else 'no drift'}"
        out.append(paint(summary, fg="yellow" if drift else "green", bold=True))
        if a.error:
            out.append(paint(f"  {error}", fg="red"))
        width = max(len(k) for k in a.items)
        for name, item in a.items.items():
            row = f" {'!' if item.drift else ' '} {name:<{width}}  {printable(_brief(item.found))[:90]}"
            if item.wanted not in (None, [], {}) and item.drift:
                row += f"   wanted: {printable(_brief(item.wanted))[:90]}"
            out.append(paint(row, fg="yellow") if item.drift else row)
    return "\n".join(out) + "\n"

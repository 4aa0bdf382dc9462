"""The driver role's audit item: its packages held, the module loaded the library's version."""

from __future__ import annotations

from llamarack.audit import Item, Seen
from llamarack.rules import driver_warnings
from llamarack.settings import Settings

ITEMS = ("driver",)


def reads(settings: Settings, verify: bool = False) -> tuple:
    return ()  # the rules' reads (preflight's) hold every driver fact


def items(seen: Seen) -> dict[str, Item]:
    facts, settings = seen.facts, seen.settings
    packages = facts.driver_packages
    module = facts.module.version if facts.module else None
    library = facts.driver.driver_version or facts.driver.library_version
    held = all(p.held for p in packages) if packages else None
    found = {"packages": {p.name: p.version for p in packages}, "held": held, "module": module, "library": library,
             "state": facts.driver.state, "warnings": list(driver_warnings(facts.driver))}  # fmt: skip
    wanted = {"held": settings.driver.hold_packages, "module": "same as the library"}
    drift = bool(packages) and held != settings.driver.hold_packages or bool(module and library and module != library)
    return {"driver": Item(found, wanted, drift=drift)}

"""The driver role's audit items: its packages held, the module loaded the library's version;
and how the cards are linked (``nvidia-smi topo -m``)."""

from llamarack.audit import Item, Seen
from llamarack.facts import FactRead
from roles.driver.rules import driver_warnings
from roles.settings import Settings

from .reads import GpuTopology, topology_summary


def reads(settings: Settings, verify: bool = False) -> tuple:
    # the rules' reads (preflight's) hold every other driver fact; the topology is the audit's own
    return (FactRead.of(GpuTopology),)


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
    return {"driver": Item(found, wanted, drift=drift), "topology": Item(topology_found(seen.fact.read(GpuTopology)))}


def topology_found(topology) -> dict:
    """The links per card pair: NVLinks by pair ("0-1": 2), the PCIe path of the others, a summary line."""
    return {"summary": topology_summary(topology),  # first: the audit's table shows the start of it
            "cards": len(topology.cards),
            "nvlink": {f"{x.first}-{x.second}": x.nvlinks for x in topology.links if x.nvlinks},
            "pcie": {f"{x.first}-{x.second}": x.link for x in topology.links if not x.nvlinks},
            "problem": topology.problem or None}

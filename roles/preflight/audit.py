"""Preflight's audit items: the GPUs the driver sees, the rules, the free disk."""

from __future__ import annotations

from pyinfra.facts.server import LinuxDistribution

from llamarack.audit import Item, Seen
from llamarack.facts import FactRead, FreeDiskBytes
from roles.preflight.rules import evaluate
from roles.settings import Settings

from llamarack import __version__

from .reads import DeployedBy, preflight_reads


def reads(settings: Settings, verify: bool = False) -> tuple[FactRead, ...]:
    """What the rules read (``gather``; the OS is preflight's own check), and the free disk."""
    rules = tuple(r for r in preflight_reads(settings) if r.fact is not LinuxDistribution)
    return rules + (FactRead.of(FreeDiskBytes, path=settings.general.root),)


def items(seen: Seen) -> dict[str, Item]:
    gpus = [{"name": g.name, "memory_mib": g.memory_mib, "compute_cap": g.compute_cap, "uuid": g.uuid}
            for g in seen.facts.gpus]  # fmt: skip
    failures = evaluate(seen.settings, seen.facts)
    deployer = seen.fact(DeployedBy, path=seen.settings.layout.deployed_by)
    return {"gpus": Item(gpus),
            "rules": Item([f.message(seen.name) for f in failures], [], drift=bool(failures)),
            "disk": Item({"free_bytes": seen.fact(FreeDiskBytes, path=seen.settings.general.root)}),
            # the version that last deployed the host, against this one: the next deploy records this one
            "llamarack": Item(deployer, __version__, drift=deployer != __version__)}

"""The toolchain role's audit item: the CUDA toolkit and the host compiler the build needs."""

from __future__ import annotations

from llamarack.audit import Item, Seen
from roles.settings import Settings

from .plan import plan_toolchain


def reads(settings: Settings, verify: bool = False) -> tuple:
    return ()  # the rules' reads (preflight's) hold the toolkits and the compilers


def items(seen: Seen) -> dict[str, Item]:
    settings, facts = seen.settings, seen.facts
    if settings.llamacpp.backend != "cuda":
        return {"toolchain": Item({"gcc": facts.gcc.default}, {"backend": "cpu"})}
    plan = plan_toolchain(settings, facts)
    found = {"toolkits": [t.version for t in facts.toolkits], "gcc": facts.gcc.default}
    wanted = {"toolkit": settings.toolchain.cuda_version, "host_compiler": plan.host_compiler if plan else None}
    return {"toolchain": Item(found, wanted, drift=plan is None or not plan.toolkit_installed)}

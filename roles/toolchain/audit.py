"""The toolchain role's audit item: the build packages, and the CUDA toolkit and the host
compiler a CUDA build needs."""

from __future__ import annotations

from pyinfra.facts.deb import DebPackages

from llamarack.audit import Item, Seen
from llamarack.facts import FactRead
from roles.settings import Settings

from .plan import BUILD_PACKAGES, plan_toolchain

def reads(settings: Settings, verify: bool = False) -> tuple:
    # the rules' reads (preflight's) hold the toolkits and the compilers; the packages are the role's
    return (FactRead.of(DebPackages),)

def items(seen: Seen) -> dict[str, Item]:
    """Drift where a package the role installs is missing (the deploy installs it again), or a
    CUDA build's toolkit is not installed."""
    settings, facts = seen.settings, seen.facts
    installed = seen.fact(DebPackages) or {}
    plan = plan_toolchain(settings, facts) if settings.llamacpp.backend == "cuda" else None
    wanted_packages = BUILD_PACKAGES + ([f"gcc-{plan.gcc_major}", f"g++-{plan.gcc_major}"]
                                        if plan and plan.install_gcc else [])  # fmt: skip
    missing = [p for p in wanted_packages if p not in installed]
    if settings.llamacpp.backend != "cuda":
        return {"toolchain": Item({"gcc": facts.gcc.default, "missing": missing},
                                  {"backend": "cpu", "packages": BUILD_PACKAGES}, drift=bool(missing))}  # fmt: skip
    found = {"toolkits": [t.version for t in facts.toolkits], "gcc": facts.gcc.default, "missing": missing}
    wanted = {"toolkit": settings.toolchain.cuda_version, "host_compiler": plan.host_compiler if plan else None,
              "packages": wanted_packages}  # fmt: skip
    return {"toolchain": Item(found, wanted, drift=plan is None or not plan.toolkit_installed or bool(missing))}

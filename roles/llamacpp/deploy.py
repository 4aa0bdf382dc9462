"""The role's one ``@deploy`` entry point (the role is described in ``__init__.py``)."""

import dataclasses

from pyinfra import host, logger
from pyinfra.api import deploy

from roles.llamacpp.reads import BuildSeals, CpuFlags, LlamacppBuilds
from llamarack.facts import read
from roles.preflight.facts import HostFacts
from roles.settings import Settings

from .operations import build, checkout, reprove, seal_build, switch_current
from .ship import build_key
from .plan import BuildPlan, build_dir_for, plan_for_host, same_build


@deploy("llama.cpp build")
def llamacpp(settings: Settings, facts: HostFacts) -> BuildPlan:
    """Check out the pinned llama.cpp, build it for this host if its inputs changed,
    verify the build and make it current.

    + settings: the host's settings (llamacpp, toolchain, server cache types, root)
    + facts: what preflight read (GPUs, toolkits, gcc)"""
    s = settings.llamacpp
    root, layout = settings.general.root, settings.layout
    plan = plan_for_host(settings, facts)
    # A build whose files no longer match their seal (a binary replaced or edited) is
    # not this build any more: it is made again beside, proven, and only then switched in.
    builds, seals = read(LlamacppBuilds, root=root), read(BuildSeals, root=root)
    where = build_dir_for(plan.stamp, builds, seals, proof_id=plan.proof_id)
    current = builds.current if same_build(builds.current, plan.stamp, seals) else None
    if current and where != current:
        why = (f"differs from its seal ({'; '.join(seals.changed[current][:3])})" if seals.tampered(current)
               else f"failed proof {plan.proof_id}" if seals.failed.get(current) == plan.proof_id else None)
        if why:
            logger.warning(f"{host.print_prefix}llama.cpp build {current} {why}: building it again as {where}")
    key = build_key(plan.stamp, plan.cmake_args, read(CpuFlags)) if s.ship_builds else None
    plan = dataclasses.replace(plan, stamp=where)

    checkout(name=f"llama.cpp source at {s.commit[:12]}", git_url=s.git_url, commit=s.commit, dest=layout.src)
    archs = f", sm_{'/'.join(plan.cuda_archs)}" if plan.cuda_archs else ""
    log = f"{layout.build(plan.stamp)}/build.log"
    built = build(name=f"Build llama.cpp {plan.stamp} ({plan.backend}{archs}; log: {log})", plan=plan, src=layout.src,
                  root=root, ccache_dir=s.ccache_dir, jobs=s.build_jobs, key=key)
    if built.will_change:
        logger.info(f"{host.print_prefix}llama.cpp build {plan.stamp} needed: a cold build takes minutes (CPU about "
                    f"11 min, CUDA for one arch about 50 min on 2 cores); follow it with: tail -f {log}"
                    + (" (made once in the run: the other hosts of the same build receive it)" if key else ""))
    else:
        reprove(name=f"Prove llama.cpp build {plan.stamp} again (proof {plan.proof_id}; nothing is rebuilt)",
                plan=plan, src=layout.src, root=root)
    seal_build(name=f"Seal llama.cpp build {plan.stamp} (its files' size, mtime, inode, sha256)",
               root=root, stamp=plan.stamp)
    switch_current(name=f"Make llama.cpp build {plan.stamp} current", root=root, stamp=plan.stamp)
    return plan

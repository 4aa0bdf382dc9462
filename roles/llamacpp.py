"""llama.cpp: pinned source, a build per input set, verified, then switched in.

    <root>/src/llama.cpp          the source at the pinned commit
    <root>/builds/<stamp>/        one build per input set (see llamarack.build)
    <root>/builds/current         link to the build in service

Same inputs: nothing runs. New inputs (commit, archs, toolkit, flags): a new
build directory, verified (``--version`` runs, cubins for every arch), then
``current`` is switched; the previous build stays for rollback. A failed
build stops the host before the switch, so the serving build is untouched.
"""

import dataclasses
import time

from pyinfra import host, logger
from pyinfra.api import deploy

from llamarack.build import BuildPlan, plan_build
from llamarack.facts import LlamacppBuilds
from llamarack.operations import build, checkout, prune_builds, switch_current
from llamarack.rules import HostFacts, build_archs, choose_host_compiler, toolkit_for
from llamarack.settings import Settings


# gcc ceilings (crt/host_config.h) of the toolkits the toolchain role can
# install (Debian 12's nvidia-cuda-toolkit, conda's cuda-nvcc), for a first
# run that plans the build before the toolkit is there to be read.
GCC_CEILING_OF_INSTALLABLE_TOOLKITS = {"11.8": 11}


def source_dir(settings: Settings) -> str:
    return f"{settings.general.root}/src/llama.cpp"


def plan_for_host(settings: Settings, facts: HostFacts) -> BuildPlan:
    """The build this host needs: archs from its GPUs, toolkit and host compiler from its facts."""
    if settings.llamacpp.backend != "cuda":
        plan = plan_build(settings)
    else:
        toolkit = toolkit_for(settings, facts)
        if toolkit is None:
            # The toolchain role installs a Debian or conda toolkit later in this same
            # run, so its header cannot be read yet: use the ceiling it is known to have.
            home = settings.toolchain.cuda_home or "/usr"
            version = settings.toolchain.cuda_version
            max_gcc = GCC_CEILING_OF_INSTALLABLE_TOOLKITS.get(version)
        else:
            home, max_gcc, version = toolkit.home, toolkit.max_gcc, toolkit.version
        try:
            major, _ = choose_host_compiler(max_gcc, facts.gcc, facts.gcc_installable)
        except LookupError:
            # apt had no lists to say what it can install: the toolchain role refreshes
            # them and installs gcc-<ceiling>, or stops the host before the build.
            major = max_gcc
        plan = plan_build(
            settings,
            archs=build_archs(settings, facts),
            cuda_home=home,
            cuda_version=version,
            host_compiler=f"/usr/bin/g++-{major}" if major else None,
        )
    if settings.llamacpp.force_rebuild:
        # A forced build gets its own directory: the one in service is never rebuilt in place.
        plan = dataclasses.replace(plan, stamp=f"{plan.stamp}-r{int(time.time())}")
    return plan


@deploy("llama.cpp build")
def llamacpp(settings: Settings, facts: HostFacts) -> BuildPlan:
    """
    Check out the pinned llama.cpp, build it for this host if its inputs changed,
    verify the build and make it current.

    + settings: the host's settings (llamacpp, toolchain, server cache types, root)
    + facts: what preflight read (GPUs, toolkits, gcc)
    """
    s = settings.llamacpp
    root = settings.general.root
    plan = plan_for_host(settings, facts)
    # The build serving before this run: kept for rollback whatever else was built since.
    serving = host.get_fact(LlamacppBuilds, root=root).current

    checkout(
        name=f"llama.cpp source at {s.commit[:12]}",
        git_url=s.git_url,
        commit=s.commit,
        dest=source_dir(settings),
    )
    built = build(
        name=f"Build llama.cpp {plan.stamp} ({plan.backend}"
        + (f", sm_{'/'.join(plan.cuda_archs)}" if plan.cuda_archs else "")
        + f"; log: {root}/builds/{plan.stamp}/build.log)",
        plan=plan,
        src=source_dir(settings),
        root=root,
        ccache_dir=s.ccache_dir,
        jobs=s.build_jobs,
    )
    if built.will_change:
        logger.info(
            f"{host.print_prefix}llama.cpp build {plan.stamp} needed: a cold build takes minutes "
            "(CPU about 11 min, CUDA for one arch about 50 min on 2 cores); "
            f"follow it with: tail -f {root}/builds/{plan.stamp}/build.log"
        )
    switch_current(name=f"Make llama.cpp build {plan.stamp} current", root=root, stamp=plan.stamp)
    prune_builds(
        name=f"Prune old llama.cpp builds (keep {s.keep_builds})",
        root=root,
        keep=s.keep_builds,
        current=plan.stamp,
        previous=serving,
    )
    return plan

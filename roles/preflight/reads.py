"""Every fact the roles will read on a host, for preflight to read in one remote command,
and ``gather``: the facts the rules look at, as ``HostFacts``.

The roles read their facts through ``llamarack.facts.read``; what preflight
read here answers them until an operation on the host changes something.
This list only saves round trips: a fact missing from it is read when a
role asks for it, one more command (the converged benchmark counts them).
"""

from __future__ import annotations

from pyinfra.facts.deb import DebPackages
from pyinfra.facts.files import File, FileContents, Link, Sha1File
from pyinfra.facts.server import Command, LinuxDistribution

from llamarack.roles.llamacpp.reads import BenchRecord, BuildSeals, GitHead, LlamacppBuilds, LlamaServerFlags
from llamarack.roles.driver.reads import (CharDevices, NvidiaDriverPackages, NvidiaKernelModule, NvidiaSmi,
    RecordedGpus)
from llamarack.roles.toolchain.reads import CmakeVersion, CudaToolkits, GccVersions, InstallableGccMajors
from llamarack.facts import FactRead, read
from llamarack.roles.model.reads import ModelArtifact
from llamarack.roles.python_env.reads import PythonEnvPackages, RequirementsFile
from llamarack.roles.server.reads import SystemUser, UnitState
from llamarack.layout import UNIT_NAME, UNIT_PATH
from llamarack.rules import HostFacts
from llamarack.settings import Settings

from ..server.plan import key_digest_command
from ..toolchain.plan import toolkit_search_homes


def preflight_reads(settings: Settings) -> tuple[FactRead, ...]:
    """What the rules look at (``gather``); the CUDA-only facts only on CUDA builds."""
    layout = settings.layout
    reads = [
        FactRead.of(LinuxDistribution),
        FactRead.of(NvidiaSmi),
        FactRead.of(NvidiaKernelModule),
        FactRead.of(GccVersions),
        FactRead.of(RecordedGpus, path=layout.gpus_record),
        FactRead.of(NvidiaDriverPackages),
    ]
    if settings.llamacpp.backend == "cuda":
        reads += [FactRead.of(CudaToolkits, extra_homes=toolkit_search_homes(settings)),
                  FactRead.of(InstallableGccMajors),
                  FactRead.of(CharDevices)]  # the driver's device names, for the unit  # fmt: skip
    return tuple(reads)


def role_reads(settings: Settings) -> tuple[FactRead, ...]:
    """What the roles that run on this host read on a converged host (deploy.py's order)."""
    runs, layout, root = settings.general.runs, settings.layout, settings.general.root
    reads: list[FactRead] = []
    if runs("toolchain"):
        reads += [FactRead.of(CmakeVersion), FactRead.of(DebPackages)]
    for role, env in (("python_env", "awq"), ("converter_env", "convert")):
        if runs(role):
            reads.append(FactRead.of(PythonEnvPackages, env=layout.env(env)))
            if settings.python_env.backend == "venv":
                reads.append(FactRead.of(DebPackages))
            else:
                reads += [FactRead.of(File, path=f"{layout.conda}/bin/conda"),
                          FactRead.of(File, path=f"{layout.env(env)}/bin/python")]  # fmt: skip
    if runs("converter_env"):
        reads.append(FactRead.of(RequirementsFile, path=layout.converter_requirements))
    if runs("llamacpp"):
        reads += [FactRead.of(LlamacppBuilds, root=root), FactRead.of(BuildSeals, root=root),
                  FactRead.of(GitHead, path=layout.src)]
    if runs("model"):
        reads += [FactRead.of(ModelArtifact, path=layout.current_model), FactRead.of(Link, path=layout.current_model)]
        if settings.model.draft_repo:
            reads += [FactRead.of(ModelArtifact, path=layout.draft_model), FactRead.of(Link, path=layout.draft_model)]
    if runs("server"):
        reads += [
            FactRead.of(LlamacppBuilds, root=root),
            FactRead.of(BuildSeals, root=root),  # a build differing from its seal is pruned
            FactRead.of(SystemUser, user=settings.general.service_user),
            FactRead.of(Link, path=layout.current_build),
            FactRead.of(Link, path=layout.current_model),
            *([FactRead.of(Link, path=layout.draft_model)] if settings.model.draft_repo else []),
            FactRead.of(LlamaServerFlags, root=root),
            FactRead.of(Sha1File, path=UNIT_PATH),
            FactRead.of(FileContents, path=UNIT_PATH),  # the build it names is kept by the prune
            FactRead.of(FileContents, path=layout.rollback_pin),  # `llamarack rollback` pinned the unit
            FactRead.of(File, path=f"{UNIT_PATH}.prev"),  # there: an earlier switch was cut off
            FactRead.of(Command, command=key_digest_command()),
            FactRead.of(UnitState, unit=UNIT_NAME),
            FactRead.of(BenchRecord, path=layout.bench_record),
        ]
    return tuple(reads)


def gather(settings: Settings, read=read) -> HostFacts:
    """Read everything the rules look at; the CUDA-only facts only on CUDA builds.

    + read: how a fact is read (``llamarack.facts.read``; ``llamarack audit`` passes
      the answers its one command got)
    """
    cuda = settings.llamacpp.backend == "cuda"
    return HostFacts(
        driver=read(NvidiaSmi),
        module=read(NvidiaKernelModule),
        toolkits=tuple(read(CudaToolkits, extra_homes=toolkit_search_homes(settings))) if cuda else (),
        gcc=read(GccVersions),
        gcc_installable=read(InstallableGccMajors) if cuda else (),
        recorded_gpus=read(RecordedGpus, path=settings.layout.gpus_record),
        # the driver the next boot loads: nvidia-smi cannot say when the module ignores the card
        driver_packages=tuple(read(NvidiaDriverPackages)),
    )

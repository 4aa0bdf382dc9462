"""Every fact the roles will read on a host, for preflight to read in one remote command
(the rules' own, and each role's part: ``roles/<role>/reads.py``), and ``gather``: the
facts the rules look at, as ``HostFacts``.

The roles read their facts through ``llamarack.facts.read``; what preflight
read here answers them until an operation on the host changes something.
This list only saves round trips: a fact missing from it is read when a
role asks for it, one more command (the converged benchmark counts them).
"""

from __future__ import annotations

import importlib

from pyinfra.facts.server import LinuxDistribution

from llamarack.facts import FactRead, read
from llamarack.roles import ROLES
from llamarack.roles.driver.reads import (CharDevices, MigStates, NvidiaDriverPackages, NvidiaKernelLog,
                                          NvidiaKernelModule, NvidiaPciCards, NvidiaSmi, RecordedGpus)
from llamarack.roles.server.reads import SystemGroup, SystemUser
from llamarack.roles.toolchain.plan import toolkit_search_homes
from llamarack.roles.toolchain.reads import CudaToolkits, GccVersions, InstallableGccMajors
from llamarack.rules import HostFacts
from llamarack.settings import Settings


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
    if settings.general.runs("server"):  # the service user the server role makes or takes on
        user = settings.general.service_user
        reads += [FactRead.of(SystemUser, user=user), FactRead.of(SystemGroup, group=user)]
    if settings.llamacpp.backend == "cuda":
        reads += [FactRead.of(CudaToolkits, extra_homes=toolkit_search_homes(settings)),
                  FactRead.of(InstallableGccMajors),
                  FactRead.of(CharDevices),  # the driver's device names, for the unit
                  FactRead.of(NvidiaPciCards), FactRead.of(NvidiaKernelLog),  # why a module is not loaded
                  FactRead.of(MigStates)]  # fmt: skip
    return tuple(reads)


def role_reads(settings: Settings) -> tuple[FactRead, ...]:
    """What the roles that run on this host read on a converged host, each role's part
    (``roles/<role>/reads.py``: ``reads(settings)``) in deploy.py's order."""
    found: list[FactRead] = []
    for role in ROLES:
        module = importlib.import_module(f"llamarack.roles.{role}.reads")
        if hasattr(module, "reads"):
            found += module.reads(settings)
    return tuple(found)


def gather(settings: Settings, read=read) -> HostFacts:
    """Read everything the rules look at; the CUDA-only facts only on CUDA builds.

    + read: how a fact is read (``llamarack.facts.read``; ``llamarack audit`` passes
      the answers its one command got)
    """
    cuda = settings.llamacpp.backend == "cuda"
    server, user = settings.general.runs("server"), settings.general.service_user
    return HostFacts(
        driver=read(NvidiaSmi),
        module=read(NvidiaKernelModule),
        toolkits=tuple(read(CudaToolkits, extra_homes=toolkit_search_homes(settings))) if cuda else (),
        gcc=read(GccVersions),
        gcc_installable=read(InstallableGccMajors) if cuda else (),
        recorded_gpus=read(RecordedGpus, path=settings.layout.gpus_record),
        # the driver the next boot loads: nvidia-smi cannot say when the module ignores the card
        driver_packages=tuple(read(NvidiaDriverPackages)),
        pci_cards=tuple(read(NvidiaPciCards)) if cuda else None,
        kernel_log=read(NvidiaKernelLog) if cuda else None,
        mig=tuple(read(MigStates)) if cuda else (),
        service_user=read(SystemUser, user=user) if server else None,
        service_group=read(SystemGroup, group=user) if server else None,
    )

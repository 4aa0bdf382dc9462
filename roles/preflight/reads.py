"""Every fact the roles will read on a host, for preflight to read in one remote command
(the rules' own, and each role's part: ``roles/<role>/reads.py``), and ``gather``: the
facts the rules look at, as ``HostFacts``. The list only saves round trips: a fact missing
from it is read when a role asks for it, one more command (the converged benchmark counts them).
"""

from __future__ import annotations

import json
import re
import shlex
from typing import Optional

from pyinfra.api import FactBase
from pyinfra.api.exceptions import FactProcessError
from pyinfra.facts.server import LinuxDistribution

from llamarack.facts import FactRead, read
from llamarack.facts.ownership import PathOwners
from roles import host_roles
from roles.gateway import reads as gateway
from roles.llamacpp import reads as llamacpp
from roles.model import reads as model
from roles.python_env import reads as python_env
from roles.server import reads as server
from roles.toolchain import reads as toolchain
from roles.driver.reads import (CharDevices, MigStates, NvidiaDriverPackages, NvidiaKernelLog,
                                          NvidiaKernelModule, NvidiaPciCards, NvidiaSmi, RecordedGpus)
from roles.model import calibration
from roles.server.reads import SystemGroup, SystemUser
from roles.toolchain.plan import toolkit_search_homes
from roles.toolchain.reads import CudaToolkits, GccVersions, InstallableGccMajors
from roles.preflight.facts import HostFacts
from roles.settings import Settings, private_dirs


def _private_paths(settings: Settings) -> tuple[str, ...]:
    """The directories the dirs-private rule looks at; none when the settings allow shared ones."""
    return () if settings.general.allow_shared_dirs else tuple(path for _, path in private_dirs(settings))


class DeployedBy(FactBase[Optional[str]]):
    """Returns the version of llamarack that last deployed the host
    (``<root>/state/deployed-by.json``, written at the end of every deploy), or None."""

    def command(self, path: str) -> str:
        return f"cat {shlex.quote(path)} 2>/dev/null; true"

    def process(self, output) -> Optional[str]:
        text = "\n".join(output).strip()
        if not text:
            return None
        try:
            version = json.loads(text).get("llamarack")
        except (ValueError, AttributeError) as e:
            raise FactProcessError(f"unreadable deployed-by.json: {e}") from e
        if not (isinstance(version, str) and re.fullmatch(r"[0-9A-Za-z.+!_-]{1,64}", version)):
            raise FactProcessError(f"deployed-by.json names no version: {text[:80]!r}")
        return version


def preflight_reads(settings: Settings) -> tuple[FactRead, ...]:
    """What the rules look at (``gather``); the CUDA-only facts only on CUDA builds."""
    layout = settings.layout
    reads = [FactRead.of(LinuxDistribution), FactRead.of(NvidiaSmi), FactRead.of(NvidiaKernelModule),
             FactRead.of(GccVersions), FactRead.of(RecordedGpus, path=layout.gpus_record),
             FactRead.of(NvidiaDriverPackages), FactRead.of(DeployedBy, path=layout.deployed_by)]
    if _private_paths(settings):
        reads.append(FactRead.of(PathOwners, paths=_private_paths(settings)))
    if settings.general.runs("server"):  # the service user the server role makes or takes on
        user = settings.general.service_user
        reads += [FactRead.of(SystemUser, user=user), FactRead.of(SystemGroup, group=user)]
    if settings.llamacpp.backend == "cuda":
        reads += [FactRead.of(CudaToolkits, extra_homes=toolkit_search_homes(settings)),
                  FactRead.of(InstallableGccMajors),
                  FactRead.of(CharDevices),  # the driver's device names, for the unit
                  FactRead.of(NvidiaPciCards), FactRead.of(NvidiaKernelLog),  # why a module is not loaded
                  FactRead.of(MigStates)]  # fmt: skip
    reads += calibration.reads(settings)  # route awq on the cards: the served artifact and its shape
    return tuple(reads)


# Each role's part of the one read (``roles/<role>/reads.py``: ``reads(settings)``); the
# driver's facts are the rules' own (``preflight_reads``).
ROLE_READS = {"toolchain": toolchain, "python_env": python_env, "llamacpp": llamacpp, "model": model,
              "server": server, "gateway": gateway}  # fmt: skip


def role_reads(settings: Settings) -> tuple[FactRead, ...]:
    """What the roles that run on this host read on a converged host, each role's part in
    deploy.py's order."""
    return tuple(r for role in host_roles(settings) if role in ROLE_READS for r in ROLE_READS[role].reads(settings))


def gather(settings: Settings, read=read, hub: bool = False) -> HostFacts:
    """Read everything the rules look at; the CUDA-only facts only on CUDA builds.

    + read: how a fact is read (``llamarack.facts.read``; ``llamarack audit`` passes
      the answers its one command got)
    + hub: also ask the hub, on the control machine, for the checkpoint's config.json
      where route awq calibrates one the served GGUF does not give the shape of
      (``calibration.hub_counts``): preflight's deploy; the audit never asks the hub"""
    cuda = settings.llamacpp.backend == "cuda"
    server, user = settings.general.runs("server"), settings.general.service_user
    builds = settings.general.runs("llamacpp")
    served_model, served_shape = calibration.served(settings, read)
    return HostFacts(driver=read(NvidiaSmi),
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
                     # the CPU a build of llamacpp_cpu_features runs on: the cpu-has-features rule
                     cpu_flags=read(llamacpp.CpuFlags) if settings.llamacpp.cpu_features and builds else None,
                     # who may write where root runs and builds: the dirs-private rule
                     path_owners=read(PathOwners, paths=paths) if (paths := _private_paths(settings)) else None,
                     service_user=read(SystemUser, user=user) if server else None,
                     service_group=read(SystemGroup, group=user) if server else None,
                     # route awq on the cards: what the calibration is counted from (the awq-card-memory rule)
                     served_model=served_model,
                     served_shape=served_shape,
                     hub_config=calibration.hub_counts(settings, served_model, served_shape) if hub else None)

"""Preflight: read the host's facts and run every compatibility rule before any change.

A host that fails a rule gets a single operation that prints the rule's
message and fails, so pyinfra stops that host and goes on with the others;
``deploy.py`` adds nothing more for it. With ``--dry`` the messages are
printed while the deploy is planned.
"""

from typing import Optional

from pyinfra import host, logger
from pyinfra.api import deploy
from pyinfra.facts.server import LinuxDistribution

from llamarack.facts import (
    CudaToolkits,
    GccVersions,
    InstallableGccMajors,
    NvidiaDriverPackages,
    NvidiaKernelModule,
    NvidiaSmi,
    RecordedGpus,
    read,
    read_together,
)
from llamarack.operations import record_gpus, refuse
from llamarack.rules import HostFacts, evaluate
from llamarack.settings import Settings

from ..toolchain.plan import toolkit_search_homes
from .reads import preflight_reads, role_reads


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


@deploy("llamarack preflight")
def preflight(settings: Settings) -> Optional[HostFacts]:
    """
    Run the compatibility rules; return the facts they read when the host may be
    changed (the later roles plan from them rather than read them again), else None.

    + settings: the host's settings (all roles: the rules span them)

    On success the GPU list is recorded under the llamarack root, so a later
    run can still tell which cards the host has when the driver hides them.
    """
    # One remote command for every fact the rules and the roles that run will read
    # (reads.py); they answer from it until an operation on this host changes something.
    read_together(*preflight_reads(settings), *role_reads(settings))
    distro = read(LinuxDistribution)
    if distro.get("name") not in ("Debian", "Ubuntu"):
        failures = [f"{host.name}: os: found {distro.get('name')}; needed Debian or Ubuntu "
                    "(apt, systemd). Fix: use a Debian or Ubuntu host"]  # fmt: skip
    else:
        facts = gather(settings)
        failures = [f.message(host.name) for f in evaluate(settings, facts)]

    if failures:
        for message in failures:
            logger.error(message)
        refuse(name="Preflight refused this host", reason="\n".join(failures))
        return None

    if facts.driver.gpus:
        record_gpus(name="Record the GPUs the driver lists", path=settings.layout.gpus_record,
                    gpus=facts.driver.gpus, recorded=facts.recorded_gpus)  # fmt: skip
    return facts

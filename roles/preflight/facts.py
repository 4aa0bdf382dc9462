"""What preflight reads of a host for the rules, and hands on to the later roles: ``HostFacts``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from llamarack.facts.ownership import PathOwnership

from ..driver.reads import DriverState, KernelLog, KernelModule
from ..model.calibration import HubCounts
from ..model.reads import ArtifactState
from ..server.reads import PasswdEntry
from ..toolchain.reads import GccInstall


@dataclass(frozen=True)
class HostFacts:
    """What the rules need to know about one host, read by the preflight role."""

    driver: DriverState
    module: Optional[KernelModule]
    toolkits: tuple = ()
    gcc: GccInstall = field(default_factory=lambda: GccInstall(None, {}))
    gcc_installable: tuple = ()
    """Majors N for which apt can install gcc-N (from ``apt-cache``)."""
    recorded_gpus: tuple = ()
    """GPUs seen at the last run where the driver answered (llamarack's state file)."""
    driver_packages: tuple = ()
    """The installed NVIDIA driver packages (``NvidiaDriverPackages``): the driver the
    next boot loads, which nvidia-smi cannot say when the module is not bound."""
    pci_cards: Optional[tuple] = None
    """The NVIDIA cards on the PCI bus (``NvidiaPciCards``), whatever the driver says; None if not read."""
    kernel_log: Optional[KernelLog] = None
    """What the kernel said of the driver this boot (``NvidiaKernelLog``)."""
    mig: tuple = ()
    """Each card's MIG mode and instances (``MigStates``)."""
    cpu_flags: Optional[str] = None
    """The CPU's ``/proc/cpuinfo`` flags (``CpuFlags``), read where ``llamacpp_cpu_features`` names
    the build's CPU code; None elsewhere, or where there is none."""
    path_owners: Optional[PathOwnership] = None
    """Owner and mode of each directory root runs or builds from and those above (``PathOwners``); None if not read."""
    service_user: Optional[PasswdEntry] = None
    """The account named ``llamarack_service_user`` (``SystemUser``); None if none or no server role runs."""
    service_group: Optional[int] = None
    """The gid of the group of that name (``SystemGroup``), None where there is none."""
    served_model: Optional[ArtifactState] = None
    """The artifact ``models/current`` points at (``ModelArtifact``), read where route awq
    calibrates on the host's cards (``roles/model/calibration.py``); None elsewhere."""
    served_shape: Optional[dict] = None
    """Its GGUF's shape (``GgufShape``), read where that GGUF is the one sealed; None elsewhere."""
    hub_config: Optional[HubCounts] = None
    """The counts of the checkpoint's ``config.json``, read from the hub by preflight's deploy where route
    awq calibrates on the cards a checkpoint the served GGUF does not give the shape of
    (``calibration.hub_counts``), or why they could not be; None elsewhere (the audit never asks the hub)."""

    @property
    def gpus(self) -> tuple:
        """The host's cards for this run, the one list every role plans from: those the driver lists,
        else (a driver that hides them: an upgrade waiting for its reboot, a dropped card) those it
        listed at the last run where it answered, less those the record keeps as missing since."""
        return self.driver.gpus or tuple(g for g in self.recorded_gpus if not g.missing)

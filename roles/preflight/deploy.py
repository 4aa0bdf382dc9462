"""The role's one ``@deploy`` entry point (the role is described in ``__init__.py``)."""

from dataclasses import replace
from typing import Optional

from pyinfra import host, logger
from pyinfra.api import deploy
from pyinfra.facts.server import LinuxDistribution

from llamarack.facts import FactRead, read, read_together
from llamarack import __version__
from llamarack.operations import record_deployment, refuse
from roles.driver.operations import record_gpus
from roles.model import calibration
from roles.preflight.facts import HostFacts
from roles.driver.rules import driver_warnings, fallen_gpus_warning, missing_gpus, missing_gpus_warning
from roles.preflight.rules import evaluate
from roles.settings import Settings

from .reads import DeployedBy, gather, preflight_reads, role_reads


@deploy("llamarack preflight")
def preflight(settings: Settings) -> Optional[HostFacts]:
    """Run the compatibility rules; return the facts they read when the host may be
    changed (the later roles plan from them rather than read them again), else None.

    + settings: the host's settings (all roles: the rules span them)

    On success the GPU list is recorded under the llamarack root, so a later
    run can still tell which cards the host has when the driver hides them."""
    # One remote command for every fact the rules and the roles that run will read (reads.py says how long it holds).
    read_together(*preflight_reads(settings), *role_reads(settings))
    failures = _os_failures()
    if not failures:
        facts = gather(settings, hub=True)  # the control machine asks the hub here, if route awq needs it
        failures = [f.message(host.name) for f in evaluate(settings, facts)]
    if failures:
        _refuse(failures)
        return None

    for warning in driver_warnings(facts.driver):
        logger.warning(f"{host.name}: nvidia-smi: {warning}")
    for rule, warning in (("gpu-on-bus", fallen_gpus_warning(settings, facts)),
                          ("gpus-missing", missing_gpus_warning(settings, facts)),
                          ("awq-card-memory", calibration.unchecked(facts.hub_config))):
        if warning:
            logger.warning(f"{host.name}: {rule}: {warning}")
    if facts.driver.gpus:
        # The cards gone since an earlier run stay recorded: the warning stands until they are back.
        record_gpus(name="Record the GPUs the driver lists", path=settings.layout.gpus_record,
                    gpus=tuple(facts.driver.gpus) + tuple(replace(g, missing=True) for g in missing_gpus(facts)),
                    recorded=facts.recorded_gpus)  # fmt: skip
    return facts


def _os_failures() -> list[str]:
    distro = read(LinuxDistribution)
    if distro.get("name") in ("Debian", "Ubuntu"):
        return []
    return [f"{host.name}: os: found {distro.get('name')}; needed Debian or Ubuntu "
            "(apt, systemd). Fix: use a Debian or Ubuntu host"]  # fmt: skip


def _refuse(failures: list[str]) -> None:
    for message in failures:
        logger.error(message)
    refuse(name="Preflight refused this host", reason="\n".join(failures))


@deploy("llamarack preflight (gateway)")
def gateway_preflight(settings: Settings) -> bool:
    """Preflight of a gateway (a host of group ``gateways``: HAProxy, no llama-server): the
    gateway role's facts in one read, and the OS check; no GPU, driver or toolkit rule
    applies. Returns whether the host may be changed.

    + settings: the host's settings"""
    read_together(FactRead.of(LinuxDistribution), *role_reads(settings))
    failures = _os_failures()
    if failures:
        _refuse(failures)
    return not failures


@deploy("llamarack deployed")
def deployed(settings: Settings):
    """Last of a run, once every role went through on this host: record the version of
    llamarack that deployed it (``Layout.deployed_by``; the audit shows it).

    + settings: the host's settings"""
    path = settings.layout.deployed_by
    record_deployment(name=f"Record llamarack {__version__} as this host's deployer", path=path,
                      version=__version__, recorded=read(DeployedBy, path=path))

"""The role's one ``@deploy`` entry point (the role is described in ``__init__.py``)."""

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.api.exceptions import DeployError
from pyinfra.operations import server

from roles.preflight.facts import HostFacts
from roles.settings import Settings

from .operations import driver_answers, driver_package_holds, record_gpus


@deploy("llamarack driver")
def driver(settings: Settings, facts: HostFacts):
    """Hold (or unhold) the driver packages; reboot once on a library/module mismatch if allowed.

    + settings: the host's settings (``driver_*``)
    + facts: what preflight read (the driver's state)

    Returns the reboot operation when one is planned (else None): the server role
    then checks ``/health`` after it even when the unit did not change."""
    s = settings.driver
    state = facts.driver
    reboot = None
    # The mismatch only ends with the reboot itself, so this branch is read
    # once, before anything runs; the check after the reboot reads nvidia-smi anew.
    if state.state == "mismatch":
        if not s.reboot_on_mismatch:
            raise DeployError(f"{host.name}: driver library {state.library_version} and loaded module differ and "
                              "driver_reboot_on_mismatch is off (preflight should have refused this host)")
        reboot = server.reboot(name="Reboot: NVIDIA driver library and loaded module differ", reboot_timeout=600)
        driver_answers(name="NVIDIA driver answers after the reboot",
                       reason="a reboot for the driver library/module mismatch", _if=reboot.did_change)  # fmt: skip
        # Preflight could not record the cards while the mismatch hid them.
        record_gpus(name="Record the GPUs the driver lists after the reboot", path=settings.layout.gpus_record,
                    _if=reboot.did_change)  # fmt: skip

    driver_package_holds(name="Hold the NVIDIA driver packages" if s.hold_packages else
                         "Unhold the NVIDIA driver packages", hold=s.hold_packages)
    return reboot

"""The deploys that ship with llamarack, in a checkout and in the wheel alike: pyinfra runs
them by name, nothing to copy.

    pyinfra -y INVENTORY roles.deploy.main            the main job: every role, in order
    pyinfra -y INVENTORY roles.deploy.rollback        what ``llamarack rollback`` runs
    pyinfra -y INVENTORY roles.deploy.stage           what ``llamarack rollout`` stages first

The checkout's ``deploy.py`` and ``rollback.py`` call them, and ``llamarack rollout`` rolls
``roles.deploy.main`` by default (a driver upgrade: ``roles.driver.upgrade.driver_upgrade``).
Each only composes the roles (docs/deploy.md says what each does).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

from pyinfra import host

from .driver.deploy import driver
from .gateway.deploy import gateway
from .llamacpp.deploy import llamacpp
from .model.deploy import model
from .preflight.deploy import deployed, gateway_preflight, preflight
from .python_env.deploy import converter_env, python_env
from .server.deploy import llama_server
from .server.operations import rollback as put_back
from .preflight.facts import HostFacts
from .settings import Settings, settings_for
from .toolchain.deploy import toolchain

# How `llamarack rollback --unit N` tells the rollback which unit (it runs under pyinfra).
ROLLBACK_UNIT_ENV = "LLAMARACK_ROLLBACK_UNIT"


def main(templates: Optional[tuple] = None) -> None:
    """Provision this host, role by role. ``templates``: folders of operator templates that
    replace the roles' own of the same name (see templates/README.md); None: ``./templates``
    where the deploy runs, when there is one."""
    if templates is None:
        templates = (Path("templates").resolve(),) if Path("templates").is_dir() else ()
    settings = settings_for(host)
    runs = settings.general.runs  # --data llamarack_roles=server,model runs only those

    # Preflight always runs, and hands on the facts it read: the later roles plan from them.
    # A gateway (group `gateways`) serves no model: no GPU rule, no serving role.
    facts = gateway_preflight(settings) if settings.is_gateway else preflight(settings)
    if facts and not settings.is_gateway:
        # The driver role's reboot (None when none is planned): the server role checks
        # /health after it even when the unit did not change.
        rebooted = driver(settings, facts) if runs("driver") else None
        make(settings, facts)
        if runs("server"):
            llama_server(settings, facts, templates=tuple(templates), rebooted=rebooted)
        deployed(settings)
    # Last, on every host from this one line: pyinfra orders the gateway role's operations after
    # every serving host's, so the gateways route to the units the server role just recorded.
    if facts and runs("gateway"):
        gateway(settings, templates=tuple(templates))


# What a stage makes beside what the host serves: every role of the main job that builds or
# fetches, none that switches, restarts or reboots (driver, server, gateway).
STAGED_ROLES = ("toolchain", "python_env", "llamacpp", "converter_env", "model")


def stage() -> None:
    """Make this host's next build and model beside what it serves, and prove them: the main
    job's preflight and its making roles (``STAGED_ROLES``; ``llamarack_roles`` narrows them
    further), never the driver, the units or the gateway. ``builds/current`` and
    ``models/current`` then name what the next deploy switches the units to; the units serve
    on, unchanged, until it does (docs/rollout.md, "Stage, then switch")."""
    settings = settings_for(host)
    facts = None if settings.is_gateway else preflight(settings)
    if facts:
        make(settings, facts)


def make(settings: Settings, facts: HostFacts) -> None:
    """The making roles (``STAGED_ROLES``) that ``llamarack_roles`` picks, in order."""
    runs = settings.general.runs
    if runs("toolchain"):
        toolchain(settings, facts)
    if runs("python_env"):
        python_env(settings, facts)
    if runs("llamacpp"):
        llamacpp(settings, facts)
    # The converter's requirements come from the llama.cpp checkout above.
    if runs("converter_env"):
        converter_env(settings)
    if runs("model"):
        model(settings)


def rollback(unit: Optional[int] = None) -> None:
    """Put back, on this host, the unit that served before the last switch (the server role's
    ``rollback``): the previous unit's build and model are switched in as any unit is
    (restart, ``/health``, the unit in place restored if it does not answer), and pinned so
    that a deploy with unchanged settings keeps it. No preflight: a rollback is what an
    operator reaches for when something is already wrong. ``unit``: only unit N (else
    ``LLAMARACK_ROLLBACK_UNIT``, else every unit with a previous one)."""
    if unit is None and os.environ.get(ROLLBACK_UNIT_ENV):
        unit = int(os.environ[ROLLBACK_UNIT_ENV])
    put_back(name="Put the previous llama-server unit back" + (f" (unit {unit})" if unit is not None else ""),
             settings=settings_for(host), unit=unit)

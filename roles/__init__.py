"""llamarack's roles, one folder each: the package ``roles``, beside ``llamarack``.

Each ``roles/<role>/`` holds the role's whole story (its settings, reads, rules, plan,
operations, audit items, its one ``@deploy``, the scripts it runs on a host and its
templates); its ``__init__.py`` only describes it, so that importing a plan (as
``llamarack audit`` does) imports no operation. docs/ARCHITECTURE.md ("One folder per
role") names each part; the roles import the core (``llamarack``), never the other way
round. Beside the roles: ``settings.py`` (a host's ``Settings``), ``deploy.py`` (the
deploys that ship), ``audit.py``, ``rollout.py`` and ``cli.py`` (the commands). How
another pyinfra deploy uses a role: docs/day2.md ("Using a role from another deploy").
"""

from pathlib import Path

from llamarack import remote

# Each role's host modules (``<role>/files/<name>.py``), found by name: ``remote.command(name)``.
remote.add_scripts(Path(__file__).resolve().parent)

# The roles, in the order deploy.py runs them.
ROLES = ("preflight", "driver", "toolchain", "python_env", "llamacpp", "model", "server", "gateway")
# What a host of the inventory group ``gateways`` runs after preflight's read, and is audited for.
GATEWAY_ROLES = ("gateway",)


def host_roles(settings) -> tuple:
    """The roles a host runs and is audited for: a gateway's (``GATEWAY_ROLES``), else all."""
    return GATEWAY_ROLES if settings.is_gateway else ROLES

"""llamarack's roles, one folder each: the package ``roles``, beside ``llamarack``.

Each ``roles/<role>/`` holds the role's whole story: its settings section
(``settings.py``: defaults, shapes, meanings), the facts it reads
(``reads.py``, and ``reads(settings)`` there: its part of preflight's one
read), its compatibility rules (``rules.py``, which preflight runs), its plan
(``plan.py``: pure functions of settings and facts), its
operations (``operations.py``), its audit items (``audit.py``:
``reads(settings, verify)``, ``items(seen)``), its one ``@deploy`` entry
point (``deploy.py``), the scripts it runs on a host (``files/``, standard
library only, each run by ``llamarack.remote.command(name, *args)``) and its
templates (``templates/``); its ``__init__.py`` only describes it, so that
importing a plan (as ``llamarack audit`` does) imports no operation. The roles
import the core (``llamarack``), never the other way round. Beside the roles:
``settings.py`` (a host's ``Settings``, every role's section), ``deploy.py``
(the deploys that ship: ``roles.deploy.main``, ``roles.deploy.rollback``),
``audit.py``, ``rollout.py`` and ``cli.py`` (the commands). Another pyinfra
deploy uses a role the way ``roles.deploy.main`` does:

    from pyinfra import host
    from roles.preflight.deploy import preflight
    from roles.server.deploy import llama_server
    from roles.settings import settings_for

    settings = settings_for(host)
    facts = preflight(settings)
    if facts:
        llama_server(settings, facts)
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

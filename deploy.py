"""The main job: provision each host of the inventory, role by role.

    pyinfra inventory/lab.py deploy.py

Only composes the roles (the package ``roles``, the folders under roles/); each
reads facts and changes only what differs, so a converged host is a chain of
no-ops. Preflight runs every compatibility rule first: a host that fails one
gets no other operation. The hosts of group ``gateways`` run preflight's read
and the gateway role only: HAProxy in front of every serving host's units.
"""

from pathlib import Path

from pyinfra import host

from roles.driver.deploy import driver
from roles.gateway.deploy import gateway
from roles.llamacpp.deploy import llamacpp
from roles.model.deploy import model
from roles.preflight.deploy import deployed, gateway_preflight, preflight
from roles.python_env.deploy import converter_env, python_env
from roles.server.deploy import llama_server
from roles.toolchain.deploy import toolchain
from roles.settings import settings_for

# Templates here replace the roles' own of the same name (see templates/README.md).
TEMPLATE_OVERRIDES = (Path(__file__).resolve().parent / "templates",)

settings = settings_for(host)
runs = settings.general.runs  # --data llamarack_roles=server,model runs only those

# Preflight always runs, and hands on the facts it read: the later roles plan from them.
# A gateway (group `gateways`) serves no model: no GPU rule, no serving role.
facts = gateway_preflight(settings) if settings.is_gateway else preflight(settings)
if facts and not settings.is_gateway:
    # The driver role's reboot (None when none is planned): the server role checks
    # /health after it even when the unit did not change.
    rebooted = driver(settings, facts) if runs("driver") else None
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
    if runs("server"):
        llama_server(settings, facts, templates=TEMPLATE_OVERRIDES, rebooted=rebooted)
    deployed(settings)
# Last, on every host from this one line: pyinfra orders the gateway role's operations after
# every serving host's, so the gateways route to the units the server role just recorded.
if facts and runs("gateway"):
    gateway(settings, templates=TEMPLATE_OVERRIDES)

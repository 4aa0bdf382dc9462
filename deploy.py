"""The main job: provision each host of the inventory, role by role.

    pyinfra inventory/lab.py deploy.py

Only composes the roles; each reads facts and changes only what differs, so
a converged host is a chain of no-ops. Preflight runs every compatibility
rule first: a host that fails one gets no other operation.
"""

from pyinfra import host

from llamarack.settings import settings_for
from roles.driver import driver
from roles.llamacpp import llamacpp
from roles.model import model
from roles.preflight import preflight
from roles.python_env import converter_env, python_env
from roles.server import llama_server
from roles.toolchain import toolchain

settings = settings_for(host)
runs = settings.general.runs  # --data llamarack_roles=server,model runs only those

# Preflight always runs, and hands on the facts it read: the later roles plan from them.
facts = preflight(settings)
if facts:
    if runs("driver"):
        driver(settings)
    if runs("toolchain"):
        toolchain(settings)
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
        llama_server(settings, facts)

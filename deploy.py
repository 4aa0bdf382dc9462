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

# Preflight hands on the facts it read: the later roles plan from them.
facts = preflight(settings)
if facts:
    driver(settings)
    toolchain(settings)
    python_env(settings, facts)
    llamacpp(settings, facts)
    # The converter's requirements come from the llama.cpp checkout above.
    converter_env(settings)
    model(settings)
    llama_server(settings, facts)

"""The main job: provision each host of the inventory, role by role.

    pyinfra inventory/lab.py deploy.py

Only composes the roles; each reads facts and changes only what differs.
"""

from pyinfra import host

from llamarack.settings import settings_for
from roles.preflight import preflight

settings = settings_for(host)

if preflight(settings):
    pass  # the host-stack, build, model and server roles follow here as they land

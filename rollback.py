"""``llamarack rollback``: put back, on each host, the unit that served before the last switch.

    llamarack rollback inventory/lab.py [--limit HOST]
    (the same as: pyinfra -y inventory/lab.py rollback.py [--limit HOST])

Only composes the server role's ``rollback`` operation (roles/server/operations.py):
the previous unit's build and model are switched in as any unit is (restart,
``/health``, the unit in place restored if it does not answer), and pinned so that
a deploy with unchanged settings keeps it. No preflight: a rollback is what an
operator reaches for when something is already wrong.
"""

from pyinfra import host

from llamarack.roles.server.operations import rollback
from llamarack.settings import settings_for

rollback(name="Put the previous llama-server unit back", settings=settings_for(host))

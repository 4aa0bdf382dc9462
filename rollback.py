"""``llamarack rollback``: put back, on each host, the unit that served before the last switch.

    llamarack rollback inventory/lab.py [--limit HOST] [--unit N]
    (the same as: pyinfra -y inventory/lab.py rollback.py [--limit HOST];
    --unit N is LLAMARACK_ROLLBACK_UNIT=N in its environment)

Only composes the server role's ``rollback`` operation (roles/server/operations.py):
the previous unit's build and model are switched in as any unit is (restart,
``/health``, the unit in place restored if it does not answer), and pinned so that
a deploy with unchanged settings keeps it. No preflight: a rollback is what an
operator reaches for when something is already wrong.
"""

import os

from pyinfra import host

from roles.cli import ROLLBACK_UNIT_ENV
from roles.server.operations import rollback
from roles.settings import settings_for

unit = os.environ.get(ROLLBACK_UNIT_ENV)
rollback(name="Put the previous llama-server unit back" + (f" (unit {int(unit)})" if unit else ""),
         settings=settings_for(host), unit=int(unit) if unit else None)

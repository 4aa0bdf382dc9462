"""``llamarack rollback``: put back, on each host, the unit that served before the last switch.

    llamarack rollback inventory/lab.py [--limit HOST] [--unit N]
    (the same as: pyinfra -y inventory/lab.py rollback.py [--limit HOST];
    --unit N is LLAMARACK_ROLLBACK_UNIT=N in its environment)

The checkout's entry to the rollback that ships with llamarack (``roles/deploy.py``:
``pyinfra -y inventory/lab.py roles.deploy.rollback``).
"""

from roles.deploy import rollback

rollback()

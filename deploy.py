"""The main job: provision each host of the inventory, role by role.

    pyinfra inventory/lab.py deploy.py

The checkout's entry to the deploy that ships with llamarack (``roles/deploy.py``: the
same as ``pyinfra inventory/lab.py roles.deploy.main``), with this checkout's operator
templates (templates/, see templates/README.md).
"""

from pathlib import Path

from roles.deploy import main

main(templates=(Path(__file__).resolve().parent / "templates",))

"""Shared test setup: the lab's pytest plugin gives lab tests a rack of real hosts."""

import sys
from pathlib import Path

# deploy.py and roles/ live at the project root, beside the llamarack package; the lab
# (its own package, llamarack_lab) in lab/: this checkout's own, whichever one pip installed.
ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "lab")]

import roles  # noqa: E402,F401 (the roles' host modules, found by name: llamarack.remote)

pytest_plugins = ["llamarack_lab.pytest_plugin"]


def pytest_collection_modifyitems(session, config, items):
    """Run the lab's up/down lifecycle test first: it needs the machine with
    no rack up, and the session rack of the other lab tests stays up until
    the end (the bridge and addresses are fixed, so one rack at a time)."""
    first = [i for i in items if i.path.name == "test_lab_lifecycle.py"]
    items[:] = first + [i for i in items if i not in first]

"""Shared test setup: the lab's pytest plugin gives lab tests a rack of real hosts."""

import sys
from pathlib import Path

# deploy.py and roles/ live at the project root, beside the llamarack package.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

pytest_plugins = ["llamarack.lab.pytest_plugin"]


def pytest_collection_modifyitems(session, config, items):
    """Run the lab's up/down lifecycle test first: it needs the machine with
    no rack up, and the session rack of the other lab tests stays up until
    the end (the bridge and addresses are fixed, so one rack at a time)."""
    first = [i for i in items if i.path.name == "test_lab_lifecycle.py"]
    items[:] = first + [i for i in items if i not in first]

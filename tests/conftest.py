"""Shared test setup: the lab's pytest plugin gives lab tests a rack of real hosts."""

import sys
from pathlib import Path

# deploy.py and roles/ live at the project root, beside the llamarack package.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

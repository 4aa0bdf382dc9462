"""The driver upgrade's own deploy (roles/driver/upgrade.py, shipped with llamarack):
docs/rollout.md carries its code as the procedure, and it checks the version's shape
before it uses it (the lab's rollout test runs it through four hosts with reboots)."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "roles/driver/upgrade.py"


def _code() -> str:
    return DEPLOY.read_text().split('"""', 2)[2].strip("\n")


def _version_pattern() -> str:
    return re.search(r're\.fullmatch\(r"([^"]+)"', _code()).group(1)


def test_the_docs_carry_the_deploy_file_as_it_is():
    docs = (ROOT / "docs/rollout.md").read_text()
    block = "\n".join(("    " + line) if line else "" for line in _code().split("\n"))
    assert block in docs


@pytest.mark.parametrize("version", ["580.95.05-1", "550.144.03-1", "535.216.01-0ubuntu1", "1:580.95.05-1~deb12"])
def test_debian_versions_pass(version):
    assert re.fullmatch(_version_pattern(), version)


@pytest.mark.parametrize("version", ["580.95.05", "1;rm -rf /-1", "$(id)-1", "580.95.05-1 nvidia-driver", "-1", ""])
def test_anything_else_is_refused(version):
    assert not re.fullmatch(_version_pattern(), version)

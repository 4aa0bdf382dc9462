"""Upgrading llamarack itself, on a converged host: a new proof re-proves, it rebuilds nothing.

The next llamarack is this tree copied, with its smoke script changed: first by a
comment (the proof's id changes, what it checks does not), then by a flag the
served build does not have (a proof the build fails). The copy runs the way an
operator runs an upgraded checkout: its own deploy.py and inventory, its own
package first on PYTHONPATH. Tests run in order and share the host.
"""

import json
import os
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from llamarack_lab.pytest_plugin import parse_pyinfra_totals
from tests.lab import deploying

pytestmark = pytest.mark.lab

HOST = "lab-v100-32"
URL = "http://10.77.0.13:8080"  # inventory/lab.py's address of HOST
PROOF = "roles/llamacpp/files/llamacpp_proof.py"
CURRENT = "/opt/llamarack/builds/current"
SERVICE = "systemctl show -p MainPID -p NRestarts llamarack-server.service"


@pytest.fixture(scope="module")
def next_tree(tmp_path_factory):
    """This checkout copied (without its caches): the llamarack an operator upgrades to."""
    tree = tmp_path_factory.mktemp("next") / "llamarack"
    shutil.copytree(deploying.ROOT, tree, symlinks=True, ignore=shutil.ignore_patterns(
        ".git", ".carry", ".whl", ".pytest_cache", "__pycache__", "*.egg-info", "bench"))
    return tree


@pytest.fixture
def upgraded(next_tree, monkeypatch):
    """Commands run with the copy's llamarack (its package first on the path)."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(next_tree), os.environ.get("PYTHONPATH")])))
    return next_tree


def edit_proof(tree: Path, old: str, new: str) -> None:
    path = tree / PROOF
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))


def plan_upgrade(tree: Path) -> str:
    r = subprocess.run([sys.executable, "-m", "llamarack", "plan-upgrade", "inventory/lab.py", "--limit", HOST],
                       cwd=tree, capture_output=True, text=True, timeout=300)
    assert r.returncode in (0, 1), r.stdout + r.stderr
    return r.stdout


def sh(lab_rack, command: str) -> str:
    return deploying.sh(lab_rack, HOST, command)


def proof_id(lab_rack) -> str:
    return json.loads(sh(lab_rack, f"cat {CURRENT}/build-info.json"))["proof_id"]


def health() -> int:
    with urllib.request.urlopen(f"{URL}/health", timeout=30) as r:
        return r.status


def test_converged_with_this_llamarack(lab_rack):
    rc, out = deploying.deploy(lab_rack, HOST)
    assert rc == 0, out[-3000:]
    rc, out = deploying.deploy(lab_rack, HOST)
    assert rc == 0 and parse_pyinfra_totals(out)["success"] == 0, out[-3000:]


def test_a_changed_comment_in_the_proof_reproves_once_and_restarts_nothing(lab_rack, upgraded):
    edit_proof(upgraded, "# Runs on the host", "# A newer llamarack's comment.\n# Runs on the host")
    planned = plan_upgrade(upgraded)
    assert "re-prove" in planned and "rebuild" not in planned and "restart" not in planned, planned
    builds, service, before = sh(lab_rack, "ls /opt/llamarack/builds"), sh(lab_rack, SERVICE), proof_id(lab_rack)

    rc, out = deploying.deploy(lab_rack, HOST, checkout=upgraded)
    assert rc == 0, out[-3000:]
    assert "Prove llama.cpp build" in out and parse_pyinfra_totals(out)["success"] == 1, out[-3000:]
    assert sh(lab_rack, "ls /opt/llamarack/builds") == builds, "nothing is built"
    assert sh(lab_rack, SERVICE) == service, "the server was not restarted"
    assert proof_id(lab_rack) != before

    state = deploying.state(lab_rack, HOST)
    rc, out = deploying.deploy(lab_rack, HOST, checkout=upgraded)
    assert rc == 0 and parse_pyinfra_totals(out)["success"] == 0, out[-3000:]
    assert deploying.state(lab_rack, HOST) == state
    assert "nothing changes" in plan_upgrade(upgraded)


def test_a_proof_the_build_fails_leaves_the_server_serving(lab_rack, upgraded):
    edit_proof(upgraded, 'args = ["--cache-type-k",', 'args = ["--llamarack-required-flag", "--cache-type-k",')
    service, builds = sh(lab_rack, SERVICE), sh(lab_rack, "ls /opt/llamarack/builds")

    rc, out = deploying.deploy(lab_rack, HOST, checkout=upgraded)
    assert rc != 0 and "fails the new proof" in out, out[-3000:]
    assert sh(lab_rack, SERVICE) == service and health() == 200, "the previous deployment keeps serving"
    assert sh(lab_rack, "ls /opt/llamarack/builds") == builds
    failed = json.loads(sh(lab_rack, f"cat {CURRENT}/proof-failed.json"))
    assert failed["why"] and failed["proof_id"] != proof_id(lab_rack), failed
    # The seal still holds: the failed proof wrote beside the build, not into it.
    seen = json.loads(subprocess.run([sys.executable, "-m", "llamarack", "audit", "inventory/lab.py", "--limit", HOST,
                                      "--json"], cwd=upgraded, capture_output=True, text=True, timeout=300).stdout)
    build = seen["hosts"][HOST]["items"]["build"]
    assert build["found"]["files"] == "as sealed" and build["found"]["proof_failed"] == failed["proof_id"], build
    assert "beside itself" in plan_upgrade(upgraded)


def test_back_to_this_llamarack_reproves_and_converges(lab_rack):
    service = sh(lab_rack, SERVICE)
    rc, out = deploying.deploy(lab_rack, HOST)
    assert rc == 0 and "Prove llama.cpp build" in out, out[-3000:]
    assert sh(lab_rack, SERVICE) == service
    rc, out = deploying.deploy(lab_rack, HOST)
    assert rc == 0 and parse_pyinfra_totals(out)["success"] == 0, out[-3000:]

"""The llama.cpp role on a lab host, through the real deploy.py over SSH.

A real CPU build from the lab's pinned git mirror; a second run builds
nothing and leaves the host as it was; a new commit builds a new directory
and switches to it, keeping the previous one; a commit that fails to build
leaves the serving build current. Tests run in order and share the host.
"""

import pytest

from llamarack.facts import parse_server_help
from llamarack.lab import mirror, services
from llamarack.lab.pytest_plugin import parse_pyinfra_totals
from tests.lab import deploying

pytestmark = pytest.mark.lab

HOST = "lab-v100-a"
BUILDS = "/opt/llamarack/builds"


def deploy(lab_rack, *data: str):
    return deploying.deploy(lab_rack, HOST, *data)


def sh(lab_rack, command: str) -> str:
    return deploying.sh(lab_rack, HOST, command)


def snapshot(lab_rack) -> str:
    """Everything llamarack owns on the host: paths, sizes, mtimes, link targets."""
    return sh(lab_rack, "find /opt/llamarack -printf '%p %s %T@ %l\\n' | sort")


SEEN = {}  # what earlier tests of this module saw


def current(lab_rack) -> str:
    return sh(lab_rack, f"readlink {BUILDS}/current")


@pytest.fixture(scope="module")
def lab_mirror():
    return services.prepare()


def test_first_deploy_builds_verifies_and_switches(lab_rack):
    rc, out = deploy(lab_rack)
    assert rc == 0, out[-4000:]
    stamp = SEEN["pinned"] = current(lab_rack)
    SEEN["pinned_record"] = sh(lab_rack, f"stat -c %Y {BUILDS}/{stamp}/build-info.json")
    assert sh(lab_rack, f"cat {BUILDS}/{stamp}/build-info.json").count(mirror.LAB_COMMIT) == 1
    version = sh(lab_rack, f"{BUILDS}/current/bin/llama-server --version 2>&1")
    assert mirror.LAB_COMMIT[:9] in version
    assert sh(lab_rack, "git -C /opt/llamarack/src/llama.cpp rev-parse HEAD") == mirror.LAB_COMMIT


def test_second_deploy_changes_nothing_on_the_host(lab_rack):
    before = snapshot(lab_rack)
    rc, out = deploy(lab_rack)
    assert rc == 0, out[-4000:]
    totals = parse_pyinfra_totals(out)
    assert totals["success"] == 0 and totals["error"] == 0, out[-4000:]
    assert "cmake" not in out
    assert snapshot(lab_rack) == before


def test_flags_record_is_right_for_the_pinned_version(lab_rack):
    flags = parse_server_help(sh(lab_rack, f"cat {BUILDS}/current/server-help.txt"))
    # The pinned llama.cpp dropped --no-mmap for --load-mode, and --flash-attn takes a value.
    assert flags.mmap_off == ("--load-mode", "none")
    assert flags.flash_attn_takes_value
    assert flags.flash_attn(True) == ("--flash-attn", "on")
    assert flags.has_api_key_file and flags.has_metrics


def test_new_commit_rebuilds_switches_and_keeps_the_previous_build(lab_rack, lab_mirror):
    old = current(lab_rack)
    commit = mirror.add_commit(lab_mirror, "lab-test-change", "lab test: a new commit",
                               {"README.md": "\nA change from the llamarack lab tests.\n"})  # fmt: skip
    rc, out = deploy(lab_rack, f"llamacpp_commit={commit}")
    assert rc == 0, out[-4000:]
    new = current(lab_rack)
    assert new != old
    assert commit[:9] in sh(lab_rack, f"{BUILDS}/current/bin/llama-server --version 2>&1")
    assert sh(lab_rack, f"test -f {BUILDS}/{old}/build-info.json && echo kept") == "kept"


def test_commit_that_fails_to_build_leaves_the_current_build(lab_rack, lab_mirror):
    serving = current(lab_rack)
    broken = mirror.add_commit(lab_mirror, "lab-test-broken", "lab test: does not compile",
                               {"tools/server/server.cpp": "\n#error broken on purpose by the lab tests\n"})  # fmt: skip
    rc, out = deploy(lab_rack, f"llamacpp_commit={broken}")
    assert rc != 0
    assert "broken on purpose" in out
    assert current(lab_rack) == serving
    assert sh(lab_rack, f"{BUILDS}/current/bin/llama-server --version > /dev/null 2>&1 && echo runs") == "runs"


def test_back_to_the_pinned_commit_switches_without_building(lab_rack):
    rc, out = deploy(lab_rack)
    assert rc == 0, out[-4000:]
    assert current(lab_rack) == SEEN["pinned"]
    # Not rebuilt: the record of the verified build is the one written by the first deploy.
    assert sh(lab_rack, f"stat -c %Y {BUILDS}/{SEEN['pinned']}/build-info.json") == SEEN["pinned_record"]
    # The build in service and the one before it remain; the failed build directory is gone.
    assert sh(lab_rack, f"cd {BUILDS} && ls -d */ | grep -vc current") == "2"

"""Day-2 operations on one lab host, through deploy.py, rollback.py and the audit over SSH
rollback by command, a tampered build file, an edit only --verify sees, and
the /health check after a driver upgrade's reboot.

The tests run in order on lab-v100-a, each from the state the one before left. The fake
NVIDIA driver is the one test double (no GPU can exist in the lab).
"""

import json
import subprocess
import sys

import pytest

from llamarack_lab import mirror, services
from llamarack_lab.fake_nvidia import deb
from llamarack_lab.pytest_plugin import parse_pyinfra_totals
from tests.lab import deploying

pytestmark = pytest.mark.lab

HOST = "lab-v100-a"
ROOT = "/opt/llamarack"
UNIT = "/etc/systemd/system/llamarack-server.service"


def sh(lab_rack, command: str) -> str:
    return deploying.sh(lab_rack, HOST, command)


def deploy(lab_rack, *data: str):
    return deploying.deploy(lab_rack, HOST, *data)


def converged(lab_rack, *data: str) -> None:
    """A run that changes nothing: by pyinfra's count, and by the host's real state."""
    before = deploying.state(lab_rack, HOST)
    rc, out = deploy(lab_rack, *data)
    assert rc == 0 and parse_pyinfra_totals(out)["success"] == 0, out[-6000:]
    assert deploying.state(lab_rack, HOST) == before


def audit(*args: str) -> tuple[int, dict]:
    r = subprocess.run([sys.executable, "-m", "llamarack", "audit", str(deploying.ROOT / "inventory/lab.py"), "--json",
                        "--limit", HOST, *args], cwd=deploying.ROOT, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert r.stdout.strip().startswith("{"), r.stderr[-3000:]
    return r.returncode, json.loads(r.stdout)["hosts"][HOST]


def served_build(lab_rack) -> str:
    return sh(lab_rack, f"sed -n 's|^ExecStart={ROOT}/builds/\\([^/]*\\)/.*|\\1|p' {UNIT}")


def current_build(lab_rack) -> str:
    return sh(lab_rack, f"readlink {ROOT}/builds/current")


@pytest.fixture(scope="module", autouse=True)
def driver_restored_afterwards(lab_rack):
    yield
    lab_rack.driver(HOST, version=deb.DEFAULT_VERSION, state="ok")


@pytest.fixture(scope="module")
def bump():
    """A later llama.cpp commit of the lab's mirror (a harmless change): a new build input."""
    return mirror.add_named_commit(services.prepare(), "lab-test-bump", "lab test: a later llama.cpp", mirror.GOOD_BUMP)


def test_rollback_puts_the_previous_build_back_and_a_deploy_keeps_it_until_the_settings_change(lab_rack, bump):
    rc, out = deploy(lab_rack)
    assert rc == 0, out[-6000:]
    first = current_build(lab_rack)
    # a proven build is sealed: every file it serves with, with its signature and sha256
    manifest = json.loads(sh(lab_rack, f"cat {ROOT}/builds/current/manifest.json"))
    paths = {e["path"] for e in manifest["files"]}
    assert {"build/bin/llama-server", "build/bin/llama-quantize", "server-help.txt", "build-info.json"} <= paths
    # A new commit is a new build (and a new artifact, converted by its converter) and a new unit.
    first_unit = sh(lab_rack, f"sha256sum < {UNIT}")
    rc, out = deploy(lab_rack, f"llamacpp_commit={bump}")
    assert rc == 0, out[-6000:]
    second = current_build(lab_rack)
    assert second != first and served_build(lab_rack) == second

    r = subprocess.run([sys.executable, "-m", "llamarack", "rollback", str(deploying.ROOT / "inventory/lab.py"),
                        "--limit", HOST], cwd=deploying.ROOT, capture_output=True, text=True, timeout=900)  # fmt: skip
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-6000:]
    assert f"rolling back to build {first}, model " in out and f"(from build {second}, model " in out, out[-6000:]
    assert served_build(lab_rack) == first and sh(lab_rack, f"sha256sum < {UNIT}") == first_unit
    assert sh(lab_rack, "systemctl is-active llamarack-server.service") == "active"
    deploying.completes(lab_rack, HOST)
    pin = json.loads(sh(lab_rack, f"cat {ROOT}/state/rollback.json"))
    assert pin["unit_sha1"] == sh(lab_rack, f"sha1sum < {UNIT}").split()[0]
    # the audit (the inventory's own settings, which want the first build and model) shows
    # the pin holding the unit put back against the one the links would give (builds/current
    # and models/current still name the second build and model, which the unit no longer
    # serves): the links are the drift, which a deploy with these settings switches back
    rc, seen = audit()
    assert seen["items"]["unit"]["found"]["rollback_pin"]["held"] is True, seen
    assert seen["drift"] == ["build", "model"], seen
    # The settings that made the second build still hold: the deploy keeps the rollback, says so, changes nothing.
    out = deploying.converges(lab_rack, HOST, f"llamacpp_commit={bump}")
    assert "the unit `llamarack rollback` put back" in out and served_build(lab_rack) == first
    # Changed settings (here: back to the defaults, which want the first build, the unit in
    # place): the unit is kept as it is, the build link follows, and the audit is clean.
    unit_before = sh(lab_rack, f"sha256sum < {UNIT}")
    rc, out = deploy(lab_rack)
    assert rc == 0, out[-6000:]
    assert current_build(lab_rack) == first and served_build(lab_rack) == first
    assert sh(lab_rack, f"sha256sum < {UNIT}") == unit_before
    deploying.completes(lab_rack, HOST)
    converged(lab_rack)
    rc, seen = audit()
    assert rc == 0 and seen["drift"] == [], seen


def test_after_a_rollback_of_the_unit_alone_the_audit_and_the_deploy_agree_nothing_changes(lab_rack):
    """A unit-only change (the context), rolled back: the unit in place is byte for byte
    what the inventory's settings want, so the audit finds no drift and a deploy changes
    and restarts nothing, with the rollback pin (holding nothing) still there."""
    rc, out = deploy(lab_rack, "server_ctx_size=1024")
    assert rc == 0, out[-6000:]
    r = subprocess.run([sys.executable, "-m", "llamarack", "rollback", str(deploying.ROOT / "inventory/lab.py"),
                        "--limit", HOST], cwd=deploying.ROOT, capture_output=True, text=True, timeout=900)  # fmt: skip
    assert r.returncode == 0, (r.stdout + r.stderr)[-6000:]
    rc, seen = audit()
    assert rc == 0 and seen["drift"] == [], seen
    assert seen["items"]["unit"]["found"]["rollback_pin"]["held"] is False, seen
    pid, unit = (sh(lab_rack, "systemctl show -p MainPID --value llamarack-server.service"),
                 sh(lab_rack, f"sha256sum < {UNIT}"))  # fmt: skip
    converged(lab_rack)
    assert sh(lab_rack, "systemctl show -p MainPID --value llamarack-server.service") == pid
    assert sh(lab_rack, f"sha256sum < {UNIT}") == unit
    deploying.completes(lab_rack, HOST)


def test_a_build_binary_replaced_by_another_program_is_rebuilt_beside_and_switched_in(lab_rack):
    before = current_build(lab_rack)
    sh(lab_rack, f"cp /bin/true {ROOT}/builds/current/bin/llama-quantize")
    rc, seen = audit()
    assert rc == 1 and seen["drift"] == ["build"], seen
    assert any(c.startswith("build/bin/llama-quantize: size ") for c in seen["items"]["build"]["found"]["files"]), seen
    rc, out = deploy(lab_rack)
    assert rc == 0, out[-6000:]
    assert f"llama.cpp build {before} differs from its seal" in out, out[-6000:]
    after = current_build(lab_rack)
    # a new directory of the same inputs (<stamp>-r<time>, or <stamp> when the tampered one was a rebuild)
    assert after != before and after.split("-r")[0] == before.split("-r")[0] and served_build(lab_rack) == after
    # the tampered build served until its successor was proven; now nothing runs it and it is gone
    assert sh(lab_rack, f"test -e {ROOT}/builds/{before} || echo gone") == "gone"
    assert sh(lab_rack, f"cmp -s {ROOT}/builds/current/bin/llama-quantize /bin/true || echo rebuilt") == "rebuilt"
    deploying.completes(lab_rack, HOST)
    converged(lab_rack)
    rc, seen = audit()
    assert rc == 0 and seen["drift"] == [], seen


def test_an_edit_in_place_keeping_size_and_mtime_is_seen_only_by_verify(lab_rack):
    bench, gguf = f"{ROOT}/builds/current/bin/llama-bench", f"{ROOT}/models/current/model.gguf"
    for i, path in enumerate((bench, gguf)):
        # 8 bytes overwritten near the end, then the mtime put back (to the nanosecond)
        sh(lab_rack, f"cp -p {path} /root/original-{i} && printf 'TAMPERED' | dd of={path} bs=1 "
                     f"seek=$(( $(stat -c %s {path}) - 4096 )) conv=notrunc status=none && touch -r /root/original-{i} {path}")  # fmt: skip
    rc, seen = audit()
    assert rc == 0 and seen["drift"] == [], seen
    rc, seen = audit("--verify")
    assert rc == 1 and set(seen["drift"]) == {"build", "model"}, seen
    assert seen["items"]["build"]["found"]["files"] == [
        "build/bin/llama-bench: sha256 differs from its seal (size and mtime kept)"], seen
    model = seen["items"]["model"]
    assert model["found"]["sha256"] != model["wanted"]["sha256"] and model["wanted"]["sha256"], model
    # put the bytes back (cp -p writes in place: same inode, and the mtime again)
    for i, path in enumerate((bench, gguf)):
        sh(lab_rack, f"cp -p /root/original-{i} {path} && rm /root/original-{i}")
    rc, seen = audit("--verify")
    assert rc == 0 and seen["drift"] == [], seen


def test_after_a_driver_upgrade_reboot_the_unchanged_server_is_checked_for_health(lab_rack):
    unit = sh(lab_rack, f"sha256sum < {UNIT}")
    lab_rack.driver(HOST, version="570.172.08")  # within the 580 branch, waiting for its reboot
    rc, out = deploy(lab_rack, "driver_reboot_on_mismatch=True")
    assert rc == 0, out[-6000:]
    assert "Reboot: NVIDIA driver library and loaded module differ" in out
    assert "llama-server answers /health after the driver reboot" in out, out[-6000:]
    assert sh(lab_rack, f"sha256sum < {UNIT}") == unit  # the unit did not change, yet it was checked
    assert sh(lab_rack, "nvidia-smi --query-gpu=driver_version --format=csv,noheader") == "570.172.08"
    deploying.completes(lab_rack, HOST)
    converged(lab_rack, "driver_reboot_on_mismatch=True")

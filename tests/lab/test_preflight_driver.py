"""Guards and the driver role on lab hosts, through deploy.py over SSH.

The fake driver is the one test double here (no GPU can exist in the lab):
a real dpkg package whose nvidia-smi and /proc/driver/nvidia/version copy
the real formats. An upgrade installs a new package; the loaded "module"
changes only at reboot, as on a real host.
"""

import json
import subprocess
import sys

import pytest

from llamarack_lab.fake_nvidia import deb
from llamarack_lab.pytest_plugin import parse_pyinfra_totals
from tests.lab import deploying

pytestmark = pytest.mark.lab

deploy = deploying.deploy


@pytest.fixture(scope="module", autouse=True)
def drivers_restored_afterwards(lab_rack):
    """Other test modules share the rack: leave the hosts changed here booted on the default driver."""
    yield
    for host in ("lab-v100-32", "lab-t4"):
        lab_rack.driver(host, version=deb.DEFAULT_VERSION, state="ok")


def state(lab_rack, host: str) -> str:
    """What llamarack could have changed: its tree, dpkg selections (holds), units."""
    r = lab_rack.ssh(
        host,
        "find /opt/llamarack -printf '%p %s %T@\\n' 2>/dev/null | sort; dpkg --get-selections | grep -i nvidia;"
        " apt-mark showhold; systemctl list-unit-files --no-legend 'llama*'",
    )
    return r.stdout


def test_v100_host_with_a_driver_upgrade_past_580_is_refused_and_untouched(lab_rack):
    # A working V100 host (the run records its GPUs), then an unattended upgrade
    # to a driver branch that dropped Volta, waiting for its reboot.
    lab_rack.driver("lab-v100-32", version=deb.DEFAULT_VERSION, state="ok")
    rc, out = deploy(lab_rack, "lab-v100-32")
    assert rc == 0, out[-4000:]
    lab_rack.driver("lab-v100-32", version="590.44.01")
    before = state(lab_rack, "lab-v100-32")
    rc, out = deploy(lab_rack, "lab-v100-32,lab-v100-b")
    assert rc != 0
    # the reboot would boot 590, which drops the V100: the ceiling is the one rule, not a reboot
    assert "lab-v100-32: driver-reboot-needed" not in out
    assert (
        "lab-v100-32: driver-ceiling: found driver 590.44 (installed, not running) with Tesla "
        "V100-SXM2-32GB (compute capability 7.0); needed a driver of the 580 branch or older" in out
    )
    assert "Fix: install a 580.xx driver and apt-mark hold it" in out
    # the audit names the same rule with the same words as the deploy
    r = subprocess.run([sys.executable, "-m", "llamarack", "audit", str(deploying.ROOT / "inventory/lab.py"),
                        "--limit", "lab-v100-32", "--json"], cwd=deploying.ROOT, capture_output=True, text=True,
                       timeout=300)  # fmt: skip
    (named,) = json.loads(r.stdout)["hosts"]["lab-v100-32"]["items"]["rules"]["found"]
    assert named.startswith("lab-v100-32: driver-ceiling: found driver 590.44 (installed, not running)") and named in out
    # The other host went on, and nothing changed on the refused one.
    assert "[lab-v100-b]  Error" not in out
    assert state(lab_rack, "lab-v100-32") == before


def test_reboot_on_mismatch_reboots_checks_again_and_holds_the_driver(lab_rack):
    lab_rack.driver("lab-t4", version=deb.DEFAULT_VERSION, state="ok")  # as booted
    lab_rack.driver("lab-t4", version="590.44.01")
    assert "NVML library version: 590.44" in lab_rack.ssh("lab-t4", "nvidia-smi").stdout
    uptime = lab_rack.ssh("lab-t4", "cut -d. -f1 /proc/uptime").stdout
    rc, out = deploy(lab_rack, "lab-t4", "driver_reboot_on_mismatch=True")
    assert rc == 0, out[-4000:]
    assert int(lab_rack.ssh("lab-t4", "cut -d. -f1 /proc/uptime").stdout) < int(uptime)
    smi = lab_rack.ssh("lab-t4", "nvidia-smi --query-gpu=name,driver_version --format=csv,noheader")
    assert smi.stdout.strip() == "Tesla T4, 590.44.01"
    assert "nvidia-driver" in lab_rack.ssh("lab-t4", "apt-mark showhold").stdout

    # Converged: a second run changes nothing on the host.
    before = state(lab_rack, "lab-t4")
    rc, out = deploy(lab_rack, "lab-t4", "driver_reboot_on_mismatch=True")
    assert rc == 0, out[-4000:]
    assert parse_pyinfra_totals(out)["success"] == 0, out[-4000:]
    assert state(lab_rack, "lab-t4") == before


def test_unhold_for_a_planned_upgrade(lab_rack):
    rc, out = deploy(lab_rack, "lab-t4", "driver_hold_packages=False")
    assert rc == 0, out[-4000:]
    assert "nvidia-driver" not in lab_rack.ssh("lab-t4", "apt-mark showhold").stdout


def test_bad_data_stops_the_run_before_any_host_is_touched(lab_rack):
    before = {h: state(lab_rack, h) for h in ("lab-v100-a", "lab-t4")}
    rc, out = deploy(lab_rack, "lab-v100-a,lab-t4", "server_port=0", "llamacpp_comit=abc1234")
    assert rc != 0
    assert "bad settings for host lab-" in out
    assert "server_port: given 0; allowed: an integer from 1 to 65535" in out
    assert "unknown setting 'llamacpp_comit'; did you mean 'llamacpp_commit'?" in out
    assert "Beginning operation run" not in out
    assert {h: state(lab_rack, h) for h in before} == before

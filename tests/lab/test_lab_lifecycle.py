"""`up` then `down` leaves the machine as it was (no netns, bridge, mounts,
iptables rules, cgroups or processes of the lab; ip_forward restored)."""

import time

import pytest

from llamarack_lab import rack as rackmod
from llamarack_lab import trace


@pytest.mark.lab
def test_up_reboot_down_leaves_no_trace():
    # tests/conftest.py runs this test first, before the session rack starts.
    assert rackmod.load() is None, "a lab rack is up: run 'llamarack lab down' first"
    before = trace.machine_snapshot()
    assert trace.leftovers() == []
    errors = None
    try:
        rack = rackmod.up(gpus="t4,none")
        assert [(h.name, h.gateway) for h in rack.hosts] == [("lab-t4", False), ("lab-cpu", False), ("lab-gw", True)]
        assert all(h["alive"] and h["ssh"] for h in rackmod.status())
        # a reboot from inside: nspawn exits 133, the supervisor boots it again
        uptime_before = rack.ssh("lab-cpu", "cat /proc/uptime").stdout
        rack.ssh("lab-cpu", "systemctl reboot")
        time.sleep(2)
        states = rackmod.wait_booted(rack, 60, names=["lab-cpu"])
        assert states["lab-cpu"] in ("running", "degraded")
        assert rack.ssh("lab-cpu", "cat /proc/uptime").stdout != uptime_before
        assert trace.leftovers() != []
    finally:
        errors = rackmod.down()
    assert errors == []
    assert trace.leftovers() == []
    assert trace.machine_snapshot() == before

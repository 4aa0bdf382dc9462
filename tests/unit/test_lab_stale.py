"""A rack left by a killed run is debris; a rack being brought up or rebooting is not."""

import json
import os
import subprocess

from llamarack_lab import rack as rackmod


def dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def rack_with(tmp_path, owner, host_pid):
    data = {"version": 1, "owner": owner, "hosts": [{"name": "h", "ip": "10.77.0.11", "profile": "cpu",
                                                     "pid": host_pid}]}  # fmt: skip
    (tmp_path / rackmod.STATE_FILE).write_text(json.dumps(data))
    return rackmod.load(tmp_path)


def test_stale_only_when_neither_its_owner_nor_a_host_lives(tmp_path):
    assert rackmod.stale(rack_with(tmp_path, dead_pid(), dead_pid()))
    assert not rackmod.stale(rack_with(tmp_path, os.getpid(), None))  # still being brought up
    assert not rackmod.stale(rack_with(tmp_path, dead_pid(), os.getpid()))  # a host lives

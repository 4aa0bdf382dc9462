"""Faults injected into a deploy on a converged lab host: nothing is lost.

The CI guards of ``bench/reliability.py`` (which runs all twelve): pyinfra
SIGKILLed during the unit switch, the SSH connection cut while the model
converts, a torn state file. For each: the deployment that served keeps
serving (a poller asks its /health through the failed run), no file outside
the staging areas changes (``llamarack_lab.faults``), and a re-run
converges. Tests run in order and share the host.
"""

import shlex
import time

import pytest

from llamarack_lab import faults
from llamarack.layout import UNIT_PATH, Layout
from tests.lab import deploying

pytestmark = pytest.mark.lab

HOST = "lab-v100-a"
INVENTORY = deploying.ROOT / "inventory/lab.py"
DEPLOY = deploying.ROOT / "deploy.py"


def ip(lab_rack) -> str:
    return lab_rack.rack.host(HOST)["ip"]


def converges(lab_rack, *data: str) -> None:
    """A re-run succeeds, and the run after it changes nothing: by the count, and by the host's state."""
    rc, out, _ = faults.run(INVENTORY, DEPLOY, [HOST], data)
    assert rc == 0, out[-5000:]
    before = deploying.state(lab_rack, HOST)
    rc, out, _ = faults.run(INVENTORY, DEPLOY, [HOST], data)
    assert rc == 0 and faults.changes(out) == 0, out[-5000:]
    assert deploying.state(lab_rack, HOST) == before, "the host's state changed on a run that counted no change"


@pytest.fixture(scope="module", autouse=True)
def converged(lab_rack):
    rc, out = deploying.deploy(lab_rack, HOST)
    assert rc == 0, out[-5000:]
    yield
    rc, out = deploying.deploy(lab_rack, HOST)  # the lab's settings again for the modules that follow
    assert rc == 0, out[-5000:]


# Seconds from pyinfra's death mid-switch until the host serves the switched unit: the
# switch, detached on the host, restarts llama-server and checks it on its own.
SERVES_AGAIN_WITHIN = 60
SWITCHING = "systemctl list-units --no-legend --state=active,activating 'llamarack-switch-*' | grep -q ."


def test_sigkill_of_pyinfra_during_the_unit_switch(lab_rack):
    """The switch runs on the host as a transient service of its own: pyinfra SIGKILLed once it
    began (the unit it replaces kept as .prev) leaves it going to its end, and the host serves
    the new unit, checked, within a bound counted from the kill."""
    before = faults.snapshot(lab_rack.rack, HOST)
    run = faults.Deploy(INVENTORY, DEPLOY, [HOST], ["server_ctx_size=1024", "llamarack_roles=server"]).start()
    at_switch = faults.wait_on_host(lab_rack.rack, HOST, f"[ -e {shlex.quote(UNIT_PATH + '.prev')} ]", timeout=600)
    run.kill()
    killed = time.monotonic()
    # polled from the kill: /health and a completion together (a restart may come between two tries)
    while not (faults.health(ip(lab_rack)) == 200 and faults.completion(ip(lab_rack))):
        assert time.monotonic() - killed < SERVES_AGAIN_WITHIN, f"not serving {SERVES_AGAIN_WITHIN} s after the kill"
        time.sleep(0.2)
    serving_after = time.monotonic() - killed
    rc, out, _ = run.wait()
    assert at_switch and rc == -9, out[-3000:]
    # The switch finished on its own: the new unit in place and checked (no .prev left), the
    # one it replaced kept for `llamarack rollback`; nothing else moved.
    finished = f"[ ! -e {shlex.quote(UNIT_PATH + '.prev')} ] && ! {SWITCHING}"
    assert faults.wait_on_host(lab_rack.rack, HOST, finished, timeout=SERVES_AGAIN_WITHIN)
    after = faults.snapshot(lab_rack.rack, HOST)
    assert "--ctx-size 1024" in deploying.sh(lab_rack, HOST, f"grep ^ExecStart= {UNIT_PATH}")
    previous = Layout(faults.ROOT).previous_unit
    assert set(faults.changed_outside_staging(before, after)) <= {UNIT_PATH, previous}
    assert after[previous][3] == before[UNIT_PATH][3]
    assert faults.health(ip(lab_rack)) == 200 and faults.completion(ip(lab_rack))
    print(f"serving the switched unit {serving_after:.1f} s after pyinfra was killed")
    # The next run with the lab's settings switches back and converges.
    converges(lab_rack)
    assert faults.snapshot(lab_rack.rack, HOST)[UNIT_PATH][3] == before[UNIT_PATH][3]


def test_ssh_cut_while_the_model_converts(lab_rack):
    faults.prune_models(lab_rack.rack, HOST)  # the new artifact has all its work to do
    before = faults.snapshot(lab_rack.rack, HOST)
    poller = faults.Poller(ip(lab_rack))
    poller.start()
    run = faults.Deploy(INVENTORY, DEPLOY, [HOST], ["model_convert_outtype=f32"]).start()
    converting = faults.wait_on_host(lab_rack.rack, HOST, faults.staged("convert"), timeout=900)
    faults.cut_ssh(lab_rack.rack, HOST)
    rc, out, _ = run.wait()
    during = poller.stop()
    assert converting and rc != 0, out[-3000:]
    assert during["failures"] == 0, during
    assert faults.completion(ip(lab_rack))
    assert faults.changed_outside_staging(before, faults.snapshot(lab_rack.rack, HOST)) == []
    converges(lab_rack, "model_convert_outtype=f32")


def test_a_torn_state_file_is_written_again(lab_rack):
    rc, out = deploying.deploy(lab_rack, HOST)
    assert rc == 0, out[-5000:]
    whole = deploying.sh(lab_rack, HOST, "cat /opt/llamarack/state/gpus.json")
    deploying.sh(lab_rack, HOST, "truncate -s 7 /opt/llamarack/state/gpus.json")
    poller = faults.Poller(ip(lab_rack))
    poller.start()
    rc, out, _ = faults.run(INVENTORY, DEPLOY, [HOST])
    assert poller.stop()["failures"] == 0
    assert rc == 0, out[-5000:]
    assert deploying.sh(lab_rack, HOST, "cat /opt/llamarack/state/gpus.json") == whole
    converges(lab_rack)


def test_the_poller_sees_an_outage(lab_rack):
    """The guards above can fail: a service stopped for a second is seen."""
    poller = faults.Poller(ip(lab_rack), interval=0.1)
    poller.start()
    deploying.sh(lab_rack, HOST, "systemctl stop llamarack-server.service; sleep 1; "
                                 "systemctl start llamarack-server.service")  # fmt: skip
    deadline = time.monotonic() + 60
    while faults.health(ip(lab_rack)) != 200 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert poller.stop()["failures"] >= 5

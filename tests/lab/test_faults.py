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


def serving_within(lab_rack, seconds: float) -> bool:
    """/health answers 200 and a completion comes back, both within ``seconds``: a switch left
    going on the host may restart the server between the two, so one refused try is no verdict."""
    deadline = time.monotonic() + seconds
    while not (faults.health(ip(lab_rack)) == 200 and faults.completion(ip(lab_rack))):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.5)
    return True


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


def test_sigkill_of_pyinfra_during_the_unit_switch(lab_rack):
    before = faults.snapshot(lab_rack.rack, HOST)
    run = faults.Deploy(INVENTORY, DEPLOY, [HOST], ["server_ctx_size=1024", "llamarack_roles=server"]).start()
    at_switch = faults.wait_on_host(lab_rack.rack, HOST, f"[ -e {shlex.quote(UNIT_PATH + '.prev')} ]", timeout=600)
    run.kill()
    rc, out, _ = run.wait()
    assert at_switch and rc == -9, out[-3000:]
    # Nothing but the unit moved; while the new unit is unproven the proven one is its .prev
    # (the switch, left going on the host, may also have finished: then the new one answered).
    assert serving_within(lab_rack, 120)
    after = faults.snapshot(lab_rack.rack, HOST)
    # (and state/previous.service: a switch that went on to pass its check keeps the unit it replaced)
    moved = {UNIT_PATH, UNIT_PATH + ".prev", Layout(faults.ROOT).previous_unit}
    assert set(faults.changed_outside_staging(before, after)) <= moved
    prev = after.get(UNIT_PATH + ".prev")
    assert prev is None or prev[3] == before[UNIT_PATH][3]
    # The next run checks the unit in place again (the lab's settings: the proven unit's text).
    converges(lab_rack)
    assert faults.snapshot(lab_rack.rack, HOST)[UNIT_PATH][3] == before[UNIT_PATH][3]
    assert faults.health(ip(lab_rack)) == 200 and faults.completion(ip(lab_rack))


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

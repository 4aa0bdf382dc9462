"""Preferred makers (``llamarack.ship``): a host whose step can make an artifact cheaply (a model
step whose blob cache holds the checkpoint) makes it; the others of the same step wait for it
and receive, in one run and across runs sharing a directory (a rollout's stage)."""

from types import SimpleNamespace

import gevent
import pytest

from llamarack import ship
from llamarack.ship import Shipment, Shipping


def host(name: str, op: str = "op-model"):
    return SimpleNamespace(name=name, print_prefix=f"[{name}] ", executing_op_hash=op)


@pytest.fixture()
def run(monkeypatch):
    """A run's ``obtain`` with the control machine's fetch standing in: what a host made is
    fetchable from it; ``log`` records each host's make and receive, in order."""
    state, log = object(), []

    def from_holders(state_, host_, key, kind, what):
        holders = ship.for_state(state_).holders[key]
        return Shipment("/tar", "ab" * 32, 1 << 20, holders[0].host.name) if holders else None

    monkeypatch.setattr(ship, "from_holders", from_holders)

    def obtain(h, fails: bool = False):
        def make():
            log.append(f"{h.name} makes")
            gevent.sleep(0.5)
            return not fails

        def receive(shipment):
            log.append(f"{h.name} receives from {shipment.source}")
            return True

        return ship.obtain(state, h, "model-m", "model", "model m", f"/m/{h.name}", make, receive)

    yield SimpleNamespace(state=state, shipping=ship.for_state(state), obtain=obtain, log=log)
    ship._RUNS.pop(id(state), None)


def test_the_host_with_the_checkpoint_makes_it_though_another_reached_the_step_first(run):
    a, b, c = host("lab-v100-a"), host("lab-v100-b"), host("lab-t4")
    run.shipping.prefer("model-m", b)
    steps = [gevent.spawn(run.obtain, h) for h in (a, c, b)]  # a first: it would make it
    gevent.joinall(steps, raise_error=True)
    assert run.log[0] == "lab-v100-b makes"
    assert sorted(run.log[1:]) == ["lab-t4 receives from lab-v100-b", "lab-v100-a receives from lab-v100-b"]
    assert all(s.value for s in steps)


def test_a_preferred_host_not_at_the_step_is_not_waited_for(run):
    """It failed earlier in the run (pyinfra runs it nothing more), or runs another operation
    (``--serial``, ``--no-wait``): the first host to reach the step makes it."""
    a, gone = host("lab-v100-a"), host("lab-v100-b", op=None)
    run.shipping.prefer("model-m", gone)
    with gevent.Timeout(5):
        assert run.obtain(a)
    assert run.log == ["lab-v100-a makes"]


def test_when_the_preferred_host_fails_to_make_it_the_next_makes_it(run):
    a, b = host("lab-v100-a"), host("lab-v100-b")
    run.shipping.prefer("model-m", b)
    steps = [gevent.spawn(run.obtain, a), gevent.spawn(run.obtain, b, fails=True)]
    gevent.joinall(steps, raise_error=True)
    assert run.log == ["lab-v100-b makes", "lab-v100-a makes"]
    assert [s.value for s in steps] == [True, False]


def test_runs_sharing_a_directory_wait_for_a_preferred_maker_while_its_run_lives(tmp_path):
    """A rollout's stage: one run per host. A run's preferred host holds a lock on a marker
    file until its step is over; a run that dies releases it with its process."""
    stage_b, stage_a = Shipping(str(tmp_path)), Shipping(str(tmp_path))  # as two processes hold it
    a, b = host("lab-v100-a"), host("lab-v100-b")
    stage_b.prefer("model-m", b)
    assert stage_a.pending_makers("model-m", a) == ["lab-v100-b"]
    assert stage_b.pending_makers("model-m", b) == []  # it makes it, it waits for no one
    assert stage_a.pending_makers("model-other", a) == []
    stage_b.settle("model-m", b)
    assert stage_a.pending_makers("model-m", a) == []


def test_a_shared_run_waits_for_the_preferred_run_then_takes_what_it_published(tmp_path):
    stage_b, stage_a = Shipping(str(tmp_path)), Shipping(str(tmp_path))
    a, b = host("lab-v100-a"), host("lab-v100-b")
    stage_b.prefer("model-m", b)
    made = Shipment(str(tmp_path / "model-m.tar"), "cd" * 32, 5, "lab-v100-b")

    def b_makes():
        gevent.sleep(1.2)
        (tmp_path / "model-m.tar").write_bytes(b"tar")
        stage_b.publish("model-m", made)
        stage_b.settle("model-m", b)

    maker = gevent.spawn(b_makes)
    with gevent.Timeout(10):
        ship._wait_for_makers(stage_a, a, "model-m", "model m")
    assert stage_a.published("model-m") == made
    maker.join()

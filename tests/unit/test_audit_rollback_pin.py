"""The audit's unit item with a `llamarack rollback` pin: no drift while a deploy would keep
the pinned unit, drift when the deploy would drop the pin (the same rule as the service
operation, tests/roles/test_server_ops.py)."""

import hashlib
import json

from pyinfra.facts.files import Link

from llamarack.audit import Answers
from roles.server.audit import unit_item, wanted_here
from roles.server.reads import FoundUnit
from roles.driver.reads import CharDevices
from llamarack.facts import FactRead
from roles.model.reads import GgufShape
from roles.llamacpp.reads import LlamaServerFlags
from tests.roles.test_server_ops import DEVICES_580, FLAGS, ROOT, SHAPE, UNIT, UNIT_SHA1, V100, settings


def item(pin, unit_text: str):
    """The audit's unit item for the unit ``unit_text`` in place, with ``pin``, on the one V100."""
    fact = Answers((), {})
    fact.values = {
        FactRead.of(Link, path=f"{ROOT}/builds/current"): {"link_target": "b1"},
        FactRead.of(Link, path=f"{ROOT}/models/current"): {"link_target": "m1"},
        FactRead.of(LlamaServerFlags, root=ROOT): FLAGS,
        FactRead.of(GgufShape, path=f"{ROOT}/models/current/model.gguf"): SHAPE,
        FactRead.of(CharDevices): DEVICES_580,
    }
    (_, (wanted,)), why = wanted_here(settings(), fact, (V100,), ())
    found = FoundUnit("llamarack-server.service", hashlib.sha1(unit_text.encode()).hexdigest(),
                      tuple(unit_text.rstrip("\n").split("\n")), False, {}, (json.dumps(pin),) if pin else None)
    return unit_item(settings(), found, wanted, why)


def test_a_pinned_unit_is_no_drift_while_the_deploy_keeps_it_and_drift_once_it_would_go():
    wanted, wanted_sha1 = UNIT, UNIT_SHA1  # what the deploy writes (tests/roles/test_server_ops.py)
    old_unit = "ExecStart=/opt/lr/builds/b0/bin/llama-server --model /opt/lr/models/m0/model.gguf\n"
    old_sha1 = hashlib.sha1(old_unit.encode()).hexdigest()
    held = item({"unit_sha1": old_sha1, "replaced_sha1": wanted_sha1, "at": 1}, old_unit)
    assert held.drift is False and held.found["rollback_pin"]["held"] is True
    # the settings want another unit now: the deploy would switch and drop the pin
    released = item({"unit_sha1": old_sha1, "replaced_sha1": "1" * 40, "at": 1}, old_unit)
    assert released.drift is True and released.found["rollback_pin"]["held"] is False
    # no pin: the unit against the wanted one, as before
    plain = item(None, wanted)
    assert plain.drift is False and "rollback_pin" not in plain.found


def test_a_pin_that_holds_nothing_while_the_unit_is_the_wanted_one_is_no_drift():
    # `llamarack rollback` put back the unit the settings want again (a unit-only change undone)
    wanted, wanted_sha1 = UNIT, UNIT_SHA1
    pin = {"unit_sha1": wanted_sha1, "replaced_sha1": "2" * 40, "at": 1}
    found = item(pin, wanted)
    assert found.drift is False and found.found["rollback_pin"]["held"] is False
    assert found.found["sha256"] == found.wanted["sha256"] == hashlib.sha256(UNIT.encode()).hexdigest()

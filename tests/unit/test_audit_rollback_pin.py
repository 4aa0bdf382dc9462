"""The audit's unit item with a `llamarack rollback` pin: no drift while a deploy would keep
the pinned unit, drift when the deploy would drop the pin (the same rule as the service
operation, tests/roles/test_server_ops.py)."""

import hashlib
import json

from pyinfra.facts.files import FileContents, Link, Sha1File

from llamarack.audit import Answers
from llamarack.roles.server.audit import unit_item
from llamarack.roles.driver.reads import CharDevices
from llamarack.facts import FactRead
from llamarack.roles.model.reads import GgufShape
from llamarack.roles.llamacpp.reads import LlamaServerFlags
from llamarack.layout import UNIT_PATH
from tests.roles.test_server_ops import DEVICES_580, FLAGS, ROOT, SHAPE, UNIT, UNIT_SHA1, V100, settings


def answers(pin, unit_sha1) -> Answers:
    fact = Answers((), {})
    fact.values = {
        FactRead.of(Link, path=f"{ROOT}/builds/current"): {"link_target": "b1"},
        FactRead.of(Link, path=f"{ROOT}/models/current"): {"link_target": "m1"},
        FactRead.of(LlamaServerFlags, root=ROOT): FLAGS,
        FactRead.of(GgufShape, path=f"{ROOT}/models/current/model.gguf"): SHAPE,
        FactRead.of(FileContents, path=f"{ROOT}/state/rollback.json"): [json.dumps(pin)] if pin else None,
        FactRead.of(Sha1File, path=UNIT_PATH): unit_sha1,
        FactRead.of(CharDevices): DEVICES_580,
    }
    return fact


def test_a_pinned_unit_is_no_drift_while_the_deploy_keeps_it_and_drift_once_it_would_go():
    s = settings()
    wanted, wanted_sha1 = UNIT, UNIT_SHA1  # what the deploy writes (tests/roles/test_server_ops.py)
    old_unit = "ExecStart=/opt/lr/builds/b0/bin/llama-server --model /opt/lr/models/m0/model.gguf\n"
    old_sha1 = hashlib.sha1(old_unit.encode()).hexdigest()
    held = unit_item(s, answers({"unit_sha1": old_sha1, "replaced_sha1": wanted_sha1, "at": 1}, old_sha1), (V100,),
                      old_unit, ())  # fmt: skip
    assert held.drift is False and held.found["rollback_pin"]["held"] is True
    # the settings want another unit now: the deploy would switch and drop the pin
    released = unit_item(s, answers({"unit_sha1": old_sha1, "replaced_sha1": "1" * 40, "at": 1}, old_sha1), (V100,),
                          old_unit, ())  # fmt: skip
    assert released.drift is True and released.found["rollback_pin"]["held"] is False
    # no pin: the unit against the wanted one, as before
    plain = unit_item(s, answers(None, wanted_sha1), (V100,), wanted, ())
    assert plain.drift is False and "rollback_pin" not in plain.found


def test_a_pin_that_holds_nothing_while_the_unit_is_the_wanted_one_is_no_drift():
    # `llamarack rollback` put back the unit the settings want again (a unit-only change undone)
    s = settings()
    wanted, wanted_sha1 = UNIT, UNIT_SHA1
    pin = {"unit_sha1": wanted_sha1, "replaced_sha1": "2" * 40, "at": 1}
    item = unit_item(s, answers(pin, wanted_sha1), (V100,), wanted, ())
    assert item.drift is False and item.found["rollback_pin"]["held"] is False
    assert item.found["sha256"] == item.wanted["sha256"] == hashlib.sha256(UNIT.encode()).hexdigest()

"""What the running process says of itself (its /props, read by ``ServedUnits`` with
``health``) against its unit file: ``process_drift``, the audit's ``process`` item and the
upgrade plan's restart. The unit is lab-v100-a's, read from the lab (the fact fixture
tests/facts/ServedUnits/provenance.json): llama.cpp dccad28c6, the tiny model."""

import dataclasses
import json
from pathlib import Path

from llamarack.audit import Item
from llamarack.upgrade import server_steps
from roles.server.audit import process_item
from roles.server.plan import process_drift, unit_model
from roles.server.reads import FoundUnit

FIXTURE = Path(__file__).resolve().parents[1] / "facts/ServedUnits/provenance.json"
MODEL = "/opt/llamarack/models/24a54d8dca74ab9e/model.gguf"


def lab_unit(**changes) -> FoundUnit:
    found = json.loads(FIXTURE.read_text())["fact"]["llamarack-server.service"]
    found = FoundUnit(**{**found, "lines": tuple(found["lines"])})
    return dataclasses.replace(found, **changes)


def test_the_lab_unit_runs_what_its_file_names():
    unit = lab_unit()
    assert unit.props == {"build_info": "b1-dccad28c6", "model_path": MODEL, "total_slots": 1}
    assert unit.built == "dccad28c6" and unit_model(unit.lines) == MODEL
    assert process_drift(unit) is None
    item = process_item(unit)
    assert not item.drift and item.found == unit.props and item.wanted == {"model_path": MODEL, "built": "dccad28c6"}


def test_another_model_is_drift_naming_both():
    unit = lab_unit(props={"build_info": "b1-dccad28c6", "model_path": "/opt/llamarack/models/0ld/model.gguf"})
    why = process_drift(unit)
    assert why == (f"the process serves /opt/llamarack/models/0ld/model.gguf, not the unit's {MODEL}: "
                   "it was not restarted since its unit changed")  # fmt: skip
    item = process_item(unit)
    assert item.drift and item.wanted["why"] == why


def test_another_build_is_drift():
    unit = lab_unit(props={"build_info": "b2-30fb2c265", "model_path": MODEL})
    assert process_drift(unit) == "the process runs llama.cpp 30fb2c265 (b2-30fb2c265), not the unit's build of dccad28c6"


def test_a_longer_or_shorter_commit_of_the_same_build_is_no_drift():
    assert process_drift(lab_unit(built="dccad28c6a1b2", props={"build_info": "b1-dccad28c6"})) is None
    assert process_drift(lab_unit(built="dccad28", props={"build_info": "b1-dccad28c6"})) is None


def test_a_process_that_says_nothing_is_not_drift():
    """No answer, or a build without /props: the health item speaks, not this one."""
    for unit in (lab_unit(props=None), lab_unit(props={}), lab_unit(built=None, props={"build_info": "b9-0000000"}),
                 None):
        assert process_drift(unit) is None
        assert not process_item(unit).drift


def test_the_upgrade_plan_restarts_a_unit_whose_process_drifted():
    why = "the process serves /x, not the unit's /y: it was not restarted since its unit changed"
    items = {"unit": Item("a", "a"), "service": Item({}, {}), "health": Item(200, 200),
             "process": Item({"model_path": "/x"}, {"model_path": "/y", "why": why}, drift=True)}
    steps = server_steps(items, remade=False)
    assert [(s.action, s.why) for s in steps] == [("restart", why)]
    items["process"] = Item({"model_path": "/y"}, {"model_path": "/y"})
    assert server_steps(items, remade=False) == []

"""Operation fixtures, in pyinfra's style: ``<role>.<operation>/<case>.json`` holds the
operation's ``args``, the ``facts`` it reads and the ``commands`` it must yield (``[]``
and a ``noop`` for the already-done case). One harness runs them all.

- ``<role>`` is a folder under roles/ (its ``operations.py``), or ``llamarack`` for
  the shared ``llamarack/operations.py``.
- ``facts``: ``{"roles.<role>.reads.X" | "<pyinfra facts module>.X": value}`` for a
  fact read without arguments, ``{name: {"path=/x": value}}`` for one read with them, as
  pyinfra's own fixtures do. A read the case does not give (another fact, or the fact
  with other arguments) fails it. A value ``{"output": [...]}`` is what the host printed for a llamarack fact,
  parsed by the fact itself; any other value is the fact's value (a llamarack fact
  value as its dataclass's fields).
- ``commands``: shell commands as strings; uploads as ``["upload", dest, text]``.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import typing
from pathlib import Path

import pytest

from tests.support.ophost import any_args, fact_key, run_op

HERE = Path(__file__).parent
CASES = sorted(HERE.glob("*/*.json"))


def operation(name: str):
    role, op = name.split(".")
    module = "llamarack.operations" if role == "llamarack" else f"roles.{role}.operations"
    return getattr(importlib.import_module(module), op)


def fact_class(name: str):
    module, cls = name.rsplit(".", 1)
    if module.startswith(("llamarack.", "roles.")):
        return getattr(importlib.import_module(module), cls)
    return getattr(importlib.import_module(f"pyinfra.facts.{module}"), cls)


def fact_value(cls, value):
    if isinstance(value, dict) and set(value) == {"output"}:
        return cls().process(value["output"])
    kind = typing.get_args(getattr(cls, "__orig_bases__", [None])[0])
    kind = kind[0] if kind else None
    if isinstance(value, dict) and dataclasses.is_dataclass(kind):
        fields = {f.name: f for f in dataclasses.fields(kind)}
        return kind(**{k: tuple(v) if isinstance(v, list) else v for k, v in value.items() if k in fields})
    return value


def facts_of(case: dict) -> dict:
    facts = {}
    for name, value in case.get("facts", {}).items():
        cls = fact_class(name)
        if isinstance(value, dict) and value and all("=" in k for k in value):
            for args, v in value.items():
                kwargs = dict(a.split("=", 1) for a in args.split(","))
                facts[fact_key(cls, **kwargs)] = fact_value(cls, v)
        else:
            facts[cls] = fact_value(cls, value)
    return facts


def plain(command):
    return list(command) if isinstance(command, tuple) else command


@pytest.mark.parametrize("path", CASES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_operation_fixture(path):
    case = json.loads(path.read_text())
    commands, noops = run_op(operation(path.parent.name), facts_of(case), executing=case.get("executing", True),
                             **case.get("args", {}))  # fmt: skip
    assert [plain(c) for c in commands] == case["commands"]
    if "noop" in case:
        assert noops == [case["noop"]]
    else:
        assert noops == []


def test_there_are_fixtures_for_every_role_with_simple_operations():
    assert {p.parent.name.split(".")[0] for p in CASES} >= {"llamacpp", "driver", "llamarack"}


def test_a_fact_read_with_other_arguments_than_the_case_gives_fails_naming_them():
    case = json.loads((HERE / "llamacpp.checkout/at_the_pin_even_short.json").read_text())
    facts = facts_of(case)
    run_op(operation("llamacpp.checkout"), facts, **case["args"])  # as given: it runs
    with pytest.raises(pytest.fail.Exception) as failed:
        run_op(operation("llamacpp.checkout"), facts, **{**case["args"], "dest": "/elsewhere"})
    assert str(failed.value) == ("gpu01: the operation read GitHead(path='/elsewhere'), which the test does not "
                                 "give (it gives: GitHead(path='/s'))")  # fmt: skip
    with pytest.raises(pytest.fail.Exception, match=r"read GitHead\(path='/s'\), .*\(it gives: no GitHead\)"):
        run_op(operation("llamacpp.checkout"), {}, **case["args"])


def test_any_arguments_is_said_out_loud():
    from roles.llamacpp.reads import GitHead

    case = json.loads((HERE / "llamacpp.checkout/at_the_pin_even_short.json").read_text())
    value = facts_of(case)[fact_key(GitHead, path="/s")]
    commands, noops = run_op(operation("llamacpp.checkout"), {any_args(GitHead): value},
                             **{**case["args"], "dest": "/elsewhere"})  # fmt: skip
    assert commands == [] and noops

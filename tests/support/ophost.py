"""Run a pyinfra operation's generator against given facts, without a host.

The same idea as pyinfra's own operation fixtures: facts in, the commands
the operation yields (or its no-op message) out. Each fact is given with the
arguments the operation must read it with (``fact_key``): a read of another
fact, or of the same fact with other arguments (a wrong path), fails the test
and names what was read.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from types import SimpleNamespace

from io import StringIO

import pytest
from pyinfra.api import FileUploadCommand, StringCommand
from pyinfra.context import ctx_host


class FakeState:
    """The part of pyinfra's State an operation reads: whether it executes, ``--diff``,
    and the (here: none) operations run so far (``llamarack.facts.read`` counts them)."""

    def __init__(self, is_executing: bool = True, diff: bool = False):
        self.is_executing = is_executing
        self.config = SimpleNamespace(DIFF=diff)
        self.ops: dict = {}


ANY_ARGUMENTS = object()
"""In a fact key ``(FactClass, ANY_ARGUMENTS)``: that fact whatever its arguments (see ``any_args``)."""


def fact_key(fact_cls, **kwargs) -> tuple:
    """The key of ``fact_cls`` read with exactly ``kwargs``."""
    return (fact_cls, frozenset(kwargs.items()))


def any_args(fact_cls) -> tuple:
    """The key of ``fact_cls`` whatever its arguments. Only for a test that needs it, and
    then says why: every other read is matched by its arguments too."""
    return (fact_cls, ANY_ARGUMENTS)


def _call(fact_cls, args: tuple, kwargs: dict) -> str:
    words = [repr(a) for a in args] + [f"{k}={v!r}" for k, v in sorted(kwargs.items())]
    return f"{fact_cls.__name__}({', '.join(words)})"


@dataclass(eq=False)  # hashed by identity, as pyinfra's hosts are
class FakeHost:
    facts: dict
    """``{fact_key(FactClass, **kwargs): value}``; a bare ``FactClass`` is that fact read
    without arguments, ``any_args(FactClass)`` that fact whatever its arguments. A read
    the test did not give fails the test, naming the fact and its arguments."""
    name: str = "gpu01"
    noops: list = field(default_factory=list)
    print_prefix: str = "[gpu01] "
    state: FakeState = field(default_factory=FakeState)
    op_hash_order: list = field(default_factory=list)

    def get_fact(self, fact_cls, *args, **kwargs):
        if not args:
            for key in (fact_key(fact_cls, **kwargs), fact_cls if not kwargs else None, any_args(fact_cls)):
                if key is not None and key in self.facts:
                    return self.facts[key]
        given = [_given(k) for k in self.facts if k is fact_cls or (isinstance(k, tuple) and k[0] is fact_cls)]
        pytest.fail(f"{self.name}: the operation read {_call(fact_cls, args, kwargs)}, which the test does not "
                    f"give (it gives: {', '.join(given) or 'no ' + fact_cls.__name__})")  # fmt: skip

    def noop(self, message):
        self.noops.append(message)

    def log(self, message, log_func=None):
        (log_func or logging.getLogger("pyinfra").info)(f"{self.print_prefix}{message}")


def _given(key) -> str:
    if not isinstance(key, tuple):
        return _call(key, (), {})
    if key[1] is ANY_ARGUMENTS:
        return f"{key[0].__name__}(any arguments)"
    return _call(key[0], (), dict(key[1]))


def run_op(op, facts: dict, executing: bool = True, diff: bool = False, **kwargs) -> tuple[list, list[str]]:
    """(commands yielded, no-op messages) of ``op`` given ``facts``; executing=False
    is pyinfra's change detection (``--dry``), diff=True its ``--diff``. Uploads
    come out as ``("upload", dest, text)``; the private upload directory's random
    name as ``PRIVATE_DIR_SHOWN``."""
    fake = FakeHost(facts, state=FakeState(executing, diff))
    with ctx_host.use(fake):
        commands = [_plain(c) for c in op._inner(**kwargs)]
    return commands, fake.noops


# The private upload directory's random name (llamarack.operations.private_upload), the same
# in every run's commands so that fixtures can name them.
PRIVATE_DIR = re.compile(r"/tmp/llamarack-upload-[0-9a-f]{32}")
PRIVATE_DIR_SHOWN = "/tmp/llamarack-upload-RANDOM"


def _plain(command):
    if isinstance(command, FileUploadCommand):
        src = command.src.getvalue() if isinstance(command.src, StringIO) else f"<{command.src}>"
        return ("upload", command.dest, src)
    if isinstance(command, StringCommand):
        return PRIVATE_DIR.sub(PRIVATE_DIR_SHOWN, command.get_raw_value())
    return str(command)

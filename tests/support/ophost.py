"""Run a pyinfra operation's generator against given facts, without a host.

The same idea as pyinfra's own operation fixtures: facts in, the commands
the operation yields (or its no-op message) out.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from types import SimpleNamespace

from io import StringIO

from pyinfra.api import FileUploadCommand, StringCommand
from pyinfra.context import ctx_host


class FakeState:
    """The part of pyinfra's State an operation reads: whether it executes, ``--diff``,
    and the (here: none) operations run so far (``llamarack.facts.read`` counts them)."""

    def __init__(self, is_executing: bool = True, diff: bool = False):
        self.is_executing = is_executing
        self.config = SimpleNamespace(DIFF=diff)
        self.ops: dict = {}


@dataclass(eq=False)  # hashed by identity, as pyinfra's hosts are
class FakeHost:
    facts: dict
    """``{FactClass: value}`` or ``{(FactClass, frozenset(kwargs.items())): value}``."""
    name: str = "gpu01"
    noops: list = field(default_factory=list)
    print_prefix: str = "[gpu01] "
    state: FakeState = field(default_factory=FakeState)
    op_hash_order: list = field(default_factory=list)

    def get_fact(self, fact_cls, *args, **kwargs):
        key = (fact_cls, frozenset(kwargs.items()))
        if key in self.facts:
            return self.facts[key]
        return self.facts[fact_cls]

    def noop(self, message):
        self.noops.append(message)

    def log(self, message, log_func=None):
        (log_func or logging.getLogger("pyinfra").info)(f"{self.print_prefix}{message}")


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

"""Each fact read once per run while its host is unchanged, and many facts read in one command.

The roles read facts through ``read``, which keeps what a host answered until one of that
host's operations executes a command, and preflight asks for everything the roles will read
in one remote command, ``read_together`` (docs/ARCHITECTURE.md, "Each fact is read once per
run", says why). The rule that keeps the store right: an operation reads its facts before
it yields its first command, so no read inside an operation follows a change the store does
not know of. A read after a command of the same operation calls ``host.get_fact`` itself.
"""

from __future__ import annotations

import secrets
import weakref
from dataclasses import dataclass, field
from typing import Any, Optional

from pyinfra import host, logger
from pyinfra.api import FactBase
from pyinfra.api.exceptions import FactProcessError

from .. import remote


@dataclass(frozen=True)
class FactRead:
    """One fact with its arguments: what ``host.get_fact(fact, **kwargs)`` reads."""

    fact: type
    kwargs: tuple = ()

    @classmethod
    def of(cls, fact: type, **kwargs: Any) -> "FactRead":
        return cls(fact, tuple(sorted(kwargs.items())))

    def __repr__(self) -> str:
        return f"{self.fact.__name__}({', '.join(f'{k}={v!r}' for k, v in self.kwargs)})"


MISSING_COMMAND = "llamarack-fact-command-missing"


def _text(value, kwargs: dict) -> str:
    """A fact's ``command`` or ``requires_command`` (text, or a function of the fact's arguments)."""
    value = value(**kwargs) if callable(value) else value
    # pyinfra's StringCommand: its raw value is the shell text with each part quoted.
    return value.get_raw_value() if hasattr(value, "get_raw_value") else str(value or "")


def _command_text(fact: FactBase, kwargs: dict, command: Optional[str] = None) -> str:
    """The shell text of ``fact``'s command (or ``command`` in its place), behind its
    ``requires_command`` guard as pyinfra builds it."""
    command = _text(fact.command, kwargs) if command is None else command
    requires = _text(fact.requires_command, kwargs)
    if requires:
        return f"if command -v {requires} >/dev/null 2>&1; then ( {command} ); else echo {MISSING_COMMAND}; fi"
    return command


@dataclass(frozen=True)
class Answer:
    """One section of a ``FactsTogether``: the command's exit status, and the fact's
    value (its default where there was no output), or why it could not be processed."""

    status: Optional[int]
    value: Any = None
    error: Optional[str] = None


class FactsTogether(FactBase[dict]):
    """Returns the answers of several facts, their commands run in one shell command (a
    section each, marked by a random line; docs/ARCHITECTURE.md, "Each fact is read once per
    run"), by position: ``{0: Answer(status=0, value=...), 1: Answer(status=1)}``. Each
    fact's output goes to its own ``process`` on the instance that made its command."""

    def command(self, reads: tuple) -> str:
        self.marker = f"llamarack-section-{secrets.token_hex(8)}"
        self.facts = [r.fact() for r in reads]
        sources: dict = {}
        sections = []
        for i, (r, fact) in enumerate(zip(reads, self.facts)):
            kwargs = dict(r.kwargs)
            run = fact.host_run(**kwargs) if hasattr(fact, "host_run") else None
            command = None
            if run:
                name, *args = run
                variable = sources.setdefault(name, f"LLAMARACK_HOST_MODULE_{len(sources)}")
                command = f'python3 -c "${variable}" {remote.argv(*args)}'.rstrip()
            # Between its markers (hex, and a number), the fact's command, every value in it
            # quoted by the fact itself.
            text = _command_text(fact, kwargs, command)
            sections.append(f"echo {self.marker} {i}; ( {text} ) </dev/null 2>/dev/null; echo {self.marker} rc $?")
        # The variable names are made here; each source is quoted whole (shlex), so the
        # shell expands nothing in it.
        defined = [f"{variable}={remote.argv(remote.source(name))}" for name, variable in sources.items()]
        return "\n".join(defined + sections)

    def process(self, output) -> dict:
        answers: dict = {}
        index, lines = None, []
        for line in output:
            if not line.startswith(self.marker + " "):
                lines.append(line)
            elif line.startswith(self.marker + " rc "):
                if index is not None:
                    answers[index] = self._answer(self.facts[index], int(line.rsplit(" ", 1)[1]), lines)
                index, lines = None, []
            else:
                index, lines = int(line.rsplit(" ", 1)[1]), []
        return answers

    @staticmethod
    def _answer(fact: FactBase, status: int, lines: list) -> Answer:
        if status != 0:
            return Answer(status)
        if not lines or lines == [MISSING_COMMAND]:
            return Answer(status, fact.default())
        try:
            return Answer(status, fact.process(lines))
        except FactProcessError as e:
            return Answer(status, error=str(e))


@dataclass
class _Store:
    """What one host answered, valid while its count of changing operations stays ``changes``."""

    changes: int
    values: dict = field(default_factory=dict)


# state -> {host name: store}; a new pyinfra State (a new run, a test) starts empty.
_stores: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _changing_operations() -> int:
    """How many of this host's operations have run and executed a command so far in this run."""
    ops = host.state.ops.get(host, {})
    metas = (ops[op_hash].operation_meta for op_hash in host.op_hash_order if ops.get(op_hash) is not None)
    return sum(1 for meta in metas if meta is not None and meta.is_complete() and meta.executed)


def _store() -> _Store:
    by_host = _stores.setdefault(host.state, {})
    changes = _changing_operations()
    store = by_host.get(host.name)
    if store is None or store.changes != changes:
        store = by_host[host.name] = _Store(changes)
    return store


def read(fact: type, **kwargs: Any) -> Any:
    """``host.get_fact(fact, **kwargs)``, answered from what this host said earlier in the
    run while none of its operations has executed a command since."""
    key = FactRead.of(fact, **kwargs)
    store = _store()
    if key not in store.values:
        store.values[key] = host.get_fact(fact, **kwargs)
    return store.values[key]


def read_together(*reads: FactRead) -> None:
    """Read every fact of ``reads`` that the store does not hold yet, in one remote command.

    A section whose command did not exit 0 (or whose output its fact could not
    process) is not kept: ``read`` runs that fact alone when a role asks for it, so
    a fact that fails on this host (``systemctl`` where systemd is not running)
    fails it where the role reads it, not in preflight."""
    store = _store()
    wanted = tuple(dict.fromkeys(r for r in reads if r not in store.values))
    if not wanted:
        return
    if len(wanted) == 1:
        read(wanted[0].fact, **dict(wanted[0].kwargs))
        return
    answers = host.get_fact(FactsTogether, reads=wanted)
    for i, r in enumerate(wanted):
        answer = answers.get(i) or Answer(None)
        if answer.status == 0 and answer.error is None:
            store.values[r] = answer.value
            logger.debug(f"{host.print_prefix}Loaded fact {r!r} (read together)")
        elif answer.error:
            logger.debug(f"{host.print_prefix}could not process fact {r!r} read together: {answer.error}")

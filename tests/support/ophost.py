"""Run a pyinfra operation's generator against given facts, without a host.

The same idea as pyinfra's own operation fixtures: facts in, the commands
the operation yields (or its no-op message) out.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pyinfra.context import ctx_host


@dataclass
class FakeHost:
    facts: dict
    """``{FactClass: value}`` or ``{(FactClass, frozenset(kwargs.items())): value}``."""
    name: str = "gpu01"
    noops: list = field(default_factory=list)
    print_prefix: str = "[gpu01] "

    def get_fact(self, fact_cls, *args, **kwargs):
        key = (fact_cls, frozenset(kwargs.items()))
        if key in self.facts:
            return self.facts[key]
        return self.facts[fact_cls]

    def noop(self, message):
        self.noops.append(message)


def run_op(op, facts: dict, **kwargs) -> tuple[list[str], list[str]]:
    """(commands yielded, no-op messages) of ``op`` given ``facts``."""
    fake = FakeHost(facts)
    with ctx_host.use(fake):
        commands = [str(c) for c in op._inner(**kwargs)]
    return commands, fake.noops

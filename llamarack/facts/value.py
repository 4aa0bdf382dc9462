"""The base of every fact's value type, so pyinfra's own CLI can print it."""

import dataclasses


class FactValue:
    """A fact value (a frozen dataclass): ``pyinfra INVENTORY fact llamarack.roles.<role>.reads.X`` and
    ``--json`` serialize it through ``to_json``, which pyinfra's encoder looks for."""

    def to_json(self):
        return dataclasses.asdict(self)

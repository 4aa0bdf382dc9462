"""The base of every fact's value type, so pyinfra's own CLI can print it, and what reads a
record file's JSON."""

import dataclasses
import json

from pyinfra.api.exceptions import FactProcessError


def _plain(value):
    """``value`` as JSON-ready data, each fact value inside it through its own ``to_json``."""
    if isinstance(value, FactValue):
        return value.to_json()
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return value


class FactValue:
    """A fact value (a frozen dataclass): ``pyinfra INVENTORY fact roles.<role>.reads.X`` and
    ``--json`` serialize it through ``to_json``, which pyinfra's encoder looks for."""

    def to_json(self):
        return {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self)}


def json_object(output, name: str) -> dict:
    """A record file's JSON object; FactProcessError naming the file when it is not one."""
    try:
        record = json.loads("\n".join(output))
    except ValueError as e:
        raise FactProcessError(f"unreadable {name}: {e}") from e
    if not isinstance(record, dict):
        raise FactProcessError(f"{name} is not an object: {str(record)[:80]!r}")
    return record

"""Every llamarack fact class by name: the shared ones (``llamarack.facts``) and each
role's own (``roles/<role>/reads.py``), as the fixture tests look them up."""

import importlib
import types

from pyinfra.api import FactBase

import llamarack.facts
from roles import ROLES


def _modules():
    yield from (importlib.import_module(f"llamarack.facts.{m}") for m in ("ownership", "packages", "system"))
    for role in ROLES:
        try:
            yield importlib.import_module(f"roles.{role}.reads")
        except ModuleNotFoundError:
            continue


# {name: class} of every fact class a llamarack module defines (imported ones are counted where defined)
ALL = {name: value for module in _modules() for name, value in vars(module).items()
       if isinstance(value, type) and issubclass(value, FactBase) and value.__module__ == module.__name__}  # fmt: skip
# The classes and their helpers (value types, parsers), as attributes: ``facts.NvidiaSmi``.
FACTS = types.SimpleNamespace(**{name: value for module in [llamarack.facts, *_modules()]
                                 for name, value in vars(module).items() if not name.startswith("_")})  # fmt: skip

"""The ``llamarack`` program (the console script, and ``python -m llamarack``).

``llamarack audit`` pays for every millisecond before its ssh connections
start: until then one of the machine's cores has nothing to do. So for an
audit they start here, before click and the commands are imported (about
30 ms of CPU on the lab's 2-core machine), from the command line read the way
click will read it (``audit_arguments``). The audit command keeps them only
when click's own reading of the line names the same inventory and hosts
(``llamarack.cli``); a line this reading is not sure of starts nothing here.
"""

from __future__ import annotations

import sys
from typing import Optional

# The audit command's options (llamarack.cli.audit), by whether they take a value.
AUDIT_FLAGS = ("--json", "--verify", "--debug")
AUDIT_VALUED = ("--limit", "--templates")


def audit_arguments(argv: list) -> Optional[tuple[str, tuple]]:
    """(inventory, limit) of ``audit INVENTORY [--limit HOST]... [options]``, as click
    parses that line; None when the line is not an audit or holds anything else (help,
    an unknown option, a missing or second inventory): click then has the last word."""
    if argv[:1] != ["audit"]:
        return None
    positional, limit = [], []
    words = iter(argv[1:])
    for word in words:
        if word == "--":
            positional += list(words)
            break
        name, eq, value = word.partition("=")
        if name in AUDIT_VALUED and word.startswith("--"):
            if not eq:
                value = next(words, None)
                if value is None:
                    return None
            if name == "--limit":
                limit.append(value)
        elif word in AUDIT_FLAGS:
            continue
        elif word.startswith("-") and word != "-":
            return None
        else:
            positional.append(word)
    if len(positional) != 1:
        return None
    return positional[0], tuple(limit)


def entry() -> None:
    """``llamarack.cli.main`` as the whole process; an audit's ssh connections started first."""
    given = audit_arguments(sys.argv[1:])
    early = None
    if given is not None:
        if "--debug" in sys.argv[2:]:  # what starting them logs, as the audit command would log it
            import logging

            logging.basicConfig(level=logging.DEBUG, format="%(message)s")
        from .openssh import early as start

        early = (given, start(*given))
    from .cli import main

    main(obj={"whole_process": True, "early": early})

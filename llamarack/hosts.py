"""The hosts of an inventory, reached through pyinfra: the one transport.

``load`` reads an inventory as ``pyinfra INVENTORY ...`` reads it (pyinfra's
own loader, group data included); ``run_each`` runs one shell command on
each host, all hosts at once, through pyinfra's connectors. Every host-data
key means what it means to a deploy: ``ssh_*``, ``_sudo``, ``_sudo_password``,
``_su_user``, ``ssh_paramiko_connect_kwargs``...
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Callable, Iterator, Optional

# pyinfra's CLI package patches the standard library for gevent on import, as every
# pyinfra API program must before connecting; its inventory loader is the one pyinfra uses.
from pyinfra_cli.inventory import make_inventory  # noqa: I001  (first: gevent's patching)

import gevent
from pyinfra.api import Config, State
from pyinfra.api.arguments import CONNECTOR_ARGUMENT_KEYS, pop_global_arguments
from pyinfra.api.command import StringCommand
from pyinfra.api.exceptions import ConnectError, PyinfraError
from pyinfra.context import ctx_host, ctx_state


def load(inventory: str, limit: tuple = (), data: dict | None = None) -> list:
    """The hosts of ``inventory`` (a file, or hosts separated by commas) named in ``limit``
    (all when it is empty), in inventory order, in a pyinfra State of their own; ``data``
    overrides host data as pyinfra's ``--data`` does. A name in ``limit`` that is no host
    of the inventory is a ValueError."""
    state = State(check_for_changes=False)
    with ctx_state.use(state):  # pyinfra runs inventory files inside a state
        inventory_obj = make_inventory(inventory, override_data=data, cwd=os.getcwd())
    state.init(inventory_obj, Config())
    names = [h.name for h in inventory_obj]
    unknown = [name for name in limit if name not in names]
    if unknown:
        raise ValueError(f"--limit: no host {', '.join(unknown)} in the inventory")
    return [h for h in inventory_obj if not limit or h.name in limit]


def parse_data(items: tuple) -> dict:
    """``--data KEY=VALUE`` items as pyinfra's CLI reads them."""
    from pyinfra_cli.util import parse_cli_arg

    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--data {item!r}: not KEY=VALUE")
        out[key] = parse_cli_arg(value)
    return out


@dataclass
class Reply:
    """What one host's command gave: whether it exited 0, and its output lines, or
    ``error``: why there is none (it could not be reached, the command timed out)."""

    name: str
    ok: bool = False
    output: list = field(default_factory=list)
    stderr: list = field(default_factory=list)
    error: Optional[str] = None

    @property
    def reachable(self) -> bool:
        return self.error is None


def run_one(host, command: str, timeout: int) -> Reply:
    """``command`` (shell text) on ``host``, wrapped as its data says (``_sudo`` and the
    like, exactly as a deploy's command is), through the host's own pyinfra connector."""
    with ctx_state.use(host.state), ctx_host.use(host):
        try:
            if not host.connected:
                host.connect(reason="to audit", raise_exceptions=True)
            arguments, _ = pop_global_arguments(host.state, host, {})
            given = {k: v for k, v in arguments.items() if k in CONNECTOR_ARGUMENT_KEYS} | {"_timeout": timeout}
            ok, output = host.run_shell_command(StringCommand(command), **given)
        except (ConnectError, PyinfraError, OSError, TimeoutError) as e:
            return Reply(host.name, error=str(e) or type(e).__name__)
        except Exception as e:  # the connector failed otherwise (paramiko): this host only
            return Reply(host.name, error=f"{type(e).__name__}: {e}")
        finally:
            if host.connected:
                host.disconnect()
    return Reply(host.name, ok, list(output.stdout_lines), list(output.stderr_lines))


def run_each(jobs: dict, timeout: int, on_reply: Callable[[Reply], object]) -> Iterator[object]:
    """Run ``jobs`` ({host: command}) on every host at once; yield ``on_reply(reply)`` for
    each host as its reply comes in, so one host's answer is read while slower hosts work."""
    greenlets = [gevent.spawn(run_one, host, command, timeout) for host, command in jobs.items()]
    for done in gevent.iwait(greenlets):
        yield on_reply(done.get())

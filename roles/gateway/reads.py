"""The facts the gateway role reads: a serving host's units record, HAProxy's backends
as its runtime API shows them."""

import json
import shlex
from typing import Optional

from pyinfra.api import FactBase
from pyinfra.api.exceptions import FactProcessError

from pyinfra.facts.deb import DebPackages
from pyinfra.facts.files import File, Sha1File
from pyinfra.facts.server import Command
from llamarack import remote
from llamarack.facts.value import json_object

from .settings import ADMIN_SOCKET
from llamarack.facts import FactRead
from roles.server.reads import UnitState, secret_digest_command
from .plan import HAPROXY_CONFIG, PROMETHEUS_CONFIG, PROMETHEUS_KEY, PROMETHEUS_RULES, TARGETS


class UnitsRecord(FactBase[Optional[dict]]):
    """Returns a serving host's record of its llama-server units (``<root>/state/units.json``,
    written by the server role), or None when there is none."""

    def command(self, path: str) -> str:
        return f"cat {shlex.quote(path)} 2>/dev/null; true"

    def process(self, output) -> Optional[dict]:
        return json_object(output, "units.json")


class HaproxyServers(FactBase[Optional[dict]]):
    """Returns the servers of one HAProxy backend as its runtime API shows them (``show stat``
    on the admin socket), or None when nothing answers there."""

    def host_run(self, backend: str) -> tuple:
        return ("haproxy_runtime", "--socket", ADMIN_SOCKET, "--backend", backend, "audit")

    def command(self, backend: str) -> str:
        return remote.command(*self.host_run(backend))

    def process(self, output) -> Optional[dict]:
        text = "\n".join(output).strip()
        if text == "none":
            return None
        try:
            found = json.loads(text)
        except ValueError as e:
            raise FactProcessError(f"unreadable haproxy_runtime audit output: {e}") from e
        if not isinstance(found, dict) or not isinstance(found.get("servers"), dict):
            raise FactProcessError(f"haproxy_runtime audit gave no servers: {text[:80]!r}")
        return found


def reads(settings) -> tuple:
    """What the gateway role reads on a converged host: its part of preflight's one read."""
    if not settings.general.runs("gateway"):
        return ()
    packages = (FactRead.of(DebPackages),) if settings.is_gateway or settings.gateway.node_exporter else ()
    if not settings.is_gateway:
        return packages
    found = packages + (FactRead.of(UnitState, unit="haproxy.service"),
                        FactRead.of(Command, command=secret_digest_command(HAPROXY_CONFIG)),
                        FactRead.of(File, path=TARGETS),
                        FactRead.of(Sha1File, path=TARGETS))
    if settings.gateway.prometheus:
        found += (FactRead.of(Command, command=secret_digest_command(PROMETHEUS_KEY)),
                  FactRead.of(Sha1File, path=PROMETHEUS_RULES), FactRead.of(Sha1File, path=PROMETHEUS_CONFIG))
    return found


class ConfiguredServers(FactBase[list]):
    """Returns the server names of an HAProxy config file (its ``server NAME ...`` lines), in
    order: what the gateway was configured to route to; empty when there is no file."""

    def command(self, path: str) -> str:
        return f"awk '$1 == \"server\" {{ print $2 }}' {shlex.quote(path)} 2>/dev/null; true"

    def default(self) -> list:
        return []

    def process(self, output) -> list:
        return [line.strip() for line in output if line.strip()]

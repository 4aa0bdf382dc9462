"""One command per host through the system's OpenSSH client, every host at once (``llamarack audit``).

The deploy reaches hosts through pyinfra's connector (paramiko under gevent).
The audit runs one command per host and nothing else, so it reaches each
host as a bare ``ssh HOST true`` does: one ``ssh`` process per host, started
before the audit's planners are even imported, so the handshakes run while
the control side makes each host's script, which then goes to the host's
``sh`` on stdin. It reads the same host data as pyinfra's SSH connector
(``ssh_hostname``, ``ssh_port``, ``ssh_user``, ``ssh_key``,
``ssh_known_hosts_file``, ``ssh_strict_host_key_checking``,
``ssh_config_file``, as pyinfra's own ``rsync`` passes them to ``ssh``),
and wraps the command for ``_sudo``, ``_su_user``, ``_doas``... with
pyinfra's own ``make_unix_command``. What needs a password typed
(``ssh_password``, ``ssh_key_password``, ``_sudo_password``,
``_su_password``) is refused for that host: ssh runs in BatchMode.

The inventory is read with pyinfra's own loader, imported without its CLI
package's gevent monkey patching (nothing here runs under gevent: the
patching scans every installed distribution's entry points, 0.1-0.7 s).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import subprocess
import sys
import threading
import types
from dataclasses import dataclass
from typing import Optional

logger = logging.getLogger("llamarack.audit")

# Host data that needs a password typed: ssh runs with BatchMode=yes and cannot.
PASSWORD_DATA = ("ssh_password", "ssh_key_password", "_sudo_password", "_su_password")
# pyinfra's command arguments that change how a command is wrapped (make_unix_command).
WRAPPING = ("_sudo", "_sudo_user", "_use_sudo_login", "_preserve_sudo_env", "_su_user", "_use_su_login",
            "_preserve_su_env", "_su_shell", "_doas", "_doas_user", "_dzdo", "_dzdo_user", "_shell_executable",
            "_chdir", "_env")  # fmt: skip
# The remote side of each connection: a shell that reads its script from stdin.
REMOTE_SHELL = "sh -s"


def load_inventory(inventory: str):
    """pyinfra's ``Inventory`` of ``inventory`` (a file, or hosts separated by commas), loaded
    as ``pyinfra INVENTORY ...`` loads it, group data included."""
    if "pyinfra_cli" not in sys.modules:
        # pyinfra_cli/__init__.py is only gevent's monkey patching; its inventory module needs none.
        spec = importlib.util.find_spec("pyinfra_cli")
        package = types.ModuleType("pyinfra_cli")
        package.__path__ = list(spec.submodule_search_locations)
        package.__spec__ = spec
        sys.modules["pyinfra_cli"] = package
    from pyinfra.api import Config, State
    from pyinfra.context import ctx_inventory, ctx_state
    from pyinfra_cli.inventory import make_inventory

    state = State(check_for_changes=False)
    state.cwd = os.getcwd()
    ctx_state.set(state)
    hosts = make_inventory(inventory, cwd=state.cwd)
    ctx_inventory.set(hosts)
    state.init(hosts, Config())
    return hosts


def ssh_argv(name: str, data: dict, connect_timeout: int) -> list[str]:
    """The ``ssh`` command line that reaches host ``name`` from its pyinfra ``data``
    (the remote command not included)."""
    argv = ["ssh", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={connect_timeout}", "-o", "LogLevel=ERROR", "-T"]
    if data.get("ssh_config_file"):
        argv += ["-F", str(data["ssh_config_file"])]
    if data.get("ssh_known_hosts_file"):
        argv += ["-o", f"UserKnownHostsFile={data['ssh_known_hosts_file']}"]
    # pyinfra's default is accept-new; OpenSSH's own (ask) fails in BatchMode.
    strict = data.get("ssh_strict_host_key_checking") or "accept-new"
    argv += ["-o", f"StrictHostKeyChecking={strict}"]
    if data.get("ssh_port"):
        argv += ["-p", str(int(data["ssh_port"]))]
    if data.get("ssh_key"):
        argv += ["-i", str(data["ssh_key"]), "-o", "IdentitiesOnly=yes"]
    else:
        if data.get("ssh_allow_agent") is False:
            argv += ["-o", "IdentityAgent=none"]
    if data.get("ssh_user"):
        argv += ["-l", str(data["ssh_user"])]
    argv += ["--", str(data.get("ssh_hostname") or name)]
    return argv


def remote_command(arguments: dict) -> str:
    """``sh -s`` wrapped by pyinfra's ``make_unix_command`` for these command arguments
    (``_sudo`` and the like, from the host's data)."""
    from pyinfra.api.command import StringCommand
    from pyinfra.connectors.util import make_unix_command

    given = {k: v for k, v in arguments.items() if k in WRAPPING and v not in (None, False, "", {})}
    return make_unix_command(StringCommand(REMOTE_SHELL), **given).get_raw_value()


@dataclass
class Result:
    """What one host's command gave: ``output`` its stdout lines; ``error`` why there is
    none (cannot connect, refused before connecting)."""

    name: str
    status: Optional[int]
    output: list
    error: Optional[str] = None
    stderr: str = ""

    @property
    def reachable(self) -> bool:
        return self.error is None


class Session:
    """One host's ``ssh`` process, connecting from the moment it is made; ``send`` gives
    its shell the script and collects the output."""

    def __init__(self, host, connect_timeout: int):
        from pyinfra.api.arguments import pop_global_arguments

        self.name = host.name
        self.host = host
        data = host.data.dict()
        typed = [k for k in PASSWORD_DATA if data.get(k)]
        self.refused = f"needs a password typed ({', '.join(typed)}): the audit's ssh runs in BatchMode; " \
            "use a key or an agent" if typed else None  # fmt: skip
        self.proc = None
        self._result: Optional[Result] = None
        self._thread: Optional[threading.Thread] = None
        if self.refused:
            return
        arguments, _ = pop_global_arguments(host.state, host, {})
        self.command = remote_command(dict(arguments))
        self.argv = ssh_argv(host.name, data, connect_timeout) + [self.command]
        self.proc = subprocess.Popen(self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE)  # fmt: skip

    def send(self, script: str, timeout: float) -> None:
        """Give the host's shell ``script`` (in the background); ``result`` waits for it."""
        if self.proc is None:
            self._result = Result(self.name, None, [], self.refused)
            return
        # The same line pyinfra's connector logs for each command (the benchmarks count them).
        logger.debug("Running command on %s: (pty=False) %s <<< %s", self.name, self.command, script)
        self._thread = threading.Thread(target=self._communicate, args=(script, timeout), daemon=True)
        self._thread.start()

    def _communicate(self, script: str, timeout: float) -> None:
        try:
            out, err = self.proc.communicate(script.encode(), timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, err = self.proc.communicate()
            self._result = Result(self.name, None, [], f"no answer within {timeout:.0f} s")
            return
        except BrokenPipeError:  # ssh exited before taking the script: it could not connect
            out, err = b"", self.proc.stderr.read() if self.proc.stderr else b""
            self.proc.wait()
        lines = out.decode(errors="replace").splitlines()
        if self.proc.returncode == 255 and not lines:
            why = err.decode(errors="replace").strip().splitlines()
            self._result = Result(self.name, 255, [], why[-1] if why else "ssh exited 255: cannot connect")
        else:
            self._result = Result(self.name, self.proc.returncode, lines, stderr=err.decode(errors="replace"))

    def result(self) -> Result:
        if self._thread is not None:
            self._thread.join()
        assert self._result is not None, "send() first"
        return self._result

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def select(hosts, limit: tuple = ()) -> list:
    """The hosts of the inventory ``hosts`` named in ``limit`` (all when it is empty), in inventory order."""
    names = [h.name for h in hosts]
    unknown = [name for name in limit if name not in names]
    if unknown:
        raise ValueError(f"--limit: no host {', '.join(unknown)} in the inventory")
    return [h for h in hosts if not limit or h.name in limit]


def connect(hosts, connect_timeout: Optional[int] = None) -> list[Session]:
    """One ``ssh`` process per host of ``hosts``, all started now (they connect and
    authenticate while the caller makes the scripts)."""
    if connect_timeout is None:
        from pyinfra.api import Config

        connect_timeout = Config().CONNECT_TIMEOUT
    return [Session(h, connect_timeout) for h in hosts]

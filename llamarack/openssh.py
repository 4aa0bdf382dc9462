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

Importing pyinfra (and paramiko under it) takes about 0.17 s, so the ssh
processes start before that, from a light read of an inventory file
(``early``): the file is executed once (pyinfra's loader then takes its
result instead of executing it again), the group-data files beside it and
in the working directory are read for the ``all`` group, and each host whose
connection data is plain (no password, no group overriding another) gets
its ``ssh`` at once. Once pyinfra has loaded the inventory, each host's
``ssh`` command line is made again from its real data: an early process is
kept only when its command line is the same, else it is stopped and the
right one started, so the light read can cost time but not reach a host
differently.

Every host's ssh runs the same plain remote command, ``sh -s`` (as
``make_unix_command`` writes it with no arguments), so it can start before
pyinfra is imported, which is what ``_sudo`` and the like need: the wrapped
shell (``sudo -H -n sh -c 'sh -s'``) is the one command of the script the
plain shell is given, with the audit's script as its here-document. A host
reached through sudo used to connect only once pyinfra had loaded the
inventory, half a second later, and its handshake and script then ran alone
at the end of every audit.

The ssh processes run below the audit's own priority (``SSH_NICENESS``):
where the cores are few (the lab: 2 cores for the audit, its ssh clients and
the hosts), the handshakes otherwise took their fair share from the audit's
Python, finished first, and then waited for the scripts while a core idled.
"""

from __future__ import annotations

import contextlib
import functools
import os
import subprocess
import sys
import threading
import types
from typing import Iterator, Optional

# The ssh processes start from here (``early``) before pyinfra is imported, so this module
# imports only what subprocess already has (contextlib, functools, threading, types):
# logging and importlib.util are imported where they are used, and the module declares no
# dataclass (dataclasses imports inspect). Its import was 22 to 36 ms of CPU before the
# first ssh, with the other core idle; it is 7 to 10 ms.


def _debug(message: str, *args) -> None:
    import logging

    logging.getLogger("llamarack.audit").debug(message, *args)

# Host data that needs a password typed: ssh runs with BatchMode=yes and cannot.
PASSWORD_DATA = ("ssh_password", "ssh_key_password", "_sudo_password", "_su_password")
# pyinfra's command arguments that change how a command is wrapped (make_unix_command).
WRAPPING = ("_sudo", "_sudo_user", "_use_sudo_login", "_preserve_sudo_env", "_su_user", "_use_su_login",
            "_preserve_su_env", "_su_shell", "_doas", "_doas_user", "_dzdo", "_dzdo_user", "_shell_executable",
            "_chdir", "_env")  # fmt: skip
# The remote side of each connection: a shell that reads its script from stdin.
REMOTE_SHELL = "sh -s"


@contextlib.contextmanager
def _without_invoke():
    """``import invoke`` refused while pyinfra is imported. pyinfra.api imports paramiko
    (for its exception names), and paramiko.config imports invoke, only ever to run an
    ssh_config ``Match exec`` for a paramiko connection: the audit's connections are the
    system's ssh, and importing invoke took 28 ms of the audit's 250 ms of Python CPU.
    paramiko keeps the ImportError for ``Match exec``; later imports of invoke work."""
    if "invoke" in sys.modules:
        yield
        return
    sys.modules["invoke"] = None  # the import system's own "not importable" mark
    try:
        yield
    finally:
        if sys.modules.get("invoke", False) is None:
            del sys.modules["invoke"]


def load_inventory(inventory: str, executed: Optional[dict] = None):
    """pyinfra's ``Inventory`` of ``inventory`` (a file, or hosts separated by commas), loaded
    as ``pyinfra INVENTORY ...`` loads it, group data included. ``executed``: the namespaces
    of the files ``early`` executed (the inventory file, its ``all`` group data), by the path
    pyinfra's loader names them with: not executed a second time."""
    import importlib.util

    if "pyinfra_cli" not in sys.modules:
        # pyinfra_cli/__init__.py is only gevent's monkey patching; its inventory module needs none.
        spec = importlib.util.find_spec("pyinfra_cli")
        package = types.ModuleType("pyinfra_cli")
        package.__path__ = list(spec.submodule_search_locations)
        package.__spec__ = spec
        sys.modules["pyinfra_cli"] = package
    with _without_invoke():
        from pyinfra.api import Config, State
    from pyinfra.context import ctx_inventory, ctx_state
    from pyinfra_cli import inventory as loader

    state = State(check_for_changes=False)
    state.cwd = os.getcwd()
    ctx_state.set(state)
    # pyinfra's Inventory asks for the installed connectors 4 times while it is made, each
    # a scan of every installed distribution's entry points (25 ms each here): asked once.
    from pyinfra.api import inventory as inventory_module

    connectors = (inventory_module.get_all_connectors, inventory_module.get_execution_connectors)
    found = connectors[0]()
    execution = {name: module for name, module in found.items() if module.handles_execution}
    inventory_module.get_all_connectors = lambda: dict(found)
    inventory_module.get_execution_connectors = lambda: dict(execution)
    exec_file, imported_names = loader.exec_file, loader._get_imported_names
    # pyinfra parses a group data file again for each name it defines (ast.parse in a
    # comprehension's condition: 83 parses of group_data/all.py here); once per file.
    loader._get_imported_names = functools.lru_cache(maxsize=None)(imported_names)
    if executed:

        def once(filename, return_locals=False, is_deploy_code=False):
            # pyinfra names the inventory file as given (often relative), its group data absolute
            if return_locals and os.path.abspath(filename) in executed:
                return executed.pop(os.path.abspath(filename))
            return exec_file(filename, return_locals=return_locals, is_deploy_code=is_deploy_code)

        loader.exec_file = once
    try:
        hosts = loader.make_inventory(inventory, cwd=state.cwd)
    finally:
        loader.exec_file, loader._get_imported_names = exec_file, imported_names
        inventory_module.get_all_connectors, inventory_module.get_execution_connectors = connectors
    ctx_inventory.set(hosts)
    state.init(hosts, Config())
    return hosts


def global_arguments_once() -> None:
    """pyinfra checks each fact class as it is declared (``FactBase.__init_subclass__``): its
    command must not take a global argument's name. It makes the list of those names again
    for each class, from type hints (``get_type_hints`` of a TypedDict, about 1 ms apiece on
    a 2-core host), and the audit declares about a hundred fact classes (pyinfra's fact
    modules and llamarack's): 40 to 60 ms of its Python. The list cannot change within a
    process, so this makes it once and hands out copies; the check itself is pyinfra's.
    For a process that is only the audit (``llamarack.entry``)."""
    from pyinfra.api import facts

    names = facts.all_global_arguments()
    facts.all_global_arguments = lambda: list(names)


# What ``connect`` gives ssh when pyinfra's Config does not say otherwise (its CONNECT_TIMEOUT).
DEFAULT_CONNECT_TIMEOUT = 10
# ``sh -s`` as pyinfra's make_unix_command wraps it with no command arguments.
PLAIN_REMOTE_COMMAND = "sh -c 'sh -s'"


class Early:
    """What ``early`` read and started: the namespaces of the files it executed, by
    absolute path (for ``load_inventory``), and one ssh process per host, by name, with
    its command line."""

    def __init__(self, executed: dict, started: dict):
        self.executed = executed
        self.started = started

    def stop(self) -> None:
        """Stop every ssh process started early (the audit will not use them)."""
        for _, proc in self.started.values():
            _stop(proc)


def _exec(filename: str) -> dict:
    """A Python file's namespace, executed as pyinfra's ``exec_file`` executes it."""
    with open(filename, encoding="utf-8") as f:
        code = compile(f.read(), filename, "exec")
    namespace = {"__file__": filename}
    exec(code, namespace)
    return namespace


def _light_hosts(inventory: str) -> tuple[dict, dict]:
    """({path: namespace} of the files executed: the inventory file and its ``all`` group
    data, {host: data}) for the hosts whose connection data they give plainly; ({}, {})
    when the inventory is not a file."""
    if not (inventory.endswith(".py") and os.path.isfile(inventory)):
        return {}, {}
    path = os.path.abspath(inventory)
    namespace = _exec(path)
    executed = {path: namespace}
    groups = {}
    for key, value in namespace.items():
        if key.startswith("_") or not isinstance(value, (list, tuple)):
            continue
        members, data = (value if isinstance(value, tuple) and len(value) == 2 and isinstance(value[1], dict)
                         else (value, {}))  # fmt: skip
        if isinstance(members, (list, tuple)) and all(isinstance(m, (str, tuple)) for m in members):
            groups[key] = (members, data)
    all_data = dict(groups.pop("all", ((), {}))[1])
    for folder in dict.fromkeys([os.path.join(os.getcwd(), "group_data"),
                                 os.path.join(os.path.dirname(os.path.realpath(path)), "group_data")]):  # fmt: skip
        group_file = os.path.join(folder, "all.py")
        if os.path.isfile(group_file):
            executed[group_file] = _exec(group_file)
            all_data.update({k: v for k, v in executed[group_file].items()
                             if not k.startswith("__") and not isinstance(v, types.ModuleType)})  # fmt: skip
    hosts: dict = {}
    group_set: dict = {}
    for group, (members, data) in groups.items():
        for member in members:
            name, own = member if isinstance(member, tuple) else (member, {})
            group_set.setdefault(name, []).append(data)
            hosts.setdefault(name, {}).update(own or {})
    plain = {}
    for name, own in hosts.items():
        merged = dict(all_data)
        for data in group_set[name]:
            if any(k in merged and merged[k] != v and k in data for k, v in data.items() if k.startswith("ssh_")):
                break  # two groups disagree: pyinfra's order decides; left to it
            merged.update(data)
        else:
            merged.update(own)
            if not any(merged.get(k) for k in PASSWORD_DATA):
                plain[name] = merged
    return executed, plain


def early(inventory: str, limit: tuple = ()) -> Early:
    """Start an ``ssh`` to each host of an inventory file at once, from a light read of
    it (see the module's docstring); nothing when the read fails or finds no plain host."""
    try:
        executed, plain = _light_hosts(inventory)
    except Exception as e:  # pyinfra's loader reads it again, and says what is wrong
        _debug("early connect: %s: %s", inventory, e)
        return Early({}, {})
    started = {}
    for name, data in plain.items():
        if limit and name not in limit:
            continue
        argv = ssh_argv(name, data, DEFAULT_CONNECT_TIMEOUT) + [PLAIN_REMOTE_COMMAND]
        started[name] = (argv, _spawn(argv))
    return Early(executed, started)


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


def through(command: str, script: str) -> str:
    """What the plain remote shell is given so that ``script`` runs in the wrapped shell
    ``command`` (``remote_command``'s): that one command, the script its here-document
    (quoted: the script reaches the wrapped shell byte for byte). Its status is the shell's."""
    if command == PLAIN_REMOTE_COMMAND:
        return script
    while True:  # a delimiter that is no line of the script
        end = f"llamarack-script-end-{os.urandom(8).hex()}"
        if end not in script:
            break
    body = script if script.endswith("\n") else script + "\n"
    # No value is quoted here: ``command`` is already shell text, each host-data value in it
    # (``_sudo_user``, ``_chdir``, ``_env``...) quoted by pyinfra's make_unix_command, as in
    # the deploy; ``end`` is made here of letters, digits and dashes, and quoted as a whole
    # so the shell expands nothing in the script.
    return f"{command} <<'{end}'\n{body}{end}\n"


class Result:
    """What one host's command gave: ``output`` its stdout lines; ``error`` why there is
    none (cannot connect, refused before connecting)."""

    def __init__(self, name: str, status: Optional[int], output: list, error: Optional[str] = None,
                 stderr: str = ""):  # fmt: skip
        self.name, self.status, self.output, self.error, self.stderr = name, status, output, error, stderr

    def __repr__(self) -> str:
        return f"Result({self.name!r}, status={self.status!r}, error={self.error!r})"

    @property
    def reachable(self) -> bool:
        return self.error is None


class Session:
    """One host's ``ssh`` process, connecting from the moment it is made; ``send`` gives
    its shell the script and collects the output."""

    def __init__(self, host, connect_timeout: int, early: Optional[tuple] = None):
        """``early``: (command line, process) of an ssh ``early`` started for this host,
        kept when the command line is the one its data gives."""
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
        self.argv = ssh_argv(host.name, data, connect_timeout) + [PLAIN_REMOTE_COMMAND]
        if early is not None and early[0] == self.argv:
            self.proc = early[1]
            return
        if early is not None:
            _debug("early connect: %s: its ssh command line differs from its data's; started again", host.name)
            _stop(early[1])
        self.proc = _spawn(self.argv)

    def send(self, script: str, timeout: float, replies=None) -> None:
        """Give the host's shell ``script`` (in the background); ``result`` waits for it.
        ``replies``: a queue this session is put on once its result is in (read by ``answered``)."""
        if self.proc is None:
            self._result = Result(self.name, None, [], self.refused)
            if replies is not None:
                replies.put(self)
            return
        # The same line pyinfra's connector logs for each command (the benchmarks count them).
        _debug("Running command on %s: (pty=False) %s <<< %s", self.name, self.command, script)
        self._thread = threading.Thread(target=self._communicate,
                                        args=(through(self.command, script), timeout, replies), daemon=True)
        self._thread.start()

    def _communicate(self, script: str, timeout: float, replies=None) -> None:
        try:
            self._collect(script, timeout)
        except Exception as e:  # the pipe or the process failed otherwise: this host only
            self._result = Result(self.name, None, [], f"{type(e).__name__}: {e}")
        finally:
            if replies is not None:
                replies.put(self)

    def _collect(self, script: str, timeout: float) -> None:
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
        if self.proc is not None:
            _stop(self.proc)


def answered(sessions: list, replies) -> Iterator[Session]:
    """``sessions`` in the order their hosts answer (each was sent its script with this
    ``replies`` queue), so what comes back is read while the slower hosts still work."""
    for _ in sessions:
        yield replies.get()


# How much less CPU an audit's ssh processes get than the audit itself, when they compete.
SSH_NICENESS = 10


def _spawn(argv: list) -> subprocess.Popen:
    """Start one host's ssh, below the audit's own priority. The handshakes (0.17 s of CPU
    each with OpenSSH's default post-quantum key exchange) would otherwise take their fair
    share of the cores from the audit's Python, which is importing pyinfra and making the
    scripts the connections then wait for; where cores are short, the handshakes finish
    early and wait while one core idles. Set after the start, not in a ``preexec_fn``: that
    would fork the whole interpreter instead of spawning ssh."""
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        os.setpriority(os.PRIO_PROCESS, proc.pid, os.getpriority(os.PRIO_PROCESS, 0) + SSH_NICENESS)
    except OSError:  # it has exited already (it could not start): nothing to schedule
        pass
    return proc


def _stop(proc) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def select(hosts, limit: tuple = ()) -> list:
    """The hosts of the inventory ``hosts`` named in ``limit`` (all when it is empty), in inventory order."""
    names = [h.name for h in hosts]
    unknown = [name for name in limit if name not in names]
    if unknown:
        raise ValueError(f"--limit: no host {', '.join(unknown)} in the inventory")
    return [h for h in hosts if not limit or h.name in limit]


def connect(hosts, connect_timeout: Optional[int] = None, started: Optional[Early] = None) -> list[Session]:
    """One ``ssh`` process per host of ``hosts``, all started now (they connect and
    authenticate while the caller makes the scripts), or kept from ``started`` (``early``).
    An early process of a host not among ``hosts`` is stopped."""
    if connect_timeout is None:
        from pyinfra.api import Config

        connect_timeout = Config().CONNECT_TIMEOUT
    left = Early({}, dict(started.started) if started else {})
    sessions = [Session(h, connect_timeout, left.started.pop(h.name, None)) for h in hosts]
    left.stop()
    return sessions

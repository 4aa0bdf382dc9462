"""One compile per build in a run: the first host that needs a build makes it, the others
that need the same build receive it, sealed, through the control machine.

In one pyinfra run, the hosts whose build step must make build S take S in turn (a lock per
S on the control machine; hosts of other builds go on at once). The first one compiles and
proves S as before (``operations.build``), seals it, packs the sealed files
(``files/build_ship.py pack``) and the control machine fetches the tar into a private
directory of this run, checking the sha256 the host printed. Each later host receives that
tar instead of compiling: it checks the tar's sha256, unpacks it beside its builds, checks
every file against the seal it carries, proves it on its own cards (the smoke run, as a
re-proof: no rebuild rung), seals it as its own and only then moves it into ``builds/``. A
host that already holds a sealed S (from an earlier run) is a source too: the first host
needing S fetches S from it and compiles nothing.

A build is shared only between hosts that share its ``key``: its stamp, and for a build whose
CPU code is the building host's own (``llamacpp_cpu_features`` unset: ``-march=native``)
also that CPU's flags, so native code never reaches a CPU it was not made for.

A refused shipment (damaged, or failing the receiver's proof) leaves the host as it was,
still serving its current build; the host then builds for itself. docs/deploy.md
("One compile per build") says where builds are made and why.
"""

from __future__ import annotations

import atexit
import fcntl
import hashlib
import json
import os
import shlex
import shutil
import tempfile
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Optional

import gevent.lock
from pyinfra import logger
from pyinfra.api import StringCommand
from pyinfra.api.arguments import CONNECTOR_ARGUMENT_KEYS, pop_global_arguments
from pyinfra.api.util import print_host_combined_output
from pyinfra.context import ctx_host

from llamarack import remote
from llamarack.layout import Layout
from llamarack.operations import private_upload

from .files.build_seal import sha256

SHIP_TIMEOUT = 3600  # seconds a pack, fetch or receive of one build may take


@dataclass(frozen=True)
class Shipment:
    """A build's tar on the control machine."""

    path: str
    sha256: str
    bytes: int
    source: str  # the host it came from


@dataclass
class Holder:
    host: object  # a pyinfra Host
    build_dir: str


# A directory that several pyinfra runs share: ``llamarack rollout`` sets it for its stage, whose
# runs are one per host. Their turns are then file locks there, and a build one run made is
# published there (its tar and a note) for the others to receive.
SHIP_DIR_ENV = "LLAMARACK_SHIP_DIR"


class Shipping:
    """One run's builds on the move (``for_state``): who holds each, what was fetched; with
    ``shared`` (``SHIP_DIR_ENV``) also what the other runs sharing that directory made."""

    def __init__(self, shared: Optional[str] = None):
        self.shared = shared if shared and os.path.isdir(shared) else None
        self._dir: Optional[str] = self.shared
        self.locks = defaultdict(gevent.lock.Semaphore)
        self.holders = defaultdict(list)
        self.shipped: dict = {}

    @property
    def dir(self) -> str:
        if self._dir is None:
            self._dir = tempfile.mkdtemp(prefix="llamarack-builds-")  # mode 700
            atexit.register(shutil.rmtree, self._dir, True)
        return self._dir

    def hold(self, key: str, host, build_dir: str) -> None:
        """``host`` holds a proven, sealed build of ``key`` in ``build_dir`` (found when planned)."""
        if all(h.host is not host for h in self.holders[key]):
            self.holders[key].append(Holder(host, build_dir))

    @contextmanager
    def turn(self, key: str):
        """This run's turn at ``key``: against its other hosts, and the other runs sharing the directory."""
        with self.locks[key]:
            if not self.shared:
                yield
                return
            fd = os.open(os.path.join(self.shared, f"{key}.lock"), os.O_CREAT | os.O_RDWR, 0o600)
            try:
                while True:
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        break
                    except BlockingIOError:
                        gevent.sleep(1)  # another run compiles it: the other hosts of this one go on
                yield
            finally:
                os.close(fd)

    def published(self, key: str) -> Optional[Shipment]:
        """The build another run sharing the directory made and published, if any."""
        if not self.shared:
            return None
        try:
            with open(os.path.join(self.shared, f"{key}.json")) as f:
                note = json.load(f)
            shipment = Shipment(os.path.join(self.shared, f"{key}.tar"), str(note["sha256"]), int(note["bytes"]),
                                str(note["source"]))  # fmt: skip
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return shipment if os.path.isfile(shipment.path) else None

    def publish(self, key: str, shipment: Shipment) -> None:
        """Tell the other runs sharing the directory where ``key``'s tar is (written last)."""
        self.shipped[key] = shipment
        if self.shared:
            note = os.path.join(self.shared, f"{key}.json")
            with open(note + ".new", "w") as f:
                json.dump(asdict(shipment), f)
            os.replace(note + ".new", note)


_RUNS: dict = {}


def for_state(state) -> Shipping:
    if id(state) not in _RUNS:
        _RUNS[id(state)] = Shipping(os.environ.get(SHIP_DIR_ENV))
    return _RUNS[id(state)]


def build_key(stamp: str, cmake_args: tuple, cpu_flags: Optional[str]) -> Optional[str]:
    """What hosts must share to share a build: the stamp, and the CPU where the code is native.
    None: not shared (a native build on a host whose CPU flags were not read)."""
    native = not any(a.startswith("-DGGML_NATIVE=OFF") for a in cmake_args)
    if not native:
        return stamp
    if not cpu_flags:
        return None
    return f"{stamp}-{hashlib.sha256(cpu_flags.encode()).hexdigest()[:12]}"


def _arguments(state, host) -> dict:
    """The connector arguments a deploy's command on ``host`` gets (``_sudo`` and the like)."""
    with ctx_host.use(host):
        arguments, _ = pop_global_arguments(state, host, {})
    return {k: v for k, v in arguments.items() if k in CONNECTOR_ARGUMENT_KEYS}


def _run(state, host, commands, timeout: Optional[int] = None) -> tuple:
    """Run pyinfra commands (``StringCommand``s, uploads) on ``host`` as its deploy would;
    (ok, the last command's stdout lines)."""
    base = _arguments(state, host) | ({"_timeout": timeout} if timeout else {})
    lines: list = []
    for command in commands:
        command = StringCommand(command) if isinstance(command, str) else command
        result = command.execute(state, host, dict(base))
        ok, output = result if isinstance(result, tuple) else (result, None)
        if output is not None:
            lines = list(output.stdout_lines)
            if not ok and not state.print_output:  # what pyinfra shows of a failed command
                print_host_combined_output(host, output)
        if not ok:
            return False, lines
    return True, lines


def fetch(state, holder: Holder, key: str, shipping: Shipping) -> Optional[Shipment]:
    """Pack ``holder``'s build and bring the tar here, checked against the sha256 it printed."""
    host = holder.host
    remote_tar = f"{holder.build_dir}.ship.tar"
    pack = remote.command("build_ship", "pack", holder.build_dir, remote_tar)
    ok, lines = _run(state, host, [pack], SHIP_TIMEOUT)
    try:
        told = json.loads(lines[-1]) if ok and lines else None
    except ValueError:
        told = None
    local = os.path.join(shipping.dir, f"{key}.tar")
    try:
        if not told or not host.get_file(remote_tar, local + ".part", **_arguments(state, host)):
            return None
        if sha256(local + ".part") != told.get("sha256"):
            logger.warning(f"{host.print_prefix}llama.cpp build {key}: its tar changed between the pack and "
                           "the fetch; not shipped")  # fmt: skip
            return None
        os.replace(local + ".part", local)
    finally:
        _run(state, host, [f"rm -f {shlex.quote(remote_tar)}"])
    shipment = Shipment(local, told["sha256"], int(told["bytes"]), host.name)
    return shipment


def receive(state, host, shipment: Shipment, root: str, name: str, spec: dict) -> bool:
    """Take ``shipment`` in on ``host`` as ``builds/<name>``: checked, proven here, sealed."""
    layout = Layout(root)
    incoming = f"{layout.builds}/.incoming-{name}"
    tar = f"{incoming}.tar"
    q_in, q_tar, q_final = shlex.quote(incoming), shlex.quote(tar), shlex.quote(layout.build(name))
    spec = dict(spec, build_dir=incoming)
    with open(shipment.path, "rb") as f:
        commands = [
            f"mkdir -p {shlex.quote(layout.builds)}",
            *private_upload(f, tar),
            StringCommand(remote.command("build_ship", "receive", tar, shipment.sha256, incoming), "&&",
                          f"ln -sfn build/bin {q_in}/bin"),  # fmt: skip
            *private_upload(json.dumps(spec, indent=1, sort_keys=True), f"{incoming}/proof-spec.json"),
            StringCommand(remote.command("llamacpp_proof", f"{incoming}/proof-spec.json"), "&&",
                          remote.command("build_seal", "seal", incoming), "&&",
                          f"rm -rf {q_final} && mv -T {q_in} {q_final} && rm -f {q_tar}"),  # fmt: skip
        ]
        ok, _ = _run(state, host, commands, SHIP_TIMEOUT)
    if not ok:
        _run(state, host, [f"rm -rf {q_in} {q_tar}"])
        logger.warning(f"{host.print_prefix}llama.cpp build {name} from {shipment.source} refused here "
                       "(the build it serves is unchanged); building it here instead")  # fmt: skip
    return ok


def obtain(state, host, key: str, root: str, name: str, build_commands: list, spec: dict) -> bool:
    """The build step of ``host`` for build ``key``, run when the deploy reaches it (a
    ``FunctionCommand``): receive the build where this run, a run sharing its directory or a
    host of the rack has it, else compile it here (``build_commands``) and hold it for the
    next host. Only finding or making the build takes turns; hosts receive it side by side."""
    shipping = for_state(state)
    with shipping.turn(key):
        shipment = shipping.shipped.get(key) or shipping.published(key) or from_holders(state, host, key, name)
        if not shipment:
            return compile_here(state, host, key, root, name, build_commands, publish=True)
    logger.info(f"{host.print_prefix}llama.cpp build {name}: receiving it from {shipment.source} "
                f"({shipment.bytes / 2**20:.0f} MiB), not compiling it")  # fmt: skip
    if receive(state, host, shipment, root, name, spec):
        return True
    with shipping.locks[key]:  # the next host fetches again, from a source that may be this one
        if shipping.shipped.get(key) is shipment:
            del shipping.shipped[key]
    return compile_here(state, host, key, root, name, build_commands)


def from_holders(state, host, key: str, name: str) -> Optional[Shipment]:
    """The build fetched from the first host of this run that holds it and gives it; published."""
    shipping = for_state(state)
    for holder in list(shipping.holders[key]):
        try:
            shipment = fetch(state, holder, key, shipping)
        except Exception as e:  # the source's connection failed (paramiko, a timeout): try the next
            logger.warning(f"{host.print_prefix}llama.cpp build {name}: no copy from {holder.host.name} "
                           f"({type(e).__name__}: {e})")  # fmt: skip
            continue
        if shipment:
            shipping.publish(key, shipment)
            return shipment
    return None


def compile_here(state, host, key: str, root: str, name: str, build_commands: list, publish: bool = False) -> bool:
    """Compile and prove the build on ``host`` (its own commands), seal it, and hold it for the
    run; with ``publish``, where other runs share the directory, fetch it for them now (they
    cannot reach this host through this run)."""
    shipping = for_state(state)
    ok, _ = _run(state, host, build_commands)
    if not ok:
        return False
    d = Layout(root).build(name)
    if _run(state, host, [remote.command("build_seal", "seal", d)])[0]:
        shipping.hold(key, host, d)
        if publish and shipping.shared:
            from_holders(state, host, key, name)
    return True

"""Make an artifact once in a run, and ship it, sealed, to the other hosts that need it.

A role whose step makes an expensive artifact (a llama.cpp build, a model) calls ``obtain``
from that step, run as a pyinfra ``FunctionCommand`` when the deploy reaches it. The hosts
whose step must make artifact ``key`` take ``key`` in turn (a lock per key on the control
machine; hosts of other keys go on at once). The first one makes it (the role's ``make``),
the others receive it instead (the role's ``receive``). The control machine fetches the
artifact once from a host that holds it (``pack``: ``files/artifact_ship.py pack`` writes a
tar of the files the artifact's seal names and prints its sha256) into a private directory
of this run, checks that sha256, and hands the same tar to each receiver, which checks it
again and every file against the seal before the role proves it there. A host that held
the artifact before the run is a source too: the first host needing it fetches it from
that host and nothing is made.

Several pyinfra runs can share one directory (``SHIP_DIR_ENV``: ``llamarack rollout`` sets it
for its stage, whose runs are one per host): their turns are then file locks there too, and
an artifact one run made is published there (its tar and a note) for the others.

A host can be a preferred maker of ``key`` (``prefer``, while planned: a model step whose
blob cache holds the checkpoint makes the artifact without asking the hub). A host that
is not then leaves the turn to the preferred ones of its run that run the same step, and
of the runs sharing its directory while their run lives, until they have made it or failed.

A refused shipment leaves the host as it was; the role then makes the artifact there.
"""

from __future__ import annotations

import atexit
import fcntl
import json
import os
import shlex
import shutil
import tempfile
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Optional

import gevent.lock
from pyinfra import logger
from pyinfra.api import StringCommand
from pyinfra.api.arguments import CONNECTOR_ARGUMENT_KEYS, pop_global_arguments
from pyinfra.api.util import print_host_combined_output
from pyinfra.context import ctx_host

from llamarack import remote

from .files.artifact_ship import sha256_file as sha256

remote.add_scripts(Path(__file__).resolve().parent.parent)  # files/artifact_ship.py

SHIP_TIMEOUT = 3600  # seconds a pack, fetch or receive of one artifact may take
# A directory several pyinfra runs share (``llamarack rollout``'s stage): turns and artifacts.
SHIP_DIR_ENV = "LLAMARACK_SHIP_DIR"


@dataclass(frozen=True)
class Shipment:
    """An artifact's tar on the control machine."""

    path: str
    sha256: str
    bytes: int
    source: str  # the host it came from


@dataclass
class Holder:
    host: object  # a pyinfra Host
    path: str  # the artifact's directory there


class Shipping:
    """One run's artifacts on the move (``for_state``): who holds each, what was fetched; with
    ``shared`` (``SHIP_DIR_ENV``) also what the other runs sharing that directory made."""

    def __init__(self, shared: Optional[str] = None):
        self.shared = shared if shared and os.path.isdir(shared) else None
        self._dir: Optional[str] = self.shared
        self.locks = defaultdict(gevent.lock.Semaphore)
        self.holders = defaultdict(list)
        self.shipped: dict = {}
        self.preferred = defaultdict(list)  # key -> hosts of this run preferred to make it
        self.settled = defaultdict(set)  # key -> names of the hosts whose step for it is over, made or not
        self.markers: dict = {}  # (key, host name) -> an open file locked while it is preferred

    @property
    def dir(self) -> str:
        if self._dir is None:
            self._dir = tempfile.mkdtemp(prefix="llamarack-ship-")  # mode 700
            atexit.register(shutil.rmtree, self._dir, True)
        return self._dir

    def hold(self, key: str, host, path: str) -> None:
        """``host`` holds a proven, sealed artifact of ``key`` in ``path``."""
        if all(h.host is not host for h in self.holders[key]):
            self.holders[key].append(Holder(host, path))

    def prefer(self, key: str, host) -> None:
        """``host`` should make ``key`` rather than another host (it has what makes it cheap).
        Runs sharing the directory see it by a file lock held until its step is over."""
        if any(p is host for p in self.preferred[key]):
            return
        self.preferred[key].append(host)
        if self.shared:
            fd = os.open(os.path.join(self.shared, f"{key}.maker.{host.name}"), os.O_CREAT | os.O_RDWR, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                self.markers[(key, host.name)] = fd
            except BlockingIOError:  # another run plans the same host: its own lock stands
                os.close(fd)

    def settle(self, key: str, host) -> None:
        """``host``'s step for ``key`` is over (made, received or failed)."""
        self.settled[key].add(host.name)
        fd = self.markers.pop((key, host.name), None)
        if fd is not None:
            os.close(fd)  # releases the lock

    def pending_makers(self, key: str, host) -> list:
        """The preferred makers of ``key`` whose step ``host`` waits for: this run's that run the
        same operation now and are not done, and those of live runs sharing the directory."""
        if any(p is host for p in self.preferred[key]):
            return []
        names = [p.name for p in self.preferred[key]
                 if p.name not in self.settled[key] and _executing(p) is not None and _executing(p) == _executing(host)]
        if self.shared:
            mine = {name for (k, name) in self.markers if k == key}
            prefix = f"{key}.maker."
            for entry in sorted(os.listdir(self.shared)):
                if entry.startswith(prefix) and entry[len(prefix):] not in mine | {host.name}:
                    if _locked(os.path.join(self.shared, entry)):
                        names.append(entry[len(prefix):])
        return names

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
                        gevent.sleep(1)  # another run makes it: the other hosts of this one go on
                yield
            finally:
                os.close(fd)

    def published(self, key: str) -> Optional[Shipment]:
        """The artifact another run sharing the directory made and published, if any."""
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


def _executing(host):
    """The operation ``host`` runs now (pyinfra's ``Host.executing_op_hash``), or None."""
    return getattr(host, "executing_op_hash", None)


def _locked(path: str) -> bool:
    """Whether another open file description holds a lock on ``path`` (a live preferred maker)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


_RUNS: dict = {}


def for_state(state) -> Shipping:
    if id(state) not in _RUNS:
        _RUNS[id(state)] = Shipping(os.environ.get(SHIP_DIR_ENV))
    return _RUNS[id(state)]


def hold(key: str, path: str) -> None:
    """While planned: the host being planned holds ``key``'s artifact, proven and sealed, at ``path``."""
    host = ctx_host.get()
    for_state(host.state).hold(key, host, path)


def prefer(key: str) -> None:
    """While planned: the host being planned should make ``key`` if the run must make it."""
    host = ctx_host.get()
    for_state(host.state).prefer(key, host)


def _arguments(state, host) -> dict:
    """The connector arguments a deploy's command on ``host`` gets (``_sudo`` and the like)."""
    with ctx_host.use(host):
        arguments, _ = pop_global_arguments(state, host, {})
    return {k: v for k, v in arguments.items() if k in CONNECTOR_ARGUMENT_KEYS}


def run(state, host, commands, timeout: Optional[int] = None) -> tuple:
    """Run pyinfra commands (``StringCommand``s, uploads) on ``host`` as its deploy would;
    (ok, the last command's stdout lines). A failed command's output is shown whole."""
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


def pack_command(path: str, tar: str, kind: str) -> str:
    return remote.command("artifact_ship", "pack", "--kind", kind, path, tar)


def receive_command(tar: str, sha: str, incoming: str, kind: str) -> str:
    return remote.command("artifact_ship", "receive", "--kind", kind, tar, sha, incoming)


def fetch(state, holder: Holder, key: str, kind: str, what: str) -> Optional[Shipment]:
    """Pack ``holder``'s artifact and bring the tar here, checked against the sha256 it printed."""
    host, shipping = holder.host, for_state(state)
    remote_tar = f"{holder.path}.ship.tar"
    ok, lines = run(state, host, [pack_command(holder.path, remote_tar, kind)], SHIP_TIMEOUT)
    try:
        told = json.loads(lines[-1]) if ok and lines else None
    except ValueError:
        told = None
    local = os.path.join(shipping.dir, f"{key}.tar")
    try:
        if not told or not host.get_file(remote_tar, local + ".part", **_arguments(state, host)):
            return None
        if sha256(local + ".part") != told.get("sha256"):
            logger.warning(f"{host.print_prefix}{what}: its tar changed between the pack and the fetch; not shipped")
            return None
        os.replace(local + ".part", local)
    finally:
        run(state, host, [f"rm -f {shlex.quote(remote_tar)}"])
    return Shipment(local, told["sha256"], int(told["bytes"]), host.name)


def from_holders(state, host, key: str, kind: str, what: str) -> Optional[Shipment]:
    """The artifact fetched from the first host of this run that holds it and gives it; published."""
    shipping = for_state(state)
    for holder in list(shipping.holders[key]):
        try:
            shipment = fetch(state, holder, key, kind, what)
        except Exception as e:  # the source's connection failed (paramiko, a timeout): try the next
            logger.warning(f"{host.print_prefix}{what}: no copy from {holder.host.name} ({type(e).__name__}: {e})")
            continue
        if shipment:
            shipping.publish(key, shipment)
            return shipment
    return None


def obtain(state, host, key: str, kind: str, what: str, path: str, make: Callable, receive: Callable,
           verb: str = "making") -> bool:
    """The step of ``host`` that needs artifact ``key`` at ``path`` (a ``FunctionCommand``'s
    work): receive it where this run, a run sharing its directory or a host of the rack has
    it (``receive(shipment)``), else make it here (``make()``: True once it is made, proven
    and sealed) and hold it for the next host. Only finding or making takes turns; hosts
    receive side by side. A refused shipment is said, and the host makes it itself."""
    shipping = for_state(state)
    try:
        _wait_for_makers(shipping, host, key, what)
        with shipping.turn(key):
            shipment = shipping.shipped.get(key) or shipping.published(key) or from_holders(state, host, key, kind, what)
            if not shipment:
                return _made(state, host, key, kind, what, path, make, publish=True)
    finally:
        shipping.settle(key, host)
    logger.info(f"{host.print_prefix}{what}: receiving it from {shipment.source} "
                f"({shipment.bytes / 2**20:.0f} MiB), not {verb} it")  # fmt: skip
    if receive(shipment):
        return True
    logger.warning(f"{host.print_prefix}{what} from {shipment.source} refused here (what it serves is "
                   f"unchanged); {verb} it here instead")  # fmt: skip
    with shipping.locks[key]:  # the next host fetches again, from a source that may be this one
        if shipping.shipped.get(key) is shipment:
            del shipping.shipped[key]
    return _made(state, host, key, kind, what, path, make)


def _wait_for_makers(shipping: Shipping, host, key: str, what: str) -> None:
    """Leave ``key``'s turn to its preferred makers (``Shipping.pending_makers``) until they are done."""
    gevent.sleep(0)  # the hosts this operation started together reach their step first
    said = False
    while not (shipping.shipped.get(key) or shipping.published(key)):
        names = shipping.pending_makers(key, host)
        if not names:
            return
        if not said:
            logger.info(f"{host.print_prefix}{what}: waiting for {', '.join(names)}, which makes it from its cache")
            said = True
        gevent.sleep(1)


def _made(state, host, key, kind, what, path, make: Callable, publish: bool = False) -> bool:
    """``make()`` on ``host``, then hold what it made for the run; with ``publish``, where
    other runs share the directory, fetch it for them now (they cannot reach this host)."""
    if not make():
        return False
    shipping = for_state(state)
    shipping.hold(key, host, path)
    if publish and shipping.shared:
        from_holders(state, host, key, kind, what)
    return True

"""The facts the server role reads: its service user, the unit's state, /health."""

from __future__ import annotations

import json
import re
import secrets
import shlex
from dataclasses import dataclass
from typing import Optional

from pyinfra.api import FactBase
from pyinfra.api.exceptions import FactProcessError

from pyinfra.facts.files import FileContents, Link, Sha256File
from pyinfra.facts.server import Command
from llamarack import remote
from llamarack.facts.value import FactValue
from llamarack.layout import API_KEY_PATH, UNIT_DIR, UNIT_GLOBS
from llamarack.facts import FactRead
from roles.llamacpp.reads import BenchRecord, BuildSeals, LlamacppBuilds, LlamaServerFlags
from roles.model.reads import GgufShape
from .files.wait_healthy import REFUSED

# The unit's first lines: the health URL it names, its cards and planned weights (plan.py writes them).
HEALTH_MARK = "# llamarack health: "
RESIDENCY_MARK = "# llamarack residency: "


NOLOGIN = "/usr/sbin/nologin"
# The GECOS field of the service user llamarack makes: how a later run knows the account
# is its own to change (home, shell), and to give the API key's group to.
SERVICE_USER_MARK = "llamarack service user"
# useradd's system uid range when /etc/login.defs does not set it (shadow's defaults).
SYSTEM_UIDS = (101, 999)


@dataclass(frozen=True)
class PasswdEntry(FactValue):
    name: str
    uid: int
    gid: int
    home: str
    shell: str
    gecos: str = ""
    system_uids: tuple = SYSTEM_UIDS
    """The host's system uid range (``SYS_UID_MIN``, ``SYS_UID_MAX`` of /etc/login.defs):
    where ``useradd --system`` puts an account."""

    def made_by_llamarack(self, home: str) -> bool:
        """Whether llamarack made this account: a system uid and the mark in GECOS; or, as
        llamarack made it before it marked it, an empty GECOS, home ``home`` and no shell."""
        low, high = self.system_uids
        unmarked = self.gecos == "" and self.home == home and self.shell == NOLOGIN
        return low <= self.uid <= high and (self.gecos == SERVICE_USER_MARK or unmarked)

    def describe(self) -> str:
        return f"uid {self.uid}, GECOS {self.gecos!r}, home {self.home}, shell {self.shell}"


def _system_uids(defs: dict) -> tuple:
    """(SYS_UID_MIN, SYS_UID_MAX) as useradd reads them from /etc/login.defs."""
    try:
        low = int(defs.get("SYS_UID_MIN", SYSTEM_UIDS[0]))
        high = int(defs.get("SYS_UID_MAX", int(defs.get("UID_MIN", SYSTEM_UIDS[1] + 1)) - 1))
    except ValueError:
        return SYSTEM_UIDS
    return low, high


class SystemUser(FactBase[Optional[PasswdEntry]]):
    """Returns the passwd entry of ``user`` (through NSS, as ``getent`` sees it) with the
    host's system uid range, or None when there is no such user. One user, not
    pyinfra's ``server.Users``, which reads every account of the host and each one's groups."""

    def command(self, user: str) -> str:
        # getent exits 2 for "no such user": that is an answer, not a failure.
        return (f"getent passwd {shlex.quote(user)} || true; "
                "awk '$1 == \"SYS_UID_MIN\" || $1 == \"SYS_UID_MAX\" || $1 == \"UID_MIN\" "
                "{print \"login.defs\", $1, $2}' /etc/login.defs 2>/dev/null || true")  # fmt: skip

    def process(self, output) -> Optional[PasswdEntry]:
        defs = {w[1]: w[2] for line in output if len(w := line.split()) == 3 and w[0] == "login.defs"}
        entries = [line for line in output if not line.startswith("login.defs ")]
        if not entries:
            return None
        fields = entries[0].split(":")
        if len(fields) != 7:
            raise FactProcessError(f"unexpected getent passwd output: {output!r}")
        try:
            return PasswdEntry(fields[0], int(fields[2]), int(fields[3]), fields[5], fields[6], fields[4],
                               _system_uids(defs))  # fmt: skip
        except ValueError as e:
            raise FactProcessError(f"unexpected getent passwd output: {output!r}") from e


class SystemGroup(FactBase[Optional[int]]):
    """Returns the gid of the group ``group`` (through NSS), or None when there is no such group."""

    def command(self, group: str) -> str:
        return f"getent group {shlex.quote(group)} || true"

    def process(self, output) -> Optional[int]:
        fields = output[0].split(":") if output else []
        if len(fields) != 4 or not fields[2].isdigit():
            raise FactProcessError(f"unexpected getent group output: {output!r}")
        return int(fields[2])


SHOW_PROPERTIES = " ".join(f"--property={p}" for p in ("ActiveState", "SubState", "MainPID", "ActiveEnterTimestamp",
                                                          "NRestarts"))  # fmt: skip


class UnitState(FactBase[dict]):
    """Returns what systemd says of ``unit`` now: ``systemctl show``'s ActiveState,
    SubState, MainPID, ActiveEnterTimestamp (Unix seconds, ``@1764640411``: no
    time zone to parse) and NRestarts (a unit systemd does not know shows
    ActiveState ``inactive`` and MainPID 0)."""

    requires_command = "systemctl"

    def command(self, unit: str) -> str:
        return f"systemctl show --timestamp=unix {SHOW_PROPERTIES} {shlex.quote(unit)}"

    def default(self) -> dict:
        return {}

    def process(self, output) -> dict:
        state = dict(line.split("=", 1) for line in output if "=" in line)
        if "ActiveState" not in state:
            raise FactProcessError(f"unexpected systemctl show output: {output!r}")
        return state


@dataclass(frozen=True)
class FoundUnit(FactValue):
    """One llama-server unit file on a host, and what systemd and the role's records say of it."""

    name: str
    sha1: str
    lines: tuple  # the file's lines, as FileContents reads them
    prev: bool  # ``<unit>.prev`` is there: a switch was cut off before its /health check
    state: dict  # UnitState's properties ({} where systemctl says nothing)
    pin: Optional[tuple] = None  # its rollback pin's lines (``state/rollback[@N].json``), or None
    health: Optional[int] = None  # with ``health``: the status its health URL answers (None: nothing)
    sleeping: Optional[bool] = None  # with ``health``: whether its /props says it sleeps (None: it does not say)
    props: Optional[dict] = None  # with ``health``: the process's /props: build_info, model_path, total_slots
    built: Optional[str] = None  # the commit its build's ``--version`` names (``version.txt``), None: unread
    refused: Optional[str] = None  # with ``health``, not running: why its check after its last start refused it


_UNIT_FILE = re.compile(r"llamarack-server(@[0-9]+)?\.service")


class ServedUnits(FactBase[dict]):
    """Returns every llama-server unit file of the host (``llamarack-server.service``,
    ``llamarack-server@N.service``) by name: its sha1 and lines, whether a ``.prev`` is
    beside it, systemd's state of it, its rollback pin under ``state`` (the records'
    folder) and, with ``health``, the HTTP status of the health URL its first lines name
    and whether the server sleeps (``--sleep-idle-seconds``; its ``/props``, which wakes
    nothing, asked with the host's API key). One read for all of a host's units, however
    many its cards make."""

    def command(self, state: str, health: bool = False) -> str:
        check = ""
        if health:
            check = (f"url=$(sed -n {shlex.quote('s|^' + HEALTH_MARK + '||p')} \"$f\" | head -n 1); "
                     f"echo \"health $({remote.command('http_status')} \"$url\" {shlex.quote(API_KEY_PATH)} "
                     "| tail -n 1)\"; "
                     # not running: what its check after its last start (ExecStartPost=) said, from the journal
                     "[ \"$(systemctl is-active -- \"$f\")\" = active ] || { i=$(systemctl show -p InvocationID "
                     "--value -- \"$f\"); [ -z \"$i\" ] || journalctl \"_SYSTEMD_INVOCATION_ID=$i\" -o cat -q "
                     f"--no-pager 2>/dev/null | sed -n {shlex.quote('s/^' + REFUSED + '/refused /p')} | tail -n 1; }}; ")  # fmt: skip
        return (f"cd {shlex.quote(UNIT_DIR)} 2>/dev/null || exit 0; "
                f"for f in {' '.join(UNIT_GLOBS)}; do [ -f \"$f\" ] || continue; "
                "echo \"unit $f $(sha1sum < \"$f\" | cut -d' ' -f1)\"; "
                "[ ! -e \"$f.prev\" ] || echo prev; "
                f"systemctl show --timestamp=unix {SHOW_PROPERTIES} -- \"$f\" 2>/dev/null "
                "| awk '{print \"state \" $0}'; "
                "awk '{print \"line \" $0}' \"$f\"; "
                # the commit of the build its ExecStart runs, as that build's --version said it
                "b=$(sed -n 's|^ExecStart=\"\\{0,1\\}\\([^\" ]*\\)/bin/llama-server.*|\\1|p' \"$f\" | head -n 1); "
                "[ -z \"$b\" ] || [ ! -f \"$b/version.txt\" ] || sed -n '1s/^/built /p' \"$b/version.txt\"; "
                f"p=${{f#llamarack-server}}; p={shlex.quote(state)}/rollback${{p%.service}}.json; "
                "[ ! -f \"$p\" ] || awk '{print \"pin \" $0}' \"$p\"; "
                f"{check}done")  # fmt: skip

    def default(self) -> dict:
        return {}

    def process(self, output) -> dict:
        units: dict = {}
        for line in output:
            word, _, rest = line.partition(" ")
            if word == "unit":
                name, _, sha1 = rest.rpartition(" ")
                current = units[name] = {"name": name, "sha1": sha1, "line": [], "prev": False, "state": {},
                                         "pin": [], "health": None, "sleeping": None, "props": None,
                                         "built": None, "refused": None}  # fmt: skip
            elif not units:
                raise FactProcessError(f"unexpected llama-server units output: {output!r}")
            elif word == "prev":
                current["prev"] = True
            elif word == "state" and "=" in rest:
                key, _, value = rest.partition("=")
                current["state"][key] = value
            elif word in ("line", "pin"):
                current[word].append(rest)
            elif word == "refused":
                current["refused"] = rest[:500] or None  # the host's words: kept as text, cut to a line's length
            elif word == "built":  # "version: 0.5.0-dev (build 1, commit dccad28c6)", "version: 1 (0c1e57098)"
                said = re.search(r"[( ]([0-9a-f]{7,40})\)", rest)
                current["built"] = said.group(1) if said else None
            elif word == "health":
                status, _, rest = rest.strip().partition(" ")
                asleep, _, said = rest.partition(" ")
                current["health"] = int(status) if status.isdigit() else None
                current["sleeping"] = {"asleep": True, "awake": False}.get(asleep)
                current["props"] = _provenance(said)
        return {name: FoundUnit(u["name"], u["sha1"], tuple(u["line"]), u["prev"], u["state"], tuple(u["pin"]) or None,
                                u["health"], u["sleeping"], u["props"], u["built"], u["refused"])
                for name, u in units.items() if _UNIT_FILE.fullmatch(name)}  # fmt: skip


def _provenance(text: str) -> Optional[dict]:
    """The process's /props as ``http_status.py`` prints it: a JSON object of strings and
    numbers, or None (nothing said, or not that shape: the server's answer is data)."""
    try:
        said = json.loads(text) if text else None
    except ValueError:
        return None
    if not isinstance(said, dict) or not all(isinstance(v, (str, int)) for v in said.values()):
        return None
    return said or None


class HostMemory(FactBase[Optional[int]]):
    """
    Returns the host's memory in MiB as its kernel counts it (``/proc/meminfo``'s
    ``MemTotal``), or None where the file does not say. A container whose memory is capped
    sees the cap there (lxcfs: the lab's hosts). The units' host-RAM ledger is planned in
    it (``roles/server/host_ram.py``).

    .. code:: python

        64298
    """

    def command(self) -> str:
        return "grep '^MemTotal:' /proc/meminfo 2>/dev/null || true"

    def process(self, output) -> Optional[int]:
        words = output[0].split() if output else []
        if not words:
            return None
        if len(words) != 3 or words[0] != "MemTotal:" or not words[1].isdigit() or words[2] != "kB":
            raise FactProcessError(f"unexpected /proc/meminfo line: {output!r}")
        return int(words[1]) // 1024


def unit_cards(lines) -> tuple:
    """The cards (UUIDs) a unit file serves from: its ``CUDA_VISIBLE_DEVICES``, else its
    residency line's; () for neither."""
    for line in lines or ():
        if line.startswith("Environment=CUDA_VISIBLE_DEVICES="):
            return tuple(c for c in line.split("=", 2)[2].split(",") if c)
    for line in lines or ():
        if line.startswith(RESIDENCY_MARK):
            return tuple(c for c in line[len(RESIDENCY_MARK):].split(" ")[0].split(",") if c)
    return ()


def active_since(state: dict) -> Optional[float]:
    """When the unit of a ``UnitState`` last became active (Unix time), None if it is not."""
    stamp = state.get("ActiveEnterTimestamp", "")
    if state.get("ActiveState") != "active" or not stamp.startswith("@"):
        return None
    try:
        return float(stamp[1:])
    except ValueError:
        return None


# A fresh salt for each pyinfra run: what the host prints about its API key
# (``roles/server/files/secret_digest.py``) is never the same twice, nor a plain hash of the key.
KEY_DIGEST_SALT = secrets.token_hex(16)


def secret_digest_command(path: str) -> str:
    """The command that prints the salted digest of ``path`` on the host, or "missing"
    (a file that holds the rack's key: never hashed plainly, see ``secret_digest``)."""
    return remote.command("secret_digest", path, KEY_DIGEST_SALT)


def key_digest_command() -> str:
    """The command that prints the salted digest of the host's API key file, or "missing"."""
    return secret_digest_command(API_KEY_PATH)


def reads(settings) -> tuple:
    """What the server role reads on a converged host: its part of preflight's one read.
    Every unit of the host in one fact (``ServedUnits``), however many its cards make."""
    if not settings.general.runs("server"):
        return ()
    layout, root = settings.layout, settings.general.root
    return (
        FactRead.of(LlamacppBuilds, root=root),
        FactRead.of(BuildSeals, root=root),  # a build differing from its seal is pruned
        FactRead.of(SystemUser, user=settings.general.service_user),
        FactRead.of(Link, path=layout.current_build),
        FactRead.of(Link, path=layout.current_model),
        *([FactRead.of(Link, path=layout.draft_model)] if settings.model.draft_repo else []),
        FactRead.of(LlamaServerFlags, root=root),
        FactRead.of(GgufShape, path=f"{layout.current_model}/model.gguf"),  # the units are planned from it
        # the units: files (the builds they name are kept by the prune), .prev, state, pins
        FactRead.of(ServedUnits, state=layout.state, health=True),
        FactRead.of(FileContents, path=layout.units_record),  # written only when it differs
        FactRead.of(Command, command=key_digest_command()),
        FactRead.of(BenchRecord, path=layout.bench_record),
        FactRead.of(HostMemory),  # the host-RAM ledger's MemTotal
        FactRead.of(Sha256File, path=layout.unit_check),  # the units' check after each start
    )

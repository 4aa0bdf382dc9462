"""The settings loader: one host's data becomes one frozen, checked ``Settings``.

A setting is a field of a section (a frozen dataclass): the general one here
(``llamarack_*``) and one per role in ``roles/<role>/settings.py``; its host-data
key is ``<section prefix>_<field name>`` (``server_port``). ``load_settings``
rejects bad data before any host is touched, every problem of a host at once,
naming the host, the key, what was given and what is allowed. Roles receive the
frozen object and never read ``host.data``.

The sections stay plain dataclasses rather than pydantic models: pydantic is
pyinfra's own dependency, not ours, and its errors would have to be rewritten
into what this loader already reports ("did you mean", how to write a value).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import logging
import re
import typing
from dataclasses import dataclass
from typing import Any, Callable, Literal, Mapping, Optional

from .errors import SettingsError
from .layout import Layout
from roles.driver.settings import DriverSettings
from roles.gateway.settings import GatewaySettings
from roles.llamacpp.settings import LlamacppSettings
from roles.model.settings import ModelSettings
from roles.python_env.settings import PythonEnvSettings
from roles.server.settings import ServerSettings
from roles.toolchain.settings import ToolchainSettings
from .settings_fields import (SHARED_DIRS, Section, host_path, loopback_url, number_range, out_of_range, setting,
                              under)

# The roles deploy.py runs after preflight, in order (llamarack_roles picks some).
ROLE_NAMES = ("driver", "toolchain", "python_env", "llamacpp", "converter_env", "model", "server", "gateway")


def _role_name(value: str) -> Optional[str]:
    return None if value in ROLE_NAMES else "role names: " + ", ".join(ROLE_NAMES)


# The system's own trees: what it runs, or reads its configuration from (/etc/cron.d,
# /usr/local/bin...). llamarack_root is never in one.
SYSTEM_TREES = ("/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/proc", "/run",
                "/sbin", "/sys", "/usr", "/var/spool", "/var/lib/dpkg", "/var/lib/apt", "/var/lib/systemd")
# Directories that hold others' files: llamarack_root may be under one, never one itself.
SHARED_PARENTS = ("/home", "/mnt", "/media", "/opt", "/root", "/snap", "/srv", "/tmp", "/var", "/var/cache",
                  "/var/lib", "/var/local", "/var/log", "/var/opt", "/var/tmp")


def _root(value: str) -> Optional[str]:
    if problem := host_path(value):
        return problem
    tree = under(value, SYSTEM_TREES)
    if tree or value in SHARED_PARENTS:
        return (f"a directory llamarack owns alone, e.g. /opt/llamarack (not {value}: "
                + (f"the system runs or reads what is under {tree})" if tree else "the system's)"))
    return None


def _service_user(value: str) -> Optional[str]:
    if not re.fullmatch(r"[a-z_][a-z0-9_-]{0,31}", value):
        return "a system user name (lowercase letters, digits, - and _)"
    if value in ("root", "nobody", "daemon", "bin", "sys", "sync", "games", "man", "mail", "www-data"):
        return f"a user of llama-server's own, e.g. llamarack (not {value}, which the system uses)"
    return None


@dataclass(frozen=True)
class GeneralSettings(Section):
    """Where llamarack keeps its state on a host."""

    prefix = "llamarack"

    root: str = setting("/opt/llamarack", "everything llamarack owns on a host lives under this directory", _root)
    service_user: str = setting("llamarack", "system user that runs llama-server (not root)", _service_user)
    roles: Optional[tuple[str, ...]] = setting(
        None,
        "run only these roles, e.g. server,model (preflight always runs): "
        + ", ".join(ROLE_NAMES) + "; None runs them all",
        _role_name,
    )
    trusted_network: bool = setting(
        False,
        "True allows plain http:// sources (git, pip indexes, conda, the hub and its token, model_url): "
        "the hosts reach them over a closed network no one else can read or change, as the lab's bridge; "
        "False needs https:// (http:// to a loopback address is allowed either way)",
    )
    allow_shared_dirs: bool = setting(
        False,
        "True accepts host paths root runs or builds from (llamarack_root, toolchain_cuda_home, "
        "llamacpp_ccache_dir) under directories other users can write to (/tmp, /var/tmp, /dev/shm, "
        "/home...) and skips preflight's check of their owners and modes: only on a throwaway host "
        "no other user logs in to (tests)",
    )

    def runs(self, role: str) -> bool:
        """Whether ``deploy.py`` runs ``role`` (one of ROLE_NAMES) on this host."""
        return self.roles is None or role in self.roles

    def problems(self) -> list[str]:
        empty = "llamarack_roles: given []; allowed: at least one role name (None runs them all)"
        return [empty] if self.roles == () else []


@dataclass(frozen=True)
class Settings:
    """All of one host's settings, one frozen object per section."""

    host: str
    general: GeneralSettings
    driver: DriverSettings
    toolchain: ToolchainSettings
    python_env: PythonEnvSettings
    llamacpp: LlamacppSettings
    model: ModelSettings
    server: ServerSettings
    gateway: GatewaySettings
    groups: tuple = ()  # the host's inventory groups (settings_for)

    @property
    def layout(self) -> Layout:
        """Every path under ``llamarack_root`` (``llamarack.layout``)."""
        return Layout(self.general.root)

    @property
    def is_gateway(self) -> bool:
        """Whether the host is of group ``gateways``: preflight's read and HAProxy only, no llama-server."""
        return "gateways" in self.groups


# Each section: its name on Settings and its class, in the order of Settings' fields: the
# general one first, then the roles' in the roles' order (preflight has no settings of its own).
SECTIONS = {name: tp for name, tp in typing.get_type_hints(Settings).items() if name not in ("host", "groups")}
ROLE_SETTINGS = tuple(SECTIONS.values())


@dataclass(frozen=True)
class SettingInfo:
    """One setting as documentation and checks see it."""

    key: str
    role: type
    name: str
    type: Any
    default: Any
    doc: str
    check: Optional[Callable[[Any], Optional[str]]]
    choices: Optional[tuple]
    between: Optional[tuple] = None  # a number's (lowest, highest) value; every int and float setting has one


@functools.cache
def all_settings() -> tuple[SettingInfo, ...]:
    """Every setting of every role, in declaration order. Made once per process: the roles'
    type hints cannot change, and each host's settings are loaded from it (3 ms a host)."""
    infos = []
    for role in ROLE_SETTINGS:
        hints = typing.get_type_hints(role)
        for f in dataclasses.fields(role):
            tp = hints[f.name]
            literal = typing.get_args(tp) if typing.get_origin(tp) is Literal else None
            info = SettingInfo(key=f"{role.prefix}_{f.name}", role=role, name=f.name, type=tp, default=f.default,
                               **{**f.metadata, "choices": f.metadata["choices"] or literal})
            if (_unwrap_optional(info.type)[0] in (int, float)) != (info.between is not None):
                raise TypeError(f"{info.key}: every int or float setting, and only those, has between=(low, high)")
            infos.append(info)
    return tuple(infos)


def defaults() -> dict[str, Any]:
    return {info.key: info.default for info in all_settings()}


def describe_type(info: SettingInfo) -> str:
    """A short human form of a setting's type, for errors and docs."""
    if info.choices:
        return "one of " + ", ".join(repr(c) for c in info.choices)
    tp, optional = _unwrap_optional(info.type)
    if typing.get_origin(tp) is tuple:
        text = f"a list of {typing.get_args(tp)[0].__name__}"
    elif info.between:
        text = number_range(info.between, tp is int)
    else:
        text = {str: "a string", int: "an integer", bool: "true or false", float: "a number"}[tp]
    return text + (" or None" if optional else "")


def _unwrap_optional(tp):
    if typing.get_origin(tp) is typing.Union:
        return next(a for a in typing.get_args(tp) if a is not type(None)), True
    return tp, False


# The longest text and the longest list any setting takes (a path, a URL or a pattern list
# is far shorter; each has its own bound too).
MAX_TEXT_CHARS = 4096
MAX_LIST_ITEMS = 256


def _text_problem(value: str) -> Optional[str]:
    # No setting is a multi-line text: a newline or other control character in one is an
    # injection (a unit's next line, a shell's next command), never a value.
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
        return "a single line of text (no newline, tab or other control character)"
    if len(value) > MAX_TEXT_CHARS:
        return f"a text of at most {MAX_TEXT_CHARS} characters (given {len(value)})"
    return None


def shown(value: Any) -> str:
    """A value as an error shows it: its repr, cut after 200 characters (a hostile value
    of 100,000 characters is named, not printed)."""
    text = repr(value)
    return text if len(text) <= 200 else f"{text[:200]}... ({len(text)} characters in all)"


def _coerce(info: SettingInfo, value: Any) -> tuple[Any, Optional[str]]:
    """Check one value against its setting; return (value, problem or None)."""
    tp, optional = _unwrap_optional(info.type)
    if value is None:
        return value, None if optional else describe_type(info)
    if isinstance(value, (list, tuple)) and len(value) > MAX_LIST_ITEMS:
        return value, f"a list of at most {MAX_LIST_ITEMS} items (given {len(value)})"
    texts = value if isinstance(value, (list, tuple)) else (value,)
    problem = next(filter(None, (_text_problem(text) for text in texts if isinstance(text, str))), None)
    if problem:
        return value, problem
    if info.choices is not None:
        return value, None if value in info.choices else describe_type(info)
    if typing.get_origin(tp) is tuple:
        if isinstance(value, str):
            # From the command line: --data llamarack_roles=server,model
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
            return value, describe_type(info)
        problem = next(filter(None, map(info.check, value)), None) if info.check else None
        return (value, problem) if problem else (tuple(value), None)
    return value, _scalar_problem(info, tp, value)


# The Python types a value of each scalar setting type may have.
_ACCEPTED = {bool: bool, int: int, float: (int, float), str: str}


def _scalar_problem(info: SettingInfo, tp: type, value: Any) -> Optional[str]:
    """What is wrong with one bool, int, float or str value, or None."""
    # bool is an int in Python: never let True stand for 1 or 1 for True.
    if not isinstance(value, _ACCEPTED[tp]) or (isinstance(value, bool) and tp is not bool):
        if tp is str and isinstance(value, (int, float)):
            # pyinfra's --data turns 13.0 into a number, and 11.10 would become 11.1.
            return (f"a string; quote it: {info.key} = '{value}' in Python, "
                    f"--data '{info.key}=\"{value}\"' on the command line")  # fmt: skip
        return describe_type(info)
    problem = out_of_range(value, info.between, tp is int) if info.between else None
    return problem or (info.check(value) if info.check else None)


def _setting_values(s: Settings):
    """(info, value) of every setting of ``s``."""
    names = {role: name for name, role in SECTIONS.items()}
    for info in all_settings():
        yield info, getattr(getattr(s, names[info.role]), info.name)


def private_dirs(s: Settings) -> tuple[tuple[str, str], ...]:
    """(key, path) of each directory root runs or builds from (a setting checked as a host path:
    the root, toolchain_cuda_home, llamacpp_ccache_dir), where one is set: preflight checks on
    the host that it and every directory above it are root's alone (``rules.rule_dirs_private``)."""
    return tuple((info.key, value) for info, value in _setting_values(s) if info.check in (host_path, _root) and value)


def _plain_http_problems(s: Settings) -> list[str]:
    """Plain http:// sources, unless llamarack_trusted_network says no one else is on the way."""
    if s.general.trusted_network:
        return []
    problems = []
    for info, value in _setting_values(s):
        for url in value if isinstance(value, tuple) else (value,):
            if isinstance(url, str) and url.startswith("http://") and not loopback_url(url):
                token = (", and the hub token (model_hf_token_file) would travel in clear"
                         if info.key == "model_hf_endpoint" and s.model.hf_token_file else "")
                problems.append(
                    f"{info.key}: given {shown(url)}; allowed: an https:// URL: plain http:// can be read and changed "
                    f"by anyone on the way{token} (llamarack_trusted_network = True allows it where the hosts "
                    "reach their sources over a closed network, as in the lab; http:// to a loopback address "
                    "is allowed)")  # fmt: skip
    return problems


def _shared_dir_problems(s: Settings) -> list[str]:
    """Host paths root runs or builds from under a directory other users can write to."""
    if s.general.allow_shared_dirs:
        return []
    problems = []
    for key, path in private_dirs(s):
        shared = under(path, SHARED_DIRS)
        if shared:
            whose = "users' homes" if shared in ("/home", "/run/user") else "a directory every user can write to"
            problems.append(
                f"{key}: given {shown(path)}; allowed: a directory other users cannot write to ({shared} is {whose}: "
                "a local user could put files there, or the directory itself, before root runs what is "
                "in it), e.g. under /opt or /srv (llamarack_allow_shared_dirs = True only on a throwaway "
                "test host)")  # fmt: skip
    return problems


_WARNED: set = set()


def unknown_keys(keys, known) -> list[tuple[str, str]]:
    """(key, the setting it looks like) for each host data key that no role knows but
    that is close to a setting's name: ``server-port``, ``llama_root``. Other keys
    (pyinfra's ``ssh_user``, the user's own) are not compared with anything."""
    found = []
    for key in keys:
        normal = key.strip().lower().replace("-", "_")
        close = [normal] if normal in known else difflib.get_close_matches(normal, known, n=1, cutoff=0.8)
        if close:
            found.append((key, close[0]))
    return found


def _warn_unknown(host_name: str, keys, known) -> None:
    """Warn once per host and key about data that looks like a setting but is none (it is ignored)."""
    for key, like in unknown_keys(keys, known):
        if (host_name, key) not in _WARNED:
            _WARNED.add((host_name, key))
            logging.getLogger("pyinfra").warning(
                f"{host_name}: {key!r} is no llamarack setting and is ignored; did you mean {like!r}?")


def load_settings(host_name: str, data: Mapping[str, Any], groups: tuple = ()) -> Settings:
    """Build one host's settings from its data (inventory + group data); ``groups``: its
    inventory groups. A key without a role prefix is pyinfra's or the user's, ignored (a
    warning when it looks like a setting); one with a prefix that names no setting is an error."""
    infos = all_settings()
    by_key = {info.key: info for info in infos}
    prefixes = tuple(f"{role.prefix}_" for role in ROLE_SETTINGS)
    problems: list[str] = []

    for key in data:
        if not isinstance(key, str):
            problems.append(f"key {key!r}: a host data key is a string (a setting name such as 'server_port')")
        elif key.startswith(prefixes) and key not in by_key:
            close = difflib.get_close_matches(key, by_key, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            problems.append(f"unknown setting {key!r}{hint}")
    _warn_unknown(host_name, [k for k in data if isinstance(k, str) and not k.startswith(prefixes)], by_key)

    values: dict[type, dict[str, Any]] = {role: {} for role in ROLE_SETTINGS}
    for info in (info for info in infos if info.key in data):
        value, problem = _coerce(info, data[info.key])
        if problem:
            problems.append(f"{info.key}: given {shown(data[info.key])}; allowed: {problem}")
        else:
            values[info.role][info.name] = value

    sections = {name: role(**values[role]) for name, role in SECTIONS.items()}
    settings = Settings(host=host_name, groups=tuple(groups), **sections)
    problems += [problem for section in sections.values() for problem in section.problems()]
    problems += _plain_http_problems(settings) + _shared_dir_problems(settings)
    if problems:
        raise SettingsError(host_name, problems)
    return settings


def settings_for(host) -> Settings:
    """The one place that reads pyinfra host data: build the current host's settings."""
    return load_settings(host.name, host.data.dict(), tuple(getattr(host, "groups", None) or ()))

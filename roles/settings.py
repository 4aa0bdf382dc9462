"""A host's settings: the general section (``llamarack_*``) and every role's
(``roles/<role>/settings.py``), one frozen ``Settings`` per host, made by the core's
loader (``llamarack/settings.py``) from the host's data before any host is touched.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

from llamarack import settings as loader
from llamarack.layout import Layout
from llamarack.settings import setting_values, shown
from llamarack.settings_fields import SHARED_DIRS, Section, host_path, loopback_url, setting, under

from .driver.settings import DriverSettings
from .gateway.settings import GatewaySettings
from .llamacpp.settings import LlamacppSettings, local_git_path
from .model.settings import ModelSettings
from .python_env.settings import PythonEnvSettings
from .server.settings import ServerSettings
from .toolchain.settings import ToolchainSettings

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
        None, "run only these roles, e.g. server,model (preflight always runs): " + ", ".join(ROLE_NAMES)
        + "; None runs them all", _role_name)
    trusted_network: bool = setting(
        False, "True allows plain http:// sources (git, pip indexes, conda, the hub and its token, model_url) and a "
        "git:// llamacpp_git_url: the hosts reach them over a closed network no one else can read or change, as "
        "the lab's bridge; False needs https:// (or ssh:// for git; http:// or git:// to a loopback address is "
        "allowed either way)")
    allow_shared_dirs: bool = setting(
        False, "True accepts host paths root runs or builds from (llamarack_root, toolchain_cuda_home, "
        "llamacpp_ccache_dir, a local llamacpp_git_url) under directories other users can write to (/tmp, "
        "/var/tmp, /dev/shm, /home...) and skips preflight's check of their owners and modes: only on a throwaway "
        "host no other user logs in to (tests)")

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

    def problems(self) -> list[str]:
        """Problems of the whole: plain http:// sources and shared directories, unless allowed."""
        return _plain_http_problems(self) + _shared_dir_problems(self)


def all_settings() -> tuple:
    """Every setting of every section (``llamarack.settings.SettingInfo``), in declaration order."""
    return loader.all_settings(Settings)


def load_settings(host_name: str, data, groups: tuple = ()) -> Settings:
    """One host's settings from its data (inventory + group data); ``groups``: its inventory
    groups. ``SettingsError`` names every problem of the host at once."""
    return loader.load(Settings, host_name, data, groups)


def settings_for(host) -> Settings:
    """The one place that reads pyinfra host data: build the current host's settings."""
    return load_settings(host.name, host.data.dict(), tuple(getattr(host, "groups", None) or ()))


def private_dirs(s: Settings) -> tuple[tuple[str, str], ...]:
    """(key, path) of each directory root runs or builds from (a setting checked as a host path:
    the root, toolchain_cuda_home, llamacpp_ccache_dir; and a llamacpp_git_url that is a local
    repository, whose files the build takes), where one is set: preflight checks on the host that
    it and every directory above it are root's alone (``rules.rule_dirs_private``)."""
    dirs = [(info.key, value) for info, value in setting_values(s) if info.check in (host_path, _root) and value]
    repository = local_git_path(s.llamacpp.git_url)
    return tuple(dirs + ([("llamacpp_git_url", repository)] if repository else []))


def _plain_http_problems(s: Settings) -> list[str]:
    """Plain http:// and git:// sources, unless llamarack_trusted_network says no one else is on the way."""
    if s.general.trusted_network:
        return []
    problems = []
    for info, value in setting_values(s):
        for url in value if isinstance(value, tuple) else (value,):
            if isinstance(url, str) and url.startswith("git://") and not loopback_url(url):
                problems.append(
                    f"{info.key}: given {shown(url)}; allowed: an https:// or ssh:// URL: git:// is as plain as "
                    "http://, so anyone on the way can hand over other code, and a short llamacpp_commit prefix "
                    "pins little against that (llamarack_trusted_network = True allows it where the hosts reach "
                    "their sources over a closed network; git:// to a loopback address is allowed)")  # fmt: skip
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
    problems, given = [], {info.key: value for info, value in setting_values(s)}
    for key, path in private_dirs(s):
        shared = under(path, SHARED_DIRS)
        if shared:
            whose = "users' homes" if shared in ("/home", "/run/user") else "a directory every user can write to"
            problems.append(
                f"{key}: given {shown(given[key])}; allowed: a directory other users cannot write to ({shared} is {whose}: "
                "a local user could put files there, or the directory itself, before root runs what is "
                "in it), e.g. under /opt or /srv (llamarack_allow_shared_dirs = True only on a throwaway "
                "test host)")  # fmt: skip
    return problems

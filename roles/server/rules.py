"""The server role's compatibility rule: the service user is an account llamarack may make
or take on (preflight runs it, ``roles/preflight/rules.py``; the server role checks the
account again before it touches it)."""

from __future__ import annotations

from typing import Optional

from llamarack.errors import Failure
from roles.settings import Settings

from ..preflight.facts import HostFacts
from .reads import SERVICE_USER_MARK, PasswdEntry


def account_failure(user: str, home: str, setting: Optional[str], entry: Optional[PasswdEntry],
                    group: Optional[int]) -> Optional[Failure]:
    """Whether the system account ``user`` (home ``home``) may be made (no account, no group of that name)
    or taken on (an account llamarack made, its own group its primary one): its home and shell are changed
    and files are given to its group, so an account of the system's or a person's is refused. ``setting``:
    the setting that names it, if any."""
    fix = (f"set {setting} to a name no account or group of this host has (llamarack makes it), or "
           if setting else "") + f"remove the host's {user!r} if nothing else uses it"  # fmt: skip
    if entry is None:
        if group is None:
            return None
        return Failure("service-user", f"no user {user!r} but a group {user!r} (gid {group})",
                       f"no group {user!r}: useradd makes the account's own group", fix)  # fmt: skip
    low, high = entry.system_uids
    needed = (f"an account llamarack made: a system uid ({low}-{high}), GECOS {SERVICE_USER_MARK!r} (or, "
              f"as llamarack made it before it marked it, an empty GECOS with home {home} and shell "
              "/usr/sbin/nologin), and a group of the same name as its primary group")  # fmt: skip
    if not entry.made_by_llamarack(home):
        return Failure("service-user", f"account {user!r}, which llamarack did not make ({entry.describe()})",
                       needed, fix)  # fmt: skip
    if group != entry.gid:
        found = f"group {user!r} has gid {group}" if group is not None else f"no group {user!r}"
        return Failure("service-user", f"account {user!r} of primary gid {entry.gid}, but {found}", needed, fix)
    return None


def rule_service_user(s: Settings, facts: HostFacts) -> Optional[Failure]:
    """The service user is one llamarack may make or take on (``account_failure``)."""
    if not s.general.runs("server"):
        return None
    return account_failure(s.general.service_user, s.general.root, "llamarack_service_user", facts.service_user,
                           facts.service_group)  # fmt: skip


RULES = (rule_service_user,)

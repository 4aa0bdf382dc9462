"""Every compatibility rule, in the order preflight runs them: each role's own
(``roles/<role>/rules.py``: the driver's, the build's, the toolchain's, the server's, the
model's), and the one of the general settings, ``dirs-private``, here.

Each rule is a pure function of one host's settings and facts that returns None (pass) or
a ``Failure`` naming the value found, the value needed and the fix; ``evaluate`` runs them
before anything on the host is changed.
"""

from __future__ import annotations

from typing import Optional

from llamarack.errors import Failure
from roles.settings import Settings, private_dirs

from ..driver import rules as driver
from ..llamacpp import rules as llamacpp
from ..model import rules as model
from ..server import rules as server
from ..toolchain import rules as toolchain
from .facts import HostFacts


def rule_dirs_private(s: Settings, facts: HostFacts) -> Optional[Failure]:
    """The directories root runs or builds from (``settings.private_dirs``: the root, toolchain_cuda_home,
    llamacpp_ccache_dir), links resolved, and every existing directory above them are root's (or the
    deploying user's) and no group or other user can write to them: else a local user could put in what
    root later runs. A sticky directory such as /tmp counts as writable: anyone may make a name in it."""
    owners = facts.path_owners
    if owners is None or s.general.allow_shared_dirs:
        return None
    keys = {path: key for key, path in private_dirs(s)}
    allowed = {0, owners.deployer_uid}
    found, fixes = [], []
    for chain in owners.paths:
        bad = [d for d in chain.dirs if d.uid not in allowed or d.writable_by_others()]
        if not bad:
            continue
        key = keys.get(chain.path, "a directory")
        link = f" (a link to {chain.resolved})" if chain.resolved != chain.path else ""
        found.append(f"{key} {chain.path}{link}: " + ", ".join(
            f"{d.path} owned by {d.owner} (uid {d.uid}), mode {d.mode}" for d in bad))
        mine = [d.path for d in bad if d.path == chain.resolved or d.path.startswith(chain.resolved + "/")]
        fixes.append(f"set {key} to a directory only root can write to (under /opt or /srv)"
                     + (f", or chown root:root {' '.join(mine)} and chmod go-w {' '.join(mine)}"
                        if len(mine) == len(bad) else ""))  # fmt: skip
    if not found:
        return None
    user = "" if owners.deployer_uid == 0 else f" (or the deploying user, uid {owners.deployer_uid})"
    return Failure("dirs-private", "; ".join(found),
                   f"each of them and every directory above it owned by root{user} and writable by no group or "
                   "other user (a sticky /tmp counts: anyone can make a name in it), since root runs what is there",
                   "; ".join(fixes))  # fmt: skip


RULES = (*driver.RULES, *llamacpp.RULES, *toolchain.RULES, rule_dirs_private, *server.RULES, *model.RULES)


def evaluate(s: Settings, facts: HostFacts) -> list[Failure]:
    """Run every rule; return the failures in table order. Cards no setup can serve
    (``gpu-supported``) are the one failure reported: the others' fixes lead nowhere."""
    failures = [failure for rule in RULES if (failure := rule(s, facts)) is not None]
    return failures[:1] if failures and failures[0].rule == "gpu-supported" else failures

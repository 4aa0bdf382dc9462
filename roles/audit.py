"""``llamarack audit``: what each host runs, against what its settings would deploy.

Here every role's reads of a host (``roles/<role>/audit.py``) go in one remote command
(``FactsTogether``, through the host's own pyinfra connector), hosts in parallel, and each
role's items are found from the answers; the report is ``llamarack/audit.py``.
"""

from __future__ import annotations

from typing import Optional

from llamarack.audit import Answers, HostAudit, Seen
from llamarack.facts import FactRead
from llamarack.facts.reading import FactsTogether

from . import ROLES, host_roles, rollout_audit
from .driver import audit as driver
from .gateway import audit as gateway
from .llamacpp import audit as llamacpp
from .model import audit as model
from .preflight import audit as preflight
from .preflight.reads import gather
from .python_env import audit as python_env
from .server import audit as server
from .settings import Settings, settings_for
from .toolchain import audit as toolchain

SCRIPT_TIMEOUT_S = 120  # the connection and the whole script of one host
# Each role's audit module (``reads``, ``items``).
ROLE_AUDITS = {"preflight": preflight, "driver": driver, "toolchain": toolchain, "python_env": python_env,
               "llamacpp": llamacpp, "model": model, "server": server, "gateway": gateway}  # fmt: skip


def role_audits(settings: Optional[Settings] = None) -> list:
    """Each role's audit module (``roles/<role>/audit.py``: ``reads``, ``items``),
    in deploy.py's order, then the rollout's record (``roles/rollout_audit.py``); with
    ``settings``, those of the roles that host runs (a gateway: the gateway role's, and no
    rollout record)."""
    roles = ROLES if settings is None else host_roles(settings)
    audits = [ROLE_AUDITS[role] for role in roles]
    if settings is None or not settings.is_gateway:
        audits.append(rollout_audit)
    return audits


def audit_reads(settings: Settings, verify: bool = False) -> tuple[FactRead, ...]:
    """Everything the audit looks at on a host, and nothing else: each role's reads (what the
    rules read, the deploy's facts the wanted side is planned from, and what is only
    reported). ``verify``: also the sha256 of every sealed file of the current build and of
    the served model.gguf."""
    return tuple(dict.fromkeys(r for module in role_audits(settings) for r in module.reads(settings, verify)))


def audit_host(name: str, settings: Settings, reads: tuple, answers: dict, templates: tuple = (),
               verify: bool = False) -> HostAudit:
    """The audit of one host from the answers to ``audit_reads`` (pure: no host is asked):
    each role's items, in the roles' order."""
    fact = Answers(reads, answers)
    seen = Seen(name, settings, gather(settings, read=fact.read), fact, templates, verify)
    audit = HostAudit(name)
    for module in role_audits(settings):
        audit.items.update(module.items(seen))
    if fact.unreadable:
        audit.error = "unreadable facts: " + ", ".join(fact.unreadable)
    return audit


def run(chosen: list, templates: tuple = (), verify: bool = False) -> list[HostAudit]:
    """Audit each of the pyinfra hosts ``chosen`` (``llamarack.hosts.load``) with one remote
    command, all at once. A host that cannot be reached comes back with ``reachable`` False;
    one whose settings fail, with the error. ``verify``: the sha256 of the served model and
    of every sealed file of the current build."""
    from llamarack.hosts import run_each  # here: pyinfra's connectors, only when hosts are asked

    audits, jobs, scripts = {}, {}, {}
    for host in chosen:
        try:
            settings = settings_for(host)
            reads = audit_reads(settings, verify)
            together = FactsTogether()
            scripts[host] = together.command(reads=reads)
            jobs[host.name] = (settings, reads, together)
        except Exception as e:  # bad settings: this host only
            audits[host.name] = HostAudit(host.name, error=f"{type(e).__name__}: {e}")
    # Each answer is read and planned as it comes, while the slower hosts still work.
    answered = run_each(scripts, SCRIPT_TIMEOUT_S,
                        lambda reply: _audit_answer(reply, *jobs[reply.name], templates, verify))
    audits.update((audit.name, audit) for audit in answered)
    return [audits[host.name] for host in chosen]


def _audit_answer(reply, settings: Settings, reads: tuple, together: FactsTogether, templates: tuple,
                  verify: bool = False) -> HostAudit:  # fmt: skip
    if not reply.reachable:
        return HostAudit(reply.name, reachable=False, error=reply.error)
    try:
        answers = together.process(reply.output)
        if not answers:  # not one section ran: sudo refused, no sh
            why = reply.stderr[-1] if reply.stderr else "no output"
            return HostAudit(reply.name, error=f"the command failed: {why}")
        return audit_host(reply.name, settings, reads, answers, templates, verify)
    except Exception as e:  # a host whose facts cannot be processed or planned
        return HostAudit(reply.name, error=f"{type(e).__name__}: {e}")

"""The gateway role's operations: HAProxy's config, Prometheus's target list, its server
and rules, node-exporter.

The rack's units are read when the operations run (pyinfra 3 runs an operation's body at
execution time; ``deploy.gateway`` says why that is after every serving host's server role),
over each serving host's own connection (``rack_fact``), once per run for all of them.
"""

import hashlib
import shlex
import weakref

from pyinfra import host, logger
from pyinfra.api import StringCommand, operation
from pyinfra.api.exceptions import PyinfraError
from pyinfra.api.facts import get_fact
from pyinfra.facts.files import Sha1File
from pyinfra.facts.server import Command

from llamarack import remote
from llamarack.errors import ModelSourceError
from llamarack.facts import FactRead, read
from llamarack.facts.reading import FactsTogether
from llamarack.operations import apt_install_missing, durable_rename, private_upload, put_text, refusal, show_diff
from roles.llamacpp.reads import BenchRecord
from roles.server.files.secret_digest import digest
from roles.server.operations import put_secret
from roles.server.reads import KEY_DIGEST_SALT, secret_digest_command
from roles.server.reads import UnitState
from llamarack.secrets import read_token
from roles.settings import Settings

from .plan import (HAPROXY_CONFIG, PROMETHEUS_CONFIG, PROMETHEUS_KEY, PROMETHEUS_RULES, TARGETS, GatewayError,
                   ServingHost, alert_rules, backends_of, haproxy_config, masked, prometheus_config, rack_key,
                   targets)  # fmt: skip
from .reads import UnitsRecord

NODE_EXPORTER = "prometheus-node-exporter"


def rack_fact(name: str, fact: type, **kwargs):
    """``fact`` of the inventory's host ``name``, read now over that host's connection; None
    (with a warning) when it cannot be read."""
    try:
        other = host.state.inventory.get_host(name)
        return get_fact(host.state, other, fact, kwargs=kwargs, apply_failed_hosts=False)
    except (PyinfraError, OSError) as e:
        host.log(f"cannot read {fact.__name__} of {name} ({e}): its settings stand in", logger.warning)
        return None


# state -> {host name: (units record, bench record)}: each serving host read once per stage of a run.
_records: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _records_of(h: ServingHost) -> tuple:
    """(units record, bench record) of serving host ``h``, in one command on it."""
    by_host = _records.setdefault(host.state, {})
    key = (h.name, host.state.is_executing)
    if key not in by_host:
        reads = (FactRead.of(UnitsRecord, path=h.units_record), FactRead.of(BenchRecord, path=h.bench_record))
        answers = rack_fact(h.name, FactsTogether, reads=reads) or {}
        values = [answers.get(i) for i in range(len(reads))]
        by_host[key] = tuple(a.value if a and a.status == 0 and a.error is None else None for a in values)
    return by_host[key]


def rack(hosts: tuple) -> list:
    """Every serving unit of ``hosts`` (``ServingHost``), as backends."""
    return [backend for h in hosts for backend in backends_of(h, *_records_of(h))]


def _stage_prove_switch(text: str, path: str, mode: str, proof: str, reload: str, what: str):
    """Upload ``text`` beside ``path`` (``path.new``, ``mode``), prove it with ``proof`` (a
    command given the staged file's quoted path), then switch and ``reload``. A file that fails
    its proof is removed and the one in place keeps serving."""
    new = f"{path}.new"
    yield remote.argv("install", "-d", "-m", "755", "--", path.rsplit("/", 1)[0])
    yield remote.argv("install", "-m", mode, "/dev/null", new)
    yield from private_upload(text, new)
    failed = (f"{host.name}: gateway: the new {what} fails its check ({proof.split()[0]}); "
              "the one in place keeps serving")
    yield StringCommand(f"{proof.format(shlex.quote(new))} >&2 || {{ rm -f {shlex.quote(new)}; "
                        f"printf '%s\\n' {shlex.quote(failed)} >&2; exit 1; }}")  # fmt: skip
    yield f"{durable_rename(new, path)} && {reload}"


@operation()
def haproxy(settings: Settings, hosts: tuple, templates: tuple = ()):
    """HAProxy's config for the rack (``/etc/haproxy/haproxy.cfg``): one server per serving unit.

    + settings: the gateway's settings (``gateway_*``)
    + hosts: the serving hosts (``plan.ServingHost``), in inventory order
    + templates: folders whose templates replace the role's own

    Staged as ``haproxy.cfg.new`` (mode 600: it holds the rack's key for the hang check),
    proved with ``haproxy -c``, switched and reloaded: a config that fails leaves the old
    one serving. A host whose config is the one wanted, with HAProxy running, is left alone."""
    try:
        key, backends = rack_key(list(hosts), read_token), rack(hosts)
        text = haproxy_config(settings, backends, key, templates)
    except (GatewayError, ModelSourceError) as e:  # and a key file it cannot read
        yield refusal(f"{host.name}: gateway: {e}")
        return
    running = read(UnitState, unit="haproxy.service").get("SubState") == "running"
    if read(Command, command=secret_digest_command(HAPROXY_CONFIG)) == digest(text.encode(), KEY_DIGEST_SALT):
        if running:
            host.noop(f"HAProxy routes to {len(backends)} units")
            return
        yield "systemctl enable -q haproxy && systemctl restart haproxy"
        return
    show_diff(HAPROXY_CONFIG, text, mask=lambda t: masked(t, key))
    reload = "systemctl enable -q haproxy && systemctl reload-or-restart haproxy"
    yield from _stage_prove_switch(text, HAPROXY_CONFIG, "600", "haproxy -c -q -f {}", reload, "HAProxy config")


@operation()
def prometheus_targets(settings: Settings, hosts: tuple, address: str):
    """Prometheus's file_sd target list (``/etc/llamarack/prometheus/targets.json``): every unit's
    ``/metrics``, this gateway's HAProxy endpoint, node-exporter where it is asked.

    + settings: the gateway's settings
    + hosts: the serving hosts (``plan.ServingHost``)
    + address: how others reach this gateway (its ``ssh_hostname``, else its name)"""
    try:
        text = targets(settings, address, list(hosts), rack(hosts))
    except GatewayError as e:
        yield refusal(f"{host.name}: gateway: {e}")
        return
    yield from put_text(text, TARGETS, "644")


@operation()
def prometheus(settings: Settings, hosts: tuple):
    """Prometheus on the gateway: its config (a job per kind of target of the file_sd list) and
    llamarack's alert rules, each proved with ``promtool`` before it is switched in.

    + settings: the gateway's settings (``gateway_slow_fraction``)
    + hosts: the serving hosts (``plan.ServingHost``): the units' bench records set the slow
      generation alert of each"""
    try:
        key = rack_key(list(hosts), read_token)
        rules, config = alert_rules(settings, rack(hosts)), prometheus_config(key)
    except (GatewayError, ModelSourceError) as e:  # and a key file it cannot read
        yield refusal(f"{host.name}: gateway: {e}")
        return
    reload = "systemctl enable -q prometheus && systemctl reload-or-restart prometheus"
    # the rack's key for the scrapes of the units (mode 640, group prometheus), or none
    key_changed = yield from put_secret(key, PROMETHEUS_KEY, "640", "prometheus",
                                        remote.argv("rm", "-f", "--", PROMETHEUS_KEY))
    switched = False
    for text, path, proof in ((rules, PROMETHEUS_RULES, "promtool check rules {}"),
                              (config, PROMETHEUS_CONFIG, "promtool check config {}")):  # fmt: skip
        if read(Sha1File, path=path) != hashlib.sha1(text.encode()).hexdigest():
            show_diff(path, text)
            yield from _stage_prove_switch(text, path, "644", proof, reload, path.rsplit("/", 1)[1])
            switched = True
    if key_changed and not switched:
        yield reload
    if not (key_changed or switched):
        host.noop("Prometheus scrapes the rack with llamarack's rules")


@operation()
def node_exporter(settings: Settings):
    """Debian's prometheus-node-exporter on this host when ``gateway_node_exporter`` asks for it
    (the gateway's target list then names it); nothing otherwise.

    + settings: the host's settings"""
    if not settings.gateway.node_exporter:
        host.noop("no node-exporter asked (gateway_node_exporter = False)")
        return
    yield from apt_install_missing._inner(packages=[NODE_EXPORTER])

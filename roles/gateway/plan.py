"""What the gateway serves: the rack's backends, HAProxy's config, Prometheus's targets,
scrape config and alert rules. Pure functions of settings and of what each serving host
recorded (``<root>/state/units.json``, ``<root>/state/bench.json``); ``__init__.py`` says
how units become servers.
"""

import ipaddress
import json
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Optional

from llamarack.layout import Layout
from llamarack.templates import template
from roles.server.files import bench_record
from roles.settings import Settings
from llamarack.settings_fields import server_name as valid_address

from .settings import ADMIN_SOCKET

TEMPLATES = Path(__file__).resolve().parent / "templates"
HAPROXY_TEMPLATE = "haproxy.cfg.j2"
HAPROXY_CONFIG = "/etc/haproxy/haproxy.cfg"
TARGETS = "/etc/llamarack/prometheus/targets.json"
PROMETHEUS_CONFIG = "/etc/prometheus/prometheus.yml"
PROMETHEUS_RULES = "/etc/prometheus/llamarack-rules.yml"
PROMETHEUS_KEY = "/etc/prometheus/llamarack-api-key"
BACKEND = "llamarack"
NODE_EXPORTER_PORT = 9100  # Debian's prometheus-node-exporter
MAX_WEIGHT = 256  # HAProxy's highest server weight
# What an API key may hold to go into HAProxy's config between single quotes (a token).
KEY_CHARS = re.compile(r"[A-Za-z0-9._~+/=-]{1,4096}")
WILDCARDS = ("0.0.0.0", "::", "")
WRITTEN = "# Written by llamarack (roles/gateway/plan.py): edits are replaced on the next run.\n"


class GatewayError(Exception):
    """The gateway cannot be configured as asked; the message names what and the fix."""


@dataclass(frozen=True)
class ServingHost:
    """A serving host as the gateway sees it, from its inventory data and settings."""

    name: str
    address: str
    """How the gateway reaches it: its ``ssh_hostname``, else its name."""
    root: str
    port: int
    listen: str
    parallel: int
    key_file: Optional[str] = None
    node_exporter: bool = False

    @property
    def units_record(self) -> str:
        return Layout(self.root).units_record

    @property
    def bench_record(self) -> str:
        return Layout(self.root).bench_record


def serving_host(name: str, address: Optional[str], settings: Settings) -> ServingHost:
    s = settings.server
    return ServingHost(name, address or name, settings.general.root, s.port, s.listen, s.parallel,
                       s.api_key_file, settings.gateway.node_exporter)  # fmt: skip


@dataclass(frozen=True)
class Backend:
    """One serving unit: HAProxy server ``server`` at ``address:port``."""

    server: str
    host: str
    address: str
    port: int
    weight: int
    tg128: Optional[float] = None
    """The unit's llama-bench tg128 record (tokens/s), where it has one."""

    @property
    def address_port(self) -> str:
        return f"{bracketed(self.address)}:{self.port}"


def bracketed(address: str) -> str:
    """An address as HAProxy and Prometheus write it before ``:port`` ([v6])."""
    return f"[{address}]" if ":" in address else address


def server_name(host: str, index: int) -> str:
    """HAProxy's name of unit ``index`` of ``host``: ``<host>_<index>``."""
    return f"{re.sub(r'[^A-Za-z0-9_.-]', '_', host)}_{int(index)}"


def _units(host: ServingHost, record: Optional[dict]) -> list:
    """The unit entries of a host's units record, or its one unit at server_port."""
    units = record.get("units") if isinstance(record, dict) else None
    if not units:
        return [{"index": 0, "port": host.port, "listen": host.listen, "parallel": host.parallel}]
    if not isinstance(units, list) or not all(isinstance(u, dict) for u in units):
        raise GatewayError(f"{host.name}: {host.units_record} has no list of units; the server role writes it")
    return units


def _int(unit: dict, key: str, host: ServingHost, low: int, high: int) -> int:
    value = unit.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise GatewayError(f"{host.name}: {host.units_record}: unit {unit.get('index')!r} has {key} {value!r}; "
                           f"allowed: an integer from {low} to {high}")  # fmt: skip
    return value


def _unit_address(host: ServingHost, listen) -> str:
    """Where the gateway reaches a unit listening on ``listen``."""
    if not isinstance(listen, str) or listen in WILDCARDS:
        return host.address
    try:
        loopback = ipaddress.ip_address(listen).is_loopback
    except ValueError:
        loopback = False
    if loopback:
        raise GatewayError(
            f"{host.name}: llama-server listens on {listen} only: the gateway cannot reach it; the fix: "
            "server_listen = '0.0.0.0' (or the address the gateway reaches) with server_api_key_file")
    return listen


def backends_of(host: ServingHost, record: Optional[dict], bench: Optional[dict] = None) -> list[Backend]:
    """Every unit of ``host`` as a backend (from its units record, else one at server_port),
    each with its own llama-bench tg128 (``bench``: the host's record, its entry measured on
    the unit's cards; one written before units were listed gives its one figure to every unit)."""
    found = []
    for unit in _units(host, record):
        index = _int(unit, "index", host, 0, 4095)
        cards = unit.get("cards") if isinstance(unit.get("cards"), list) else ()
        tg = bench_record.tokens_per_second(bench_record.of_cards(bench, cards), "tg128")
        address = _unit_address(host, unit.get("listen"))
        if not valid_address(address):
            raise GatewayError(f"{host.name}: address {address!r} is no host name or IP address")
        weight = min(_int(unit, "parallel", host, 1, 1 << 20), MAX_WEIGHT)
        found.append(Backend(server_name(host.name, index), host.name, address,
                             _int(unit, "port", host, 1, 65535), weight, tg))  # fmt: skip
    names = [b.server for b in found]
    if len(set(names)) != len(names):
        raise GatewayError(f"{host.name}: {host.units_record} names a unit index twice")
    return found


def rack_key(hosts: list[ServingHost], read_token) -> Optional[str]:
    """The one API key of the rack's units (``server_api_key_file``, read by ``read_token``),
    or None when none has one. The gateway passes a client's key through to whichever unit
    takes the request, so every unit must take the same one."""
    keys = {h.name: read_token(h.key_file, "server_api_key_file") for h in hosts}
    distinct = set(keys.values())
    if len(distinct) > 1:
        groups = sorted({", ".join(sorted(n for n, k in keys.items() if k == key)) for key in distinct})
        raise GatewayError("the serving hosts take different API keys (" + "; ".join(groups) + "): behind one "
                           "gateway a request may reach any unit; the fix: one server_api_key_file for the rack")
    key = distinct.pop() if distinct else None
    if key is not None and not KEY_CHARS.fullmatch(key):
        raise GatewayError("the rack's API key has characters HAProxy's config cannot hold as written "
                           "(allowed: letters, digits and . _ ~ + / = -); the fix: a key of those")  # fmt: skip
    return key


def haproxy_config(settings: Settings, backends: list[Backend], key: Optional[str], templates: tuple = ()) -> str:
    """HAProxy's whole config for this gateway."""
    g = settings.gateway
    if g.api_key == "checked" and key is None:
        raise GatewayError("gateway_api_key = 'checked', but no serving host has a server_api_key_file; "
                           "the fix: set one for the rack, or gateway_api_key = 'pass-through'")  # fmt: skip
    return template(HAPROXY_TEMPLATE, TEMPLATES, templates).render(
        admin_socket=ADMIN_SOCKET, bind=bracketed(g.bind), port=g.port, stats_port=g.stats_port,
        tls_cert_file=g.tls_cert_file, key_checked=g.api_key == "checked",
        key_quoted=f"'{key}'" if key else None, bearer_quoted=f"'Bearer {key}'" if key else None,
        check_timeout=g.check_timeout, request_timeout=g.request_timeout, balance=g.balance,
        balance_factor=g.balance_factor, backends=ring_weights(backends) if g.balance == "affinity" else backends,
    )  # fmt: skip


def ring_weights(backends: list[Backend]) -> list[Backend]:
    """``backends`` weighted for HAProxy's consistent hash: each one's slots scaled so that the
    largest unit has the highest weight (the ratios stay the slots'). The ring holds a server 16
    times per unit of weight, and a ring of few points splits conversations unevenly: of 800
    conversations, four servers of weight 1 took 149 to 268, of weight 16 and more 183 to 218."""
    top = max((b.weight for b in backends), default=1)
    return [replace(b, weight=max(1, round(b.weight * MAX_WEIGHT / top))) for b in backends]


def masked(text: str, key: Optional[str]) -> str:
    """``text`` with the API key replaced (what ``--diff`` may print)."""
    return text.replace(key, "<server_api_key_file>") if key else text


def local_address(settings: Settings, address: str) -> str:
    """Where this gateway's own HAProxy endpoints answer, for a Prometheus on it or elsewhere."""
    return address if settings.gateway.bind in WILDCARDS else settings.gateway.bind


def targets(settings: Settings, address: str, hosts: list[ServingHost], backends: list[Backend]) -> str:
    """Prometheus's file_sd target list: every unit's /metrics (labelled with its server name and
    its bench record), this gateway's HAProxy endpoint, and node-exporter where it is asked."""
    groups = [{"targets": [b.address_port], "labels": {
        "llamarack_kind": "unit", "llamarack_host": b.host, "llamarack_server": b.server,
        **({"llamarack_tg128": f"{b.tg128:g}"} if b.tg128 else {})}} for b in backends]  # fmt: skip
    own = bracketed(local_address(settings, address))
    groups.append({"targets": [f"{own}:{settings.gateway.stats_port}"],
                   "labels": {"llamarack_kind": "haproxy", "llamarack_host": settings.host}})  # fmt: skip
    nodes = [(h.name, h.address) for h in hosts if h.node_exporter]
    if settings.gateway.node_exporter:
        nodes.append((settings.host, address))
    groups += [{"targets": [f"{bracketed(a)}:{NODE_EXPORTER_PORT}"],
                "labels": {"llamarack_kind": "node", "llamarack_host": n}} for n, a in nodes]  # fmt: skip
    return json.dumps(groups, indent=1, sort_keys=True) + "\n"


def prometheus_config(key: Optional[str]) -> str:
    """Prometheus's config (JSON, which is YAML): one job per kind of target of ``TARGETS``;
    the units' job sends the rack's key (``PROMETHEUS_KEY``) when there is one."""
    def job(kind: str, extra: dict) -> dict:
        return {"job_name": f"llamarack-{kind}", "file_sd_configs": [{"files": [TARGETS]}],
                "relabel_configs": [{"source_labels": ["llamarack_kind"], "regex": kind, "action": "keep"}], **extra}

    units = {"authorization": {"credentials_file": PROMETHEUS_KEY}} if key else {}
    config = {"global": {"scrape_interval": "15s", "evaluation_interval": "15s"},
              "rule_files": [PROMETHEUS_RULES],
              "scrape_configs": [job("unit", units), job("haproxy", {}), job("node", {})]}  # fmt: skip
    return WRITTEN + json.dumps(config, indent=1) + "\n"


def alert_rules(settings: Settings, backends: list[Backend]) -> str:
    """Prometheus's alert rules (JSON, which is YAML): no healthy backend; requests deferred for a
    minute; a unit generating far below its llama-bench tg128 record (one rule per unit with a
    record: PromQL cannot compare with a label's value)."""
    fraction = settings.gateway.slow_fraction
    rules = [
        {"alert": "LlamarackNoHealthyBackend", "expr": f'haproxy_backend_active_servers{{proxy="{BACKEND}"}} < 1',
         "for": "1m", "labels": {"severity": "critical"},
         "annotations": {"summary": "the gateway has no healthy llama-server unit: every request fails"}},
        {"alert": "LlamarackRequestsDeferred", "expr": "llamacpp:requests_deferred > 0", "for": "1m",
         "labels": {"severity": "warning"},
         "annotations": {"summary": "{{ $labels.llamarack_server }} has deferred requests for more than a minute"}},
    ]  # fmt: skip
    for b in (b for b in backends if b.tg128):
        rate = f'llamacpp:predicted_tokens_seconds{{llamarack_server="{b.server}"}}'
        floor = round(b.tg128 * fraction, 3)
        rules.append({"alert": "LlamarackSlowGeneration", "expr": f"{rate} > 0 and {rate} < {floor:g}", "for": "10m",
                      "labels": {"severity": "warning", "llamarack_server": b.server},
                      "annotations": {"summary": f"{b.server} generates at {{{{ $value }}}} t/s, below {fraction:g} "
                                                 f"of its llama-bench tg128 record ({b.tg128:g} t/s)"}})  # fmt: skip
    return WRITTEN + json.dumps({"groups": [{"name": "llamarack", "rules": rules}]}, indent=1) + "\n"

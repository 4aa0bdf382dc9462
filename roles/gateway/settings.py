"""The gateway role's settings section (host-data keys ``gateway_*``); they matter on
the hosts of the inventory group ``gateways`` (``gateway_node_exporter`` on every host)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional

from llamarack.settings_fields import Section, host_path, listen_address, setting

# HAProxy's runtime API, level admin: the audit reads the backends' states there and
# ``llamarack rollout`` drains and undrains them. Debian's haproxy makes /run/haproxy.
ADMIN_SOCKET = "/run/haproxy/admin.sock"


@dataclass(frozen=True)
class GatewaySettings(Section):
    """HAProxy in front of the rack: one endpoint for every serving unit (hosts of group gateways)."""

    prefix = "gateway"

    port: int = setting(8000, "TCP port of the rack's one endpoint (OpenAI API and /completion)", between=(1, 65535))
    bind: str = setting("0.0.0.0", "address the endpoint listens on (0.0.0.0: every IPv4 interface, :: every "
                        "interface)", listen_address)
    tls_cert_file: Optional[str] = setting(
        None, "PEM file on the gateway host holding the certificate, its chain and its key (HAProxy's crt): set, the "
        "endpoint speaks TLS only; None: plain HTTP",
        lambda value: host_path(value))  # a file HAProxy reads, not a directory root runs from
    api_key: Literal["pass-through", "checked"] = setting(
        "pass-through",
        "pass-through: the gateway forwards the Authorization header and each llama-server checks the "
        "rack's key (server_api_key_file) itself; checked: the gateway also answers 401 to a request "
        "without that key, before it reaches a backend",
    )
    stats_port: int = setting(
        8404, "TCP port of HAProxy's own Prometheus endpoint (/metrics) and stats page (/stats)", between=(1, 65535)
    )
    check_timeout: int = setting(
        20,
        "seconds a unit has to answer the hang check (GET /metrics waits for llama-server's main loop): "
        "more than one batch's prefill on the slowest card",
        between=(1, 600),
    )
    balance: Literal["affinity", "leastconn"] = setting(
        "affinity",
        "affinity: a returning conversation goes to the unit that holds its prompt cache (by its X-Session-Id "
        "header, else its opening), another unit when that one is drained, down or over "
        "gateway_balance_factor; leastconn: every request to the unit with the fewest in flight",
    )
    balance_factor: int = setting(
        300,
        "with affinity, the most a unit takes, in percent of the mean of requests in flight per unit "
        "(HAProxy's hash-balance-factor): a conversation whose unit is at the bound goes to another",
        between=(101, 10000),
    )
    request_timeout: int = setting(
        900,
        "seconds a backend may stay silent on a request (a long generation that does not stream "
        "sends nothing until it ends)",
        between=(10, 86400),
    )
    prometheus: bool = setting(
        False, "install Debian's prometheus on the gateway, scraping the rack, with llamarack's alert rules"
    )
    node_exporter: bool = setting(
        False,
        "install Debian's prometheus-node-exporter on this host (a serving host or a gateway); the "
        "gateway's target list names each host where it is set",
    )
    slow_fraction: float = setting(
        0.5,
        "alert when a unit generates at less than this fraction of its llama-bench tg128 record "
        "(llamacpp:predicted_tokens_seconds, while it generates)",
        between=(0.01, 1.0),
    )

    def problems(self) -> list[str]:
        if self.port == self.stats_port:
            return [f"gateway_stats_port: given {self.stats_port}; allowed: a port other than gateway_port "
                    f"({self.port})"]  # fmt: skip
        return []

"""The role's one ``@deploy`` entry point (the role is described in ``__init__.py``)."""

from pyinfra import host
from pyinfra.api import deploy

from llamarack.operations import apt_install_missing, report
from roles.settings import Settings, settings_for

from .operations import haproxy, node_exporter, prometheus, prometheus_targets
from .plan import ServingHost, bracketed, local_address, serving_host


def serving_hosts() -> tuple[ServingHost, ...]:
    """The inventory's serving hosts (those not in group ``gateways``), in inventory order,
    with their settings."""
    inventory = ((other, settings_for(other)) for other in host.state.inventory)
    return tuple(serving_host(other.name, other.data.get("ssh_hostname"), settings)
                 for other, settings in inventory if not settings.is_gateway)


@deploy("llamarack gateway")
def gateway(settings: Settings, templates: tuple = ()):
    """On a gateway (group ``gateways``): HAProxy in front of every serving unit of the inventory,
    Prometheus's target list and, with ``gateway_prometheus``, Prometheus with llamarack's
    alert rules. On a serving host: node-exporter when ``gateway_node_exporter`` asks for it.
    deploy.py calls it last on every host (its comment there says why).

    + settings: the host's settings (``gateway_*``)
    + templates: folders whose templates replace the role's own (the project's templates/)"""
    # First, on every host: the operation the gateway's others wait behind.
    node_exporter(name="prometheus-node-exporter (gateway_node_exporter)", settings=settings)
    if not settings.is_gateway:
        return
    hosts = serving_hosts()
    address = host.data.get("ssh_hostname") or host.name
    g = settings.gateway
    # python3: the audit's and the rollout's host scripts talk to HAProxy's admin socket with it
    apt_install_missing(name="HAProxy from Debian", packages=["haproxy", "python3"])
    haproxy(name=f"HAProxy in front of the units of {len(hosts)} serving host(s)", settings=settings, hosts=hosts,
            templates=tuple(templates))  # fmt: skip
    prometheus_targets(name="Prometheus target list of the rack", settings=settings, hosts=hosts, address=address)
    if g.prometheus:
        apt_install_missing(name="Prometheus from Debian", packages=["prometheus"])
        prometheus(name="Prometheus scraping the rack, with llamarack's alert rules", settings=settings, hosts=hosts)
    scheme = "https" if g.tls_cert_file else "http"
    url = f"{scheme}://{bracketed(local_address(settings, address))}:{g.port}"
    report(name="How to reach the rack",
           message=f"the rack: {url}/v1/chat/completions (OpenAI API), {url}/completion; HAProxy's "
           f"metrics at http://{bracketed(address)}:{g.stats_port}/metrics")  # fmt: skip

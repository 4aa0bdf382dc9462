"""Gateway: HAProxy in front of the rack, one endpoint for every serving unit, and monitoring.

    /etc/haproxy/haproxy.cfg                 the config (templates/haproxy.cfg.j2 here)
    /run/haproxy/admin.sock                  HAProxy's runtime API (level admin)
    /etc/llamarack/prometheus/targets.json   Prometheus's file_sd list of the rack
    /etc/prometheus/prometheus.yml           with gateway_prometheus: the scrape config
    /etc/prometheus/llamarack-rules.yml      and llamarack's alert rules

Runs on the hosts of the inventory group ``gateways`` (they get preflight's read and this
role only); on serving hosts it installs only prometheus-node-exporter, when
``gateway_node_exporter`` asks for it. docs/gateway.md says how it routes (conversation
affinity or least connections), checks the units (``/health`` and ``/metrics``, neither of
which wakes a sleeping one) and passes the API key through.
"""

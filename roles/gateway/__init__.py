"""Gateway: HAProxy in front of the rack, one endpoint for every serving unit, and monitoring.

    /etc/haproxy/haproxy.cfg                 the config (templates/haproxy.cfg.j2 here)
    /run/haproxy/admin.sock                  HAProxy's runtime API (level admin)
    /etc/llamarack/prometheus/targets.json   Prometheus's file_sd list of the rack
    /etc/prometheus/prometheus.yml           with gateway_prometheus: the scrape config
    /etc/prometheus/llamarack-rules.yml      and llamarack's alert rules

Runs on the hosts of the inventory group ``gateways`` (they get preflight's read and
this role only). Backend ``llamarack`` holds one server ``<host>_<index>`` per unit
of each serving host, read from its ``state/units.json`` when the role runs (one
unit at ``server_port`` without it), weighted by its parallel slots, balanced by
conversation affinity (``gateway_balance``: a returning conversation to the unit
that holds its prompt cache) or least connections. A unit is in service while it
answers ``/health`` 200 and ``/metrics`` 200 within ``gateway_check_timeout``: a
hung llama-server still answers ``/health``, not ``/metrics``, and neither wakes a
sleeping one. The config is staged, proved with ``haproxy -c`` and only then
switched in and reloaded. The API key is passed through (docs/gateway.md says why).
On serving hosts the role installs only prometheus-node-exporter, when
``gateway_node_exporter`` asks for it.
"""

"""pyinfra's connections to lab hosts run with Nagle's algorithm off, from
the repo's inventory (via group_data/all.py) and from the rack's generated
inventory (llamarack/ssh.py says why)."""

import socket
from pathlib import Path

import pytest
from pyinfra.api import Config, State
from pyinfra.api.connect import connect_all, disconnect_all
from pyinfra.context import ctx_state
from pyinfra_cli.inventory import make_inventory

pytestmark = pytest.mark.lab
ROOT = Path(__file__).resolve().parents[2]


def nodelay_by_host(inventory_path, override_data=None) -> dict[str, int]:
    with ctx_state.use(State()):  # pyinfra runs inventory files inside a state
        inventory = make_inventory(str(inventory_path), override_data=override_data,
                                   cwd=str(ROOT))
    state = State(inventory, Config())
    connect_all(state)
    try:
        assert all(host.connected for host in inventory), "a lab host did not connect"
        return {
            host.name: host.connector.client.get_transport().sock.getsockopt(
                socket.IPPROTO_TCP, socket.TCP_NODELAY)
            for host in inventory
        }
    finally:
        disconnect_all(state)


@pytest.mark.parametrize("inventory", ["repo", "rack"])
def test_connections_have_tcp_nodelay(lab_rack, inventory):
    path = ROOT / "inventory/lab.py" if inventory == "repo" else lab_rack.inventory_path
    found = nodelay_by_host(path)
    if inventory == "rack":
        assert sorted(found) == sorted(h.name for h in lab_rack.all_hosts)
    assert found and all(found.values()), found


def test_without_the_kwargs_paramiko_leaves_nagle_on(lab_rack):
    # what the setting changes: plain paramiko keeps Nagle's algorithm
    found = nodelay_by_host(lab_rack.inventory_path,
                            override_data={"ssh_paramiko_connect_kwargs": {}})
    assert not any(found.values()), found

"""llamarack/ssh.py: pyinfra's SSH sockets get TCP_NODELAY, through
pyinfra's own data loading."""

import socket
from pathlib import Path

import pytest
from paramiko import Transport
from pyinfra.api import State
from pyinfra.context import ctx_state
from pyinfra_cli.inventory import _get_group_data

from llamarack.ssh import PARAMIKO_CONNECT_KWARGS, nodelay_transport

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def tcp_pair():
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname())
    server, _ = listener.accept()
    yield client
    for s in (client, server, listener):
        s.close()


def test_nodelay_transport_sets_tcp_nodelay(tcp_pair):
    assert tcp_pair.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 0
    transport = nodelay_transport(tcp_pair)
    assert isinstance(transport, Transport)
    assert transport.sock is tcp_pair
    assert tcp_pair.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0


def test_nodelay_transport_leaves_non_tcp_socks_alone():
    # a ProxyCommand/ProxyJump sock has no TCP options to set
    a, b = socket.socketpair()
    try:
        transport = nodelay_transport(a)
        assert transport.sock is a
    finally:
        a.close()
        b.close()


def test_group_data_sets_the_connect_kwargs_for_every_host():
    with ctx_state.use(State()):
        data = _get_group_data(str(ROOT / "inventory/group_data"))["all"]
    assert data["ssh_paramiko_connect_kwargs"] is PARAMIKO_CONNECT_KWARGS
    # pyinfra drops imported names: the import does not leak as host data
    assert "PARAMIKO_CONNECT_KWARGS" not in data

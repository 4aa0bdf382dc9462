"""How pyinfra's SSH connections to llamarack hosts are opened.

paramiko sets no socket options, so Nagle's algorithm stays on. An SSH
exec is a few small writes each way; with Nagle, a small write that waits
for the peer's delayed ACK stalls about 40 ms. Measured against a lab host
(paramiko, 50 runs each): ``exec true`` took 46 ms with Nagle and 4 ms
without; connect and key auth took 69 ms and 21 ms. A deploy runs
hundreds of commands per host, one after the other.

The fix goes through two public hooks: pyinfra's ``ssh_paramiko_connect_kwargs``
host data and paramiko's ``transport_factory`` argument, which receives the
connected socket before the handshake starts. ``inventory/group_data/all.py``
and the lab's generated inventory set it; an inventory of your own that
sets ``ssh_paramiko_connect_kwargs`` should include these kwargs as well.
"""

from __future__ import annotations

from typing import Any


def nodelay_transport(sock: Any, **kwargs: Any):
    """paramiko's Transport on ``sock`` with TCP_NODELAY set. Sockets that
    are not TCP (a ProxyCommand pipe, a ProxyJump channel) are left as they
    are."""
    # Imported here: inventories import this module, and ``llamarack plan`` and
    # ``llamarack settings`` read them without connecting (paramiko takes 0.1 s to import).
    import socket

    from paramiko import Transport

    if getattr(sock, "family", None) in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return Transport(sock, **kwargs)


# The value of pyinfra's `ssh_paramiko_connect_kwargs` for llamarack hosts.
PARAMIKO_CONNECT_KWARGS = {"transport_factory": nodelay_transport}

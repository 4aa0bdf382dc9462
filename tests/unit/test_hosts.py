"""llamarack/hosts.py: the inventory as pyinfra loads it, and one command per host
through pyinfra's own connectors (the lab tests run it against real hosts)."""

import socket

import pytest

from llamarack import hosts


def test_an_inventory_of_names_is_loaded_and_limited_in_its_order():
    assert [h.name for h in hosts.load("@local,gpu01,gpu02")] == ["@local", "gpu01", "gpu02"]
    assert [h.name for h in hosts.load("@local,gpu01,gpu02", ("gpu02", "@local"))] == ["@local", "gpu02"]
    with pytest.raises(ValueError, match="no host gpu03 in the inventory"):
        hosts.load("gpu01,gpu02", ("gpu03",))


def test_one_command_on_each_host_and_a_host_that_cannot_be_reached(tmp_path):
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))  # bound, not listening: a connection is refused
    port = closed.getsockname()[1]
    inventory = tmp_path / "inventory.py"
    inventory.write_text(f'hosts = ["@local", ("gone", {{"ssh_hostname": "127.0.0.1", "ssh_port": {port}, '
                         f'"ssh_connect_timeout": 2}})]\n')  # fmt: skip
    chosen = hosts.load(str(inventory))
    replies = {r.name: r for r in hosts.run_each({h: "echo one; echo two >&2; exit 3" for h in chosen}, 30,
                                                  lambda reply: reply)}  # fmt: skip
    closed.close()
    local, gone = replies["@local"], replies["gone"]
    assert local.reachable and not local.ok and local.output == ["one"] and local.stderr == ["two"]
    assert not gone.reachable and gone.error and not gone.output

"""llamarack/openssh.py: the audit reaches each host with the system's ssh, from the host
data pyinfra's SSH connector reads, its command wrapped as pyinfra wraps it
(the lab tests run it against real hosts, one of them through sudo)."""

import subprocess

import pytest

from llamarack import openssh


def test_ssh_argv_reads_the_data_pyinfra_reads():
    argv = openssh.ssh_argv("gpu01", {"ssh_hostname": "10.0.0.7", "ssh_port": 2222, "ssh_user": "ops",
                                      "ssh_key": "/keys/id", "ssh_known_hosts_file": "/etc/kh",
                                      "ssh_strict_host_key_checking": "yes", "ssh_config_file": "/etc/cfg"},
                            connect_timeout=10)  # fmt: skip
    assert argv[:3] == ["ssh", "-o", "BatchMode=yes"]
    text = " ".join(argv)
    for words in ("-F /etc/cfg", "-o UserKnownHostsFile=/etc/kh", "-o StrictHostKeyChecking=yes", "-p 2222",
                  "-i /keys/id -o IdentitiesOnly=yes", "-l ops", "-o ConnectTimeout=10"):  # fmt: skip
        assert words in text, words
    assert argv[-2:] == ["--", "10.0.0.7"]  # no option can come from the host's name


def test_defaults_are_pyinfras():
    argv = openssh.ssh_argv("gpu01.example", {}, connect_timeout=10)
    assert "StrictHostKeyChecking=accept-new" in argv and argv[-1] == "gpu01.example"
    assert "-l" not in argv and "-i" not in argv and "-p" not in argv


def test_an_odd_value_stays_one_word(tmp_path):
    hostname = f"-oProxyCommand=touch {tmp_path}/ran"
    argv = openssh.ssh_argv("h", {"ssh_hostname": hostname, "ssh_key": "/k ey; rm"}, 1)
    assert argv[-2:] == ["--", hostname] and "/k ey; rm" in argv
    # ssh itself takes the word after -- as the host, never as an option
    r = subprocess.run(argv + ["true"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 255 and not (tmp_path / "ran").exists()


@pytest.mark.parametrize("arguments, wanted", [
    ({}, "sh -c 'sh -s'"),
    ({"_sudo": True}, "sudo -H -n sh -c 'sh -s'"),
    ({"_sudo": True, "_sudo_user": "llamarack"}, "sudo -H -n -u llamarack sh -c 'sh -s'"),
    ({"_sudo": False, "_shell_executable": "bash"}, "bash -c 'sh -s'"),
])  # fmt: skip
def test_the_remote_command_is_wrapped_as_pyinfra_wraps_it(arguments, wanted):
    assert openssh.remote_command(arguments) == wanted


def inventory(*hosts):
    from pyinfra.api import Config, Inventory, State

    made = Inventory((list(hosts), {}))
    State(made, Config())
    return made


def test_a_host_that_needs_a_password_typed_is_refused_without_connecting():
    hosts = inventory(("gpu01", {"ssh_hostname": "192.0.2.1", "ssh_password": "secret"}))
    session = openssh.connect(list(hosts))[0]
    assert session.proc is None
    session.send("true", timeout=5)
    result = session.result()
    assert not result.reachable and "ssh_password" in result.error and "secret" not in result.error


def test_a_host_nothing_answers_for_is_unreachable_with_ssh_s_reason():
    hosts = inventory(("gone", {"ssh_hostname": "127.0.0.1", "ssh_port": 1}))
    session = openssh.connect(list(hosts), connect_timeout=2)[0]
    session.send("echo never", timeout=30)
    result = session.result()
    assert not result.reachable and "Connection refused" in result.error and result.output == []


def test_limit_names_hosts_of_the_inventory():
    hosts = inventory("a", "b", "c")
    assert [h.name for h in openssh.select(hosts, ("c", "a"))] == ["a", "c"]
    assert [h.name for h in openssh.select(hosts)] == ["a", "b", "c"]
    with pytest.raises(ValueError, match="no host d"):
        openssh.select(hosts, ("d",))

"""llamarack/openssh.py: the audit reaches each host with the system's ssh, from the host
data pyinfra's SSH connector reads, its command wrapped as pyinfra wraps it
(the lab tests run it against real hosts, one of them through sudo)."""

import subprocess
import sys

import pytest

from llamarack import openssh
from tests.support.fake_ssh import fake_ssh as on_path


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


def test_answers_are_read_in_the_order_the_hosts_give_them(fake_ssh):
    import queue

    hosts = inventory("slow", "quick", ("typed", {"ssh_password": "secret"}))
    sessions = openssh.connect(list(hosts))
    replies = queue.SimpleQueue()
    sessions[0].send("sleep 2; echo slow", timeout=30, replies=replies)
    sessions[1].send("echo quick", timeout=30, replies=replies)
    sessions[2].send("echo never", timeout=30, replies=replies)  # refused: answered at once
    order = [(s.name, s.result().output) for s in openssh.answered(sessions, replies)]
    assert sorted(order[:2]) == [("quick", ["quick"]), ("typed", [])]
    assert order[2] == ("slow", ["slow"])


def test_a_session_whose_pipe_fails_is_answered_with_the_reason(fake_ssh, monkeypatch):
    import queue

    session = openssh.connect(list(inventory("gpu01")))[0]

    def broken(*args, **kwargs):
        raise OSError("pipe gone")

    monkeypatch.setattr(session.proc, "communicate", broken)
    replies = queue.SimpleQueue()
    session.send("true", timeout=30, replies=replies)
    assert replies.get(timeout=30) is session
    assert not session.result().reachable and session.result().error == "OSError: pipe gone"
    session.close()


def test_limit_names_hosts_of_the_inventory():
    hosts = inventory("a", "b", "c")
    assert [h.name for h in openssh.select(hosts, ("c", "a"))] == ["a", "c"]
    assert [h.name for h in openssh.select(hosts)] == ["a", "b", "c"]
    with pytest.raises(ValueError, match="no host d"):
        openssh.select(hosts, ("d",))


def test_the_plain_remote_command_is_pyinfras():
    # early starts ssh before pyinfra is imported, with this text; connect keeps it only if equal
    assert openssh.PLAIN_REMOTE_COMMAND == openssh.remote_command({})


@pytest.fixture
def fake_ssh(tmp_path, monkeypatch):
    """An ``ssh`` that logs its command line and answers its stdin's script with sh."""
    return on_path(tmp_path, monkeypatch, "exec sh -s")


def _inventory_file(tmp_path, text, all_data=None):
    (tmp_path / "inv").mkdir()
    path = tmp_path / "inv" / "rack.py"
    path.write_text(text)
    if all_data is not None:
        (tmp_path / "inv" / "group_data").mkdir()
        (tmp_path / "inv" / "group_data" / "all.py").write_text(all_data)
    return str(path)


def test_early_ssh_is_kept_when_the_real_data_gives_the_same_command_line(tmp_path, monkeypatch, fake_ssh):
    monkeypatch.chdir(tmp_path)
    path = _inventory_file(tmp_path, "import os\ncounted = os.environ\n"
                                     "gpus = [('gpu01', {'ssh_hostname': '192.0.2.1'}), 'gpu02']\n",
                           all_data="ssh_user = 'ops'\nssh_port = 2222\n")  # fmt: skip
    started = openssh.early(path)
    assert set(started.started) == {"gpu01", "gpu02"}
    hosts = openssh.load_inventory(path, started.executed)
    assert hosts.get_host("gpu01").data.ssh_user == "ops"  # pyinfra's own loader, group data included
    sessions = openssh.connect(list(hosts), started=started)
    for s in sessions:
        s.send("echo from $0", timeout=30)
    assert [s.result().output for s in sessions] == [["from sh"], ["from sh"]]
    lines = fake_ssh.read_text().splitlines()
    assert len(lines) == 2  # no second ssh: each early one was kept
    assert "-l ops" in lines[0] and "-p 2222" in lines[0] and "-- 192.0.2.1" in lines[0]


def test_early_ssh_is_replaced_when_pyinfra_reads_the_data_otherwise(tmp_path, monkeypatch, fake_ssh):
    # two groups set ssh_user: pyinfra's order decides, so early leaves gpu01 to it; a
    # group_data file for a group early does not read changes gpu02's port
    monkeypatch.chdir(tmp_path)
    path = _inventory_file(tmp_path, "a = ([('gpu01', {})], {'ssh_user': 'x'})\n"
                                     "b = (['gpu01', 'gpu02'], {'ssh_user': 'y'})\n")  # fmt: skip
    (tmp_path / "group_data").mkdir()
    (tmp_path / "group_data" / "b.py").write_text("ssh_port = 2200\n")
    started = openssh.early(path)
    assert set(started.started) == {"gpu02"}
    hosts = openssh.load_inventory(path, started.executed)
    sessions = openssh.connect(list(hosts), started=started)
    for s in sessions:
        s.send("true", timeout=30)
        assert s.result().status == 0
    lines = fake_ssh.read_text().splitlines()
    # gpu02's early ssh (no port) was stopped and started again with pyinfra's data
    assert len(lines) == 3 and "-p 2200" not in lines[0] and "-p 2200" in lines[2]


def test_early_reads_nothing_but_files_and_leaves_errors_to_pyinfra(tmp_path, monkeypatch, fake_ssh):
    monkeypatch.chdir(tmp_path)
    assert openssh.early("gpu01,gpu02").started == {}
    broken = _inventory_file(tmp_path, "raise RuntimeError('inventory of your own')\n")
    assert openssh.early(broken).started == {}
    typed = tmp_path / "typed.py"
    typed.write_text("gpus = [('gpu01', {'ssh_password': 'p'}), ('gpu02', {'_sudo_password': 'p'})]\n")
    assert openssh.early(str(typed)).started == {}
    assert not fake_ssh.exists()


def test_a_host_reached_through_sudo_connects_early_and_its_script_runs_in_the_wrapped_shell(tmp_path, monkeypatch,
                                                                                              fake_ssh):  # fmt: skip
    # The ssh runs the plain shell for every host, so a wrapped one connects before pyinfra is
    # imported too; the wrapping (here an environment, then a working directory) runs the script.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "there").mkdir()
    path = _inventory_file(tmp_path, "gpus = [('gpu01', {'_env': {'WRAPPED': 'yes'}}),"
                                     f" ('gpu02', {{'_chdir': {str(tmp_path / 'there')!r}}}), 'gpu03']\n")  # fmt: skip
    started = openssh.early(path)
    assert set(started.started) == {"gpu01", "gpu02", "gpu03"}
    hosts = openssh.load_inventory(path, started.executed)
    sessions = openssh.connect(list(hosts), started=started)
    assert [s.command for s in sessions] == ["sh -c 'export WRAPPED=yes && sh -s'",
                                             f"sh -c 'cd {tmp_path / 'there'} && sh -s'",
                                             openssh.PLAIN_REMOTE_COMMAND]  # fmt: skip
    script = 'echo "$(basename "$PWD") $WRAPPED"\nexit 3'
    for s in sessions:
        s.send(script, timeout=30)
    results = [s.result() for s in sessions]
    assert [r.output for r in results] == [[f"{tmp_path.name} yes"], ["there "], [f"{tmp_path.name} "]]
    assert [r.status for r in results] == [3, 3, 3]  # the wrapped shell's status is the command's
    lines = fake_ssh.read_text().splitlines()
    assert len(lines) == 3 and all(line.endswith(" sh -c 'sh -s'") for line in lines)  # each early ssh kept


def test_the_wrapped_shell_gets_the_script_byte_for_byte():
    # what the plain remote shell is given: the wrapped shell with the script as a quoted
    # here-document, whose delimiter is no line of the script
    script = "printf '%s\\n' \"$HOME\" '$(date)' \\\nEOF\nllamarack-script-end-x\necho 'no newline at the end'"
    given = openssh.through("bash -c 'sh -s'", script)
    end = given.splitlines()[-1]
    assert given.startswith(f"bash -c 'sh -s' <<'{end}'\n") and end.startswith("llamarack-script-end-")
    assert end not in script and given.count(end) == 2
    r = subprocess.run(["sh", "-s"], input=given, capture_output=True, text=True, timeout=30, env={"HOME": "/h"})
    wanted = subprocess.run(["bash", "-c", "sh -s"], input=script, capture_output=True, text=True, timeout=30,
                            env={"HOME": "/h"})  # fmt: skip
    assert r.returncode == 0 and r.stdout == wanted.stdout and "$(date)" in r.stdout
    assert openssh.through(openssh.PLAIN_REMOTE_COMMAND, script) == script  # the plain shell reads it as is


def test_the_inventory_file_runs_once(tmp_path, monkeypatch, fake_ssh):
    monkeypatch.chdir(tmp_path)
    runs = tmp_path / "runs"
    path = _inventory_file(tmp_path, f"open({str(runs)!r}, 'a').write('ran\\n')\ngpus = ['gpu01']\n")
    started = openssh.early(path, limit=("gpu01",))
    hosts = openssh.load_inventory(path, started.executed)
    openssh.connect(list(hosts), started=started)[0].close()
    assert runs.read_text() == "ran\n"


def test_the_all_group_data_file_runs_once_and_is_read_as_pyinfra_reads_it(tmp_path, monkeypatch, fake_ssh):
    monkeypatch.chdir(tmp_path)
    runs = tmp_path / "runs"
    path = _inventory_file(tmp_path, "gpus = ['gpu01']\n",
                           all_data=f"import os\nopen({str(runs)!r}, 'a').write('ran\\n')\n"
                                    "ssh_port = 2222\nserver_port = 8081\n")  # fmt: skip
    started = openssh.early(path, limit=("gpu01",))
    hosts = openssh.load_inventory(path, started.executed)
    (host,) = list(hosts)
    assert runs.read_text() == "ran\n"
    assert host.data.ssh_port == 2222 and host.data.server_port == 8081
    assert "os" not in host.data.dict()  # pyinfra's rule: names bound by imports are not data
    openssh.connect([host], started=started)[0].close()


def test_the_inventory_file_given_relative_runs_once(tmp_path, monkeypatch, fake_ssh):
    # pyinfra's loader names the inventory file as it was given: `llamarack audit inventory/lab.py`
    monkeypatch.chdir(tmp_path)
    runs = tmp_path / "runs"
    _inventory_file(tmp_path, f"open({str(runs)!r}, 'a').write('ran\\n')\ngpus = ['gpu01']\n",
                    all_data=f"open({str(runs)!r}, 'a').write('group data ran\\n')\n")  # fmt: skip
    started = openssh.early("inv/rack.py", limit=("gpu01",))
    hosts = openssh.load_inventory("inv/rack.py", started.executed)
    openssh.connect(list(hosts), started=started)[0].close()
    assert runs.read_text() == "ran\ngroup data ran\n"


def _fresh_python(code: str, timeout: int = 60) -> str:
    """What ``code`` prints in a fresh interpreter (this process may have imported pyinfra,
    invoke or the audit's modules already); it must exit 0."""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_pyinfra_is_imported_without_invoke_and_invoke_stays_importable():
    # A fresh interpreter: this process may have imported pyinfra (and invoke) already.
    code = ("import sys; from llamarack import openssh\n"
            "with openssh._without_invoke():\n"
            "    import paramiko.config, pyinfra.api\n"
            "assert 'invoke' not in sys.modules, sys.modules.get('invoke')\n"
            "assert paramiko.config.invoke is None and paramiko.config.invoke_import_error is not None\n"
            "import invoke\n"
            "print(invoke.__name__)\n")  # fmt: skip
    stdout = _fresh_python(code)
    assert stdout.strip() == "invoke"


def test_what_runs_before_the_first_ssh_imports_no_logging_dataclasses_or_pyinfra():
    # the other core idles until the first ssh starts: 22 to 36 ms of imports there before
    code = ("import sys; before = set(sys.modules)\n"
            "import llamarack.entry, llamarack.openssh, llamarack.ssh\n"
            "print(' '.join(sorted(set(sys.modules) - before)))\n")  # fmt: skip
    stdout = _fresh_python(code)
    imported = set(stdout.split())
    assert "llamarack.openssh" in imported
    assert not imported & {"logging", "dataclasses", "inspect", "socket", "pyinfra", "click"}, sorted(imported)


def test_the_audit_loads_an_inventory_without_importing_invoke():
    # pyinfra's own sshuserclient then puts its FakeInvoke in paramiko.config (for Match exec)
    code = ("import sys; from llamarack import openssh\n"
            "openssh.load_inventory('gpu01,gpu02')\n"
            "import paramiko.config\n"
            "assert 'invoke' not in sys.modules, sys.modules.get('invoke')\n"
            "assert getattr(paramiko.config.invoke, '__name__', None) != 'invoke'\n"
            "import invoke\n"
            "print(invoke.__name__)\n")  # fmt: skip
    stdout = _fresh_python(code)
    assert stdout.strip() == "invoke"


def test_global_arguments_made_once_still_refuse_a_fact_that_takes_one():
    # run in its own process: the audit's patch is for a process that is only the audit
    code = """
from llamarack import openssh
from pyinfra.api import facts
before = facts.all_global_arguments()
openssh.global_arguments_once()
assert facts.all_global_arguments() == before and facts.all_global_arguments() is not facts.all_global_arguments()
try:
    class TakesSudo(facts.FactBase):
        def command(self, _sudo):
            return "true"
except TypeError as e:
    print("refused:", e)
"""
    stdout = _fresh_python(code, timeout=120)
    assert "refused:" in stdout and "_sudo are reserved for global arguments" in stdout


def test_the_ssh_processes_run_below_the_audits_priority(tmp_path, monkeypatch, fake_ssh):
    # they compete with the audit's Python for the cores: the scripts they wait for come from it
    import os

    monkeypatch.chdir(tmp_path)
    path = _inventory_file(tmp_path, "gpus = ['gpu01', ('gpu02', {'_chdir': '/'})]\n")
    started = openssh.early(path)
    hosts = openssh.load_inventory(path, started.executed)
    sessions = openssh.connect(list(hosts), started=started)
    ours = os.getpriority(os.PRIO_PROCESS, 0)
    assert [os.getpriority(os.PRIO_PROCESS, s.proc.pid) for s in sessions] == [min(19, ours + 10)] * 2
    for s in sessions:
        s.send("true", timeout=30)
        assert s.result().status == 0


def test_the_audit_imports_the_roles_plans_without_their_operations():
    # Each role's @deploy lives in its deploy.py, so a plan imports no operation (pyinfra's
    # or a role's); the audit pays for what it compares, not for the deploy.
    code = ("import sys, llamarack.audit\n"
            "print('\\n'.join(m for m in sys.modules if m.startswith(('pyinfra.operations', 'llamarack.roles'))"
            " or m == 'llamarack.operations'))\n")  # fmt: skip
    stdout = _fresh_python(code, timeout=120)
    loaded = set(stdout.split())
    assert "llamarack.roles.server.plan" in loaded and "llamarack.roles.preflight.reads" in loaded
    assert not [m for m in loaded if m.startswith("pyinfra.operations") or m.endswith((".operations", ".deploy"))]

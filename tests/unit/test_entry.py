"""llamarack/entry.py: an audit's ssh connections start before click is imported, from the
command line read as click reads it; the audit keeps them only when click agrees."""

import subprocess
import sys

import pytest

from llamarack import cli
from llamarack.entry import audit_arguments
from tests.support.fake_ssh import fake_ssh as on_path

LINES = [
    ["audit", "inv.py"],
    ["audit", "inv.py", "--json"],
    ["audit", "--limit", "gpu01", "inv.py", "--limit=gpu02", "--verify", "--debug"],
    ["audit", "--templates", "t", "inv.py", "--templates=u", "--json"],
    ["audit", "--limit", "--json", "inv.py"],  # click takes the word after --limit as its value
    ["audit", "--limit=", "inv.py"],
    ["audit", "--", "-inv.py"],
    ["audit", "--json", "--", "inv.py"],
    ["audit", "-"],
]
NOT_SURE = [
    ["audit"],
    ["audit", "inv.py", "other.py"],
    ["audit", "inv.py", "--help"],
    ["audit", "-h", "inv.py"],
    ["audit", "inv.py", "--lim", "gpu01"],
    ["audit", "inv.py", "--json=1"],
    ["audit", "inv.py", "--limit"],
    ["audit", "inv.py", "--unknown"],
    ["plan", "inv.py"],
    ["--version"],
    [],
]


@pytest.mark.parametrize("argv", LINES, ids=" ".join)
def test_an_audit_line_is_read_as_click_reads_it(argv):
    ctx = cli.audit.make_context("audit", list(argv[1:]))
    assert audit_arguments(argv) == (ctx.params["inventory"], ctx.params["limit"])


@pytest.mark.parametrize("argv", NOT_SURE, ids=lambda argv: " ".join(argv) or "nothing")
def test_a_line_it_is_not_sure_of_starts_nothing(argv):
    assert audit_arguments(argv) is None


@pytest.fixture
def fake_ssh(tmp_path, monkeypatch):
    """An ``ssh`` that logs its command line and reaches nobody."""
    return on_path(tmp_path, monkeypatch, "cat >/dev/null\nexit 255")


# The program, with a note of each time openssh.early ran and whether click was imported then.
PROGRAM = """
import os, sys
import llamarack.openssh as openssh
calls, start, leave = [], openssh.early, os._exit
openssh.early = lambda *a: calls.append("click" in sys.modules) or start(*a)
os._exit = lambda status: print("early calls", calls, file=sys.stderr) or leave(status)
sys.argv = ["llamarack", *sys.argv[1:]]
from llamarack.entry import entry
entry()
"""


@pytest.mark.parametrize("args, hosts", [
    (["--limit", "gpu02"], ["192.0.2.2"]),
    (["--limit=gpu02", "--limit", "gpu01"], ["192.0.2.1", "192.0.2.2"]),
    ([], ["192.0.2.1", "192.0.2.2"]),
])  # fmt: skip
def test_the_audit_keeps_the_connections_started_before_click(tmp_path, monkeypatch, fake_ssh, args, hosts):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "rack.py").write_text("gpus = [('gpu01', {'ssh_hostname': '192.0.2.1'}),"
                                      " ('gpu02', {'ssh_hostname': '192.0.2.2', '_sudo': True})]\n")  # fmt: skip
    r = subprocess.run([sys.executable, "-c", PROGRAM, "audit", "rack.py", "--json", *args], capture_output=True,
                       text=True, timeout=120)  # fmt: skip
    assert r.returncode == 2, r.stderr  # the fake ssh reaches nobody
    assert "early calls [False]" in r.stderr  # started once, before click was imported
    started = [line.rsplit(" -- ", 1)[1].split()[0] for line in fake_ssh.read_text().splitlines()]
    assert sorted(started) == hosts  # one ssh per host, and the audit kept it


def test_python_m_llamarack_is_the_same_program(tmp_path, monkeypatch, fake_ssh):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "rack.py").write_text("gpus = [('gpu01', {'ssh_hostname': '192.0.2.1'})]\n")
    r = subprocess.run([sys.executable, "-m", "llamarack", "audit", "rack.py", "--json"], capture_output=True,
                       text=True, timeout=120)  # fmt: skip
    assert r.returncode == 2 and '"gpu01"' in r.stdout, r.stderr  # its settings are refused (no sha256 pins)
    assert len(fake_ssh.read_text().splitlines()) == 1


def test_debug_shows_what_starting_the_connections_logs(tmp_path, monkeypatch, fake_ssh):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "rack.py").write_text("raise RuntimeError('an inventory of your own')\n")
    r = subprocess.run([sys.executable, "-m", "llamarack", "audit", "rack.py", "--debug"], capture_output=True,
                       text=True, timeout=120)  # fmt: skip
    assert "early connect: rack.py: an inventory of your own" in r.stderr  # then pyinfra's loader says it again
    assert not fake_ssh.exists()

"""The /health check after the driver role's reboot, run for real: the operation's
command against a local HTTP server, with ``systemctl``/``journalctl`` stand-ins for the
host's (the unit path moved into a temporary folder)."""

import http.server
import shlex
import subprocess
import threading

import pytest

from llamarack.layout import UNIT_PATH
from roles.server.operations import answers_health
from roles.server.plan import HEALTH_MARK
from roles.settings import load_settings
from tests.support.ophost import run_op


@pytest.fixture
def health_server():
    status = {"code": 200}

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(status["code"])
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield status, f"http://127.0.0.1:{server.server_port}/health"
    server.shutdown()


def run(tmp_path, command: str, active: bool = True) -> subprocess.CompletedProcess:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    state = "ActiveState=active\nSubState=running" if active else "ActiveState=failed\nSubState=failed"
    (bin_dir / "systemctl").write_text(f"#!/bin/sh\nprintf '%s\\n' '{state}'\n")
    (bin_dir / "journalctl").write_text("#!/bin/sh\necho 'llama-server: the journal'\n")
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    unit = tmp_path / "llamarack-server.service"
    command = command.replace(shlex.quote(UNIT_PATH), shlex.quote(str(unit)))
    return subprocess.run(["sh", "-c", command], env={"PATH": f"{bin_dir}:/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=60)  # fmt: skip


def command(**data) -> str:
    s = load_settings("gpu01", {"python_env_backend": "venv", **data})
    (command,), _ = run_op(answers_health, {}, settings=s, reason="the reboot for the driver upgrade")
    return str(command)


def test_a_unit_that_answers_after_the_reboot_passes(tmp_path, health_server):
    status, url = health_server
    (tmp_path / "llamarack-server.service").write_text(f"{HEALTH_MARK}{url}\n[Unit]\n")
    r = run(tmp_path, command())
    assert r.returncode == 0, r.stderr
    assert "llama-server answers /health after the reboot for the driver upgrade" in r.stdout


def test_a_unit_that_stopped_after_the_reboot_fails_the_host_with_its_journal(tmp_path, health_server):
    status, url = health_server
    status["code"] = 503
    (tmp_path / "llamarack-server.service").write_text(f"{HEALTH_MARK}{url}\n[Unit]\n")
    r = run(tmp_path, command(), active=False)
    assert r.returncode == 1
    assert "gpu01: llama-server does not answer /health after the reboot for the driver upgrade" in r.stderr
    assert "the journal" in r.stderr


def test_a_unit_still_loading_past_the_timeout_fails(tmp_path, health_server):
    status, url = health_server
    status["code"] = 503
    (tmp_path / "llamarack-server.service").write_text(f"{HEALTH_MARK}{url}\n[Unit]\n")
    r = run(tmp_path, command(server_health_timeout=2))
    assert r.returncode == 1 and "does not answer /health" in r.stderr


def test_a_host_without_the_unit_has_nothing_to_check(tmp_path):
    r = run(tmp_path, command())
    assert (r.returncode, r.stdout, r.stderr) == (0, "no llama-server unit: nothing to check\n", "")

"""The /health wait of a unit switch (``roles/server/files/wait_healthy.py``), run as the host runs it."""

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from llamarack import remote


# systemctl show's lines of a unit, by what it is doing
STATES = {"running": "ActiveState=active\nSubState=running",
          "post-start": "ActiveState=activating\nSubState=start-post",  # its ExecStartPost= is this check
          "crashed": "ActiveState=activating\nSubState=auto-restart",  # waiting RestartSec= to start again
          "failed": "ActiveState=failed\nSubState=failed"}


def wait(tmp_path, url, active, seconds="20"):
    """The wait, with a double of systemctl printing the unit's ``STATES`` (``active``: running or crashed)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    state = STATES[{True: "running", False: "crashed"}.get(active, active)]
    (bin_dir / "systemctl").write_text(f"#!/bin/sh\nprintf '%s\\n' '{state}'\n")
    (bin_dir / "systemctl").chmod(0o755)
    started = time.monotonic()
    r = subprocess.run([sys.executable, str(remote.path("wait_healthy")), url, "x.service", seconds],
                       env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}, capture_output=True, text=True)  # fmt: skip
    return r.returncode, r.stderr, time.monotonic() - started


def test_a_dead_unit_is_known_at_once_even_at_an_address_nobody_answers(tmp_path):
    # 192.0.2.1 (TEST-NET-1): a connect there hangs until its timeout
    rc, err, took = wait(tmp_path, "http://192.0.2.1:8080/health", active=False)
    assert rc == 1 and "x.service stopped before http://192.0.2.1:8080/health answered 200" in err
    assert took < 1.5, took
    assert wait(tmp_path, "http://192.0.2.1:8080/health", active="failed")[0] == 1


def test_a_unit_whose_start_waits_on_this_check_is_not_taken_for_dead(tmp_path):
    """As the unit's ExecStartPost=, the check runs while systemd calls the unit "activating"."""
    server, port = serve_health(tmp_path)
    try:
        rc, err, _ = wait(tmp_path, f"http://127.0.0.1:{port}/health", active="post-start")
    finally:
        server.kill()
        server.wait()
    assert (rc, err) == (0, "")


def serve_health(tmp_path) -> tuple:
    """(a local HTTP server whose /health answers 200, its port)."""
    (tmp_path / "health").write_text("ok")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with open(tmp_path / "server.log", "w") as log:  # its access log: what it was asked
        server = subprocess.Popen([sys.executable, "-u", "-m", "http.server", "--bind", "127.0.0.1", "--directory",
                                   str(tmp_path), str(port)], stderr=log)  # fmt: skip
    return server, port


def test_a_live_unit_that_answers_200_is_healthy(tmp_path):
    server, port = serve_health(tmp_path)
    try:
        rc, err, _ = wait(tmp_path, f"http://127.0.0.1:{port}/health", active=True)
    finally:
        server.kill()
        server.wait()
    assert (rc, err) == (0, "")
    assert '"GET /health HTTP/1.1" 200' in (tmp_path / "server.log").read_text()


def test_a_live_unit_that_never_answers_times_out(tmp_path):
    rc, err, took = wait(tmp_path, "http://192.0.2.1:8080/health", active=True, seconds="2")
    assert rc == 1 and "no 200 from http://192.0.2.1:8080/health within 2 s" in err and took < 4.5


def residency_check(tmp_path, apps: str, spec: str, url: str = "", unit_text: str = ""):
    """The switch's check after /health, with doubles of systemctl (MainPID 6434, its unit file
    ``unit_text``) and of nvidia-smi printing ``apps`` in the real driver's --query-compute-apps
    format; ``url``: the server's /health (none: a local one that answers /health alone)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (tmp_path / "x.service").write_text(unit_text)
    (bin_dir / "systemctl").write_text('#!/bin/sh\n[ "$1" = show ] && printf "ActiveState=active\\nMainPID=6434\\nInvocationID=f00d\\n'
                                       f'FragmentPath={tmp_path}/x.service\\n"\nexit 0\n')  # fmt: skip
    (bin_dir / "nvidia-smi").write_text(f"#!/bin/sh\nprintf '%s' '{apps}'\n")
    # this start's journal: llama-server's own log on the H200 with its device nodes unopenable
    (bin_dir / "journalctl").write_text(f"#!/bin/sh\ncat {DENIED_LOG}\n")
    for tool in ("systemctl", "nvidia-smi", "journalctl"):
        (bin_dir / tool).chmod(0o755)
    server, port = serve_health(tmp_path) if not url else (None, None)
    try:
        r = subprocess.run([sys.executable, str(remote.path("wait_healthy")), url or f"http://127.0.0.1:{port}/health",
                            "x.service", "20", spec], env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"},
                           capture_output=True, text=True)  # fmt: skip
    finally:
        if server:
            server.kill()
            server.wait()
    return r.returncode, r.stderr + r.stdout


UUID = "GPU-1c315d8b-7c35-20bc-491b-dbfb0494e2cd"
FIXTURES = Path(__file__).parents[1] / "fixtures"
DENIED_LOG = FIXTURES / "llama-server/gpu-residency/denied.log"
H200_APP = f"6434, /opt/llamarack/builds/b1/bin/llama-server, 690, {UUID}\n"  # the H200's line


def test_a_healthy_cuda_unit_must_also_serve_from_its_cards(tmp_path):
    assert residency_check(tmp_path, H200_APP, f"{UUID} 600") == (0, "")
    rc, err = residency_check(tmp_path, "", f"{UUID} 600")  # answers /health, on no card
    assert rc == 1 and "x.service answers /health but does not serve from its cards: no CUDA device" in err
    assert "failed to initialize CUDA: no CUDA-capable device is detected" in err  # this start's journal says why
    rc, err = residency_check(tmp_path, H200_APP, f"{UUID} 4460")
    assert rc == 1 and "less than the planned weights (4460 MiB)" in err
    assert residency_check(tmp_path, "", "")[0] == 0  # a CPU unit has no residency line


def test_a_sleeping_unit_serves_and_its_residency_waits_for_its_wake(tmp_path):
    """Asleep (--sleep-idle-seconds), llama-server has freed its cards: its /props, asked with
    the key its unit names, says so, and the check passes without waking it."""
    from tests.support.fake_llama_server import Behaviour, FakeLlamaServer

    key = tmp_path / "key"
    key.write_text("s3cret\n")
    unit = f"[Service]\nExecStart=/b/bin/llama-server --port 8080 --api-key-file {key} --metrics\n"
    with FakeLlamaServer(Behaviour(api_key="s3cret", sleep_idle_seconds=0.2)) as s:
        time.sleep(0.4)
        rc, out = residency_check(tmp_path, "", f"{UUID} 600", s.url + "/health", unit)
        assert rc == 0 and "x.service is asleep (--sleep-idle-seconds): its residency is checked once it wakes" in out
        assert s.behaviour.sleeping() and s.behaviour.wakes == 0 and ("GET", "/props") in s.behaviour.requests
        s.behaviour.sleep_idle_seconds = None  # awake: on no card is a failure again
        rc, out = residency_check(tmp_path, "", f"{UUID} 600", s.url + "/health", unit)
        assert rc == 1 and "does not serve from its cards" in out
        s.behaviour.sleep_idle_seconds = 0.0  # asleep, but /props needs the key its unit no longer names
        rc, out = residency_check(tmp_path, "", f"{UUID} 600", s.url + "/health", "[Service]\n")
        assert rc == 1 and "does not serve from its cards" in out


def test_the_device_rule_names_what_it_keeps_from_the_server():
    """The H200's real /proc/devices (driver 580): a unit written for a driver before 550.40
    allows nvidia-frontend, which 580 no longer registers, so major 195 is denied."""
    import json

    from roles.server.files.wait_healthy import denied_names

    devices = "\n".join(json.loads((FIXTURES.parent / "facts/CharDevices/driver_580_h200.json").read_text())["output"])
    old = "DeviceAllow=char-nvidia-frontend rw\nDeviceAllow=char-nvidia-uvm rw\n"
    new = "DeviceAllow=char-nvidia rw\nDeviceAllow=char-nvidiactl rw\nDeviceAllow=char-nvidia-uvm rw\n"
    majors = (195, 195, 238, 238)  # /dev/nvidia0, nvidiactl, nvidia-uvm, nvidia-uvm-tools there
    assert denied_names(old, devices, majors) == ("nvidia", "nvidiactl")
    assert denied_names(new, devices, majors) == ()
    assert denied_names("ExecStart=/x\n", devices, majors) == ()  # no device rule: nothing denied by it


def test_the_audit_reads_back_why_the_check_refused_a_unit_that_is_not_running():
    """ServedUnits prints, for a unit not active, the check's refusal from its last start's
    journal as ``refused <text>`` (the check prints it after ``REFUSED``)."""
    from roles.server.files.wait_healthy import REFUSED
    from roles.server.reads import ServedUnits

    command = ServedUnits().command(state="/opt/llamarack/state", health=True)
    assert "_SYSTEMD_INVOCATION_ID=$i" in command and f"s/^{REFUSED}/refused /p" in command
    why = "llamarack-server@1.service answers /health but does not serve from its cards: CPU fallback"
    found = ServedUnits().process(["unit llamarack-server@1.service 0a1b", "state ActiveState=activating",
                                   "state SubState=auto-restart", "health None", f"refused {why}"])  # fmt: skip
    assert found["llamarack-server@1.service"].refused == why

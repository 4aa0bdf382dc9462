"""The /health wait of a unit switch (``roles/server/files/wait_healthy.py``), run as the host runs it."""

import os
import socket
import subprocess
import sys
import time

from llamarack import remote


def wait(tmp_path, url, active: bool, seconds="20"):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "systemctl").write_text(f"#!/bin/sh\nexit {0 if active else 3}\n")
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


def test_a_live_unit_that_answers_200_is_healthy(tmp_path):
    (tmp_path / "health").write_text("ok")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "http.server", "--bind", "127.0.0.1", "--directory",
                               str(tmp_path), str(port)], stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        rc, err, _ = wait(tmp_path, f"http://127.0.0.1:{port}/health", active=True)
    finally:
        server.kill()
        server.wait()
    assert rc == 0, err


def test_a_live_unit_that_never_answers_times_out(tmp_path):
    rc, err, took = wait(tmp_path, "http://192.0.2.1:8080/health", active=True, seconds="2")
    assert rc == 1 and "no 200 from http://192.0.2.1:8080/health within 2 s" in err and took < 4.5

"""roles/gateway/files/haproxy_runtime.py against a real HAProxy (Debian's package): its
admin socket in a temporary folder, backend ``llamarack`` of two local llama-server
stand-ins, run as the gateway host runs the script (``python3 -c SOURCE ...``)."""

import json
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import pytest

from llamarack import remote
from tests.support.fake_llama_server import Behaviour, FakeLlamaServer

pytestmark = pytest.mark.skipif(shutil.which("haproxy") is None, reason="no haproxy here (apt-get install haproxy)")

CONFIG = """global
    stats socket {sock} mode 600 level admin
defaults
    mode http
    timeout connect 2s
    timeout client 30s
    timeout server 30s
frontend api
    bind 127.0.0.1:{port}
    default_backend llamarack
backend llamarack
    balance leastconn
    option httpchk GET /health
    server lab-a_0 127.0.0.1:{a} check inter 300 rise 1 fall 1
    server lab-b_0 127.0.0.1:{b} check inter 300 rise 1 fall 1
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def gateway(tmp_path):
    with FakeLlamaServer() as a, FakeLlamaServer() as b:
        sock, port = tmp_path / "admin.sock", free_port()
        (tmp_path / "haproxy.cfg").write_text(CONFIG.format(sock=sock, port=port, a=a.port, b=b.port))
        proc = subprocess.Popen(["haproxy", "-db", "-f", str(tmp_path / "haproxy.cfg")], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)  # fmt: skip
        try:
            deadline = time.monotonic() + 10
            while runtime(str(sock), "wait-up", "0", "lab-a_0", "lab-b_0").returncode != 0:
                assert time.monotonic() < deadline and proc.poll() is None, "haproxy did not start"
                time.sleep(0.2)
            yield {"sock": str(sock), "url": f"http://127.0.0.1:{port}", "a": a, "b": b}
        finally:
            proc.terminate()
            proc.wait(10)


def runtime(sock: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-I", "-S", "-c", remote.source("haproxy_runtime"), "--socket", sock,
                           *args], capture_output=True, text=True, timeout=60)  # fmt: skip


def show(sock: str) -> dict:
    return json.loads(runtime(sock, "show").stdout)["servers"]


def completion(url: str) -> int:
    request = urllib.request.Request(url + "/completion", data=b'{"n_predict": 2}',
                                     headers={"Content-Type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(request, timeout=30) as r:
        return r.status


def test_show_drain_and_ready(gateway):
    sock = gateway["sock"]
    seen = show(sock)
    assert {k: (v["status"], v["admin"], v["sessions"]) for k, v in seen.items()} == {
        "lab-a_0": ("UP", "ready", 0), "lab-b_0": ("UP", "ready", 0)}
    assert runtime(sock, "set", "drain", "lab-a_0").returncode == 0
    assert (show(sock)["lab-a_0"]["status"], show(sock)["lab-a_0"]["admin"]) == ("DRAIN", "drain")
    before = len(gateway["a"].behaviour.requests)
    for _ in range(6):
        assert completion(gateway["url"]) == 200
    posts = [r for r in gateway["a"].behaviour.requests[before:] if r[0] == "POST"]
    assert posts == [] and sum(r[0] == "POST" for r in gateway["b"].behaviour.requests) == 6
    assert runtime(sock, "set", "ready", "lab-a_0").returncode == 0
    assert runtime(sock, "wait-up", "5", "lab-a_0").returncode == 0


def test_a_drained_server_that_is_down_is_still_drained(gateway):
    sock = gateway["sock"]
    runtime(sock, "set", "drain", "lab-b_0")
    gateway["b"].behaviour.health_status = 503
    deadline = time.monotonic() + 10
    while show(sock)["lab-b_0"]["status"] != "DOWN":
        assert time.monotonic() < deadline
        time.sleep(0.2)
    assert show(sock)["lab-b_0"]["admin"] == "drain"
    runtime(sock, "set", "ready", "lab-b_0")
    r = runtime(sock, "wait-up", "1", "lab-b_0")
    assert r.returncode == 1 and "not in service: lab-b_0" in r.stderr
    gateway["b"].behaviour.health_status = 200
    assert runtime(sock, "wait-up", "10", "lab-b_0").returncode == 0


def test_wait_empty_waits_for_the_request_in_flight(gateway):
    sock = gateway["sock"]
    runtime(sock, "set", "maint", "lab-b_0")
    gateway["a"].behaviour.completion_delay = 2.0
    answered = []
    t = threading.Thread(target=lambda: answered.append(completion(gateway["url"])))
    t.start()
    deadline = time.monotonic() + 5
    while show(sock)["lab-a_0"]["sessions"] == 0:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    runtime(sock, "set", "drain", "lab-a_0")
    assert runtime(sock, "wait-empty", "0.2", "lab-a_0").returncode == 1  # still answering
    started = time.monotonic()
    assert runtime(sock, "wait-empty", "10", "lab-a_0").returncode == 0
    t.join()
    assert answered == [200] and time.monotonic() - started < 5


def test_unknown_servers_and_states_are_refused(gateway):
    sock = gateway["sock"]
    r = runtime(sock, "set", "drain", "lab-c_0")
    assert r.returncode == 1 and "llamarack/lab-c_0: No such server." in r.stderr
    r = runtime(sock, "set", "halfway", "lab-a_0")
    assert r.returncode == 1 and "no state 'halfway'" in r.stderr
    assert runtime(sock, "wait-up", "0", "lab-c_0").returncode == 1


def test_no_socket(tmp_path):
    r = runtime(str(tmp_path / "none.sock"), "show")
    assert r.returncode == 2 and "admin socket" in r.stderr

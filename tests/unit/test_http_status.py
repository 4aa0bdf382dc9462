"""roles/server/files/http_status.py: the health status the audit reports, run as the
host runs it (``python3 -I -S -c SOURCE URL``)."""

import http.server
import socket
import subprocess
import sys
import threading

import pytest

from llamarack import remote


class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/moved":
            self.send_response(302)
            self.send_header("Location", "/health")
        else:
            self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, *args):
        pass


def _serve(family=socket.AF_INET, host="127.0.0.1"):
    class Server(http.server.ThreadingHTTPServer):
        address_family = family

    server = Server((host, 0), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def status(url: str, env=None, *key_file: str) -> str:
    r = subprocess.run([sys.executable, "-I", "-S", "-c", remote.source("http_status"), url, *key_file],
                       capture_output=True, text=True, timeout=60, env=env)  # fmt: skip
    assert r.returncode == 0 and r.stderr == "", r.stderr
    return r.stdout.strip()


def test_the_status_line_of_a_real_server():
    server = _serve()
    port = server.server_address[1]
    try:
        assert status(f"http://127.0.0.1:{port}/health") == "200"
        assert status(f"http://localhost:{port}/elsewhere?x=1") == "404"  # a name, resolved
    finally:
        server.shutdown()
    assert status(f"http://127.0.0.1:{port}/health") == "none"  # nothing listens any more


def test_an_ipv6_address_in_brackets():
    try:
        server = _serve(socket.AF_INET6, "::1")
    except OSError:
        pytest.skip("no IPv6 loopback on this machine")
    try:
        assert status(f"http://[::1]:{server.server_address[1]}/health") == "200"
    finally:
        server.shutdown()


def test_a_redirect_is_its_own_answer_and_no_proxy_is_asked():
    server = _serve()
    port = server.server_address[1]
    try:
        assert status(f"http://127.0.0.1:{port}/moved") == "302"
        # a proxy in the environment that nothing answers at: the server is still asked directly
        proxied = {"PATH": "/usr/bin:/bin", "http_proxy": "http://127.0.0.1:9", "HTTP_PROXY": "http://127.0.0.1:9"}
        assert status(f"http://127.0.0.1:{port}/health", env=proxied) == "200"
    finally:
        server.shutdown()


def test_with_the_key_file_it_says_whether_llama_server_sleeps(tmp_path):
    """The audit's read: /props (with the server's key) says is_sleeping, and asking wakes nothing."""
    from tests.support.fake_llama_server import Behaviour, FakeLlamaServer

    key = tmp_path / "key"
    key.write_text("k3y\n")
    with FakeLlamaServer(Behaviour(api_key="k3y")) as s:
        said = ('{"build_info": "b1-0c1e57098", "model_path": "/opt/llamarack/models/m0/model.gguf", '
                '"total_slots": 2}')  # the process's own provenance
        assert status(s.url + "/health", None, str(key)) == f"200 awake {said}"
        s.behaviour.sleep_idle_seconds = 0.0  # idle long enough: asleep
        assert status(s.url + "/health", None, str(key)) == f"200 asleep {said}"
        assert status(s.url + "/health", None, str(tmp_path / "none")) == "200 none {}"  # no key: /props says 401
        assert s.behaviour.sleeping() and s.behaviour.wakes == 0
        s.behaviour.health_status = 503
        assert status(s.url + "/health", None, str(key)) == "503"  # loading: /props is not asked
    assert status(s.url + "/health", None, str(key)) == "none"

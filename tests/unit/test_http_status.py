"""llamarack/remote/http_status.py: the health status the audit reports, asked over the
interpreter's own socket module, run as the host runs it (``python3 -I -S -c SOURCE URL``)."""

import http.server
import socket
import subprocess
import sys
import threading

import pytest

from llamarack import remote
from llamarack.remote.http_status import _split


class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
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


def status(url: str) -> str:
    r = subprocess.run([sys.executable, "-I", "-S", "-c", remote.source("http_status"), url], capture_output=True,
                       text=True, timeout=60)  # fmt: skip
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


def test_only_a_plain_http_url_is_split_by_hand():
    assert _split("http://127.0.0.1:8080/health") == ("127.0.0.1", 8080, "127.0.0.1:8080", "/health")
    assert _split("http://gpu01") == ("gpu01", 80, "gpu01", "/")
    assert _split("http://[::1]/h?x=1") == ("::1", 80, "[::1]", "/h?x=1")
    for other in ("https://gpu01/health", "http://user@gpu01/", "http://gpu01:port/", "http://gpu01?x", "ftp://a/",
                  "http://gpu01/a b", "http://gpu01/h\r\nX-Injected: 1"):
        assert _split(other) is None, other  # urllib.request's, as before

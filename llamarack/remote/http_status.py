# Runs on the host (standard library only, imports nothing from llamarack; run by llamarack.remote.command).
"""Print the HTTP status of a GET of URL, or "none" when nothing answers.

    python3 -c SOURCE URL

An http URL is asked over a plain socket (HTTP/1.0, the status line is all
that is read): urllib.request alone took a host 30 ms of CPU to import, more
than the rest of the audit's Python. https goes through urllib.request.
"""

import socket
import sys
from urllib.parse import urlsplit


def status(url: str, timeout: float = 5.0) -> str:
    u = urlsplit(url)
    if u.scheme != "http":
        import urllib.error
        import urllib.request

        try:
            with urllib.request.urlopen(url, timeout=timeout) as r:
                return str(r.status)
        except urllib.error.HTTPError as e:
            return str(e.code)
    path = (u.path or "/") + (f"?{u.query}" if u.query else "")
    with socket.create_connection((u.hostname, u.port or 80), timeout=timeout) as s:
        s.sendall(f"GET {path} HTTP/1.0\r\nHost: {u.netloc}\r\nConnection: close\r\n\r\n".encode())
        line = s.makefile("rb").readline(1024).split()
    if len(line) >= 2 and line[0].startswith(b"HTTP/") and line[1].isdigit():
        return line[1].decode()
    return "none"


if __name__ == "__main__":
    try:
        print(status(sys.argv[1]))
    except Exception:
        print("none")

# Runs on the host (standard library only, imports nothing from llamarack; run by llamarack.remote.command).
"""Print the HTTP status of a GET of URL, or "none" when nothing answers.

    python3 -c SOURCE URL

An http URL is asked over a plain socket (HTTP/1.0, the status line is all
that is read), with the interpreter's own ``_socket`` and the URL split by
hand: urllib.request took a host 30 ms of CPU to import, and socket.py and
urllib.parse (its enums, ipaddress) 8 ms more of every audit's 60 ms of
Python. The URL is the server's health URL, made from validated settings
(``http://HOST:PORT/PATH``). https, or a URL of another shape, goes through
urllib.request.
"""

import sys


def _split(url: str):
    """(host, port, netloc, path) of a plain ``http://HOST[:PORT][/PATH]`` URL, else None:
    nothing that could end the request line early (a space, a control character)."""
    if not url.startswith("http://") or any(c <= " " or c == "\x7f" for c in url):
        return None
    netloc, slash, path = url[len("http://"):].partition("/")
    host, colon, port = netloc.rpartition(":") if not netloc.endswith("]") else (netloc, "", "")
    if not colon:
        host, port = netloc, "80"
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not host or not port.isdigit() or "@" in netloc or "?" in netloc or "#" in path:
        return None
    return host, int(port), netloc, slash + path if slash else "/"


def _get_status_line(host: str, port: int, request: bytes, timeout: float) -> bytes:
    import _socket

    error = None
    name = host.encode() if host.isascii() else host  # a str name is encoded with the idna codec: its import
    for family, kind, proto, _, address in _socket.getaddrinfo(name, port, 0, _socket.SOCK_STREAM):
        s = _socket.socket(family, kind, proto)
        try:
            s.settimeout(timeout)
            s.connect(address)
            s.sendall(request)
            data = b""
            while b"\n" not in data and len(data) < 1024:
                chunk = s.recv(1024)
                if not chunk:
                    break
                data += chunk
            return data.split(b"\n", 1)[0]
        except OSError as e:
            error = e
        finally:
            s.close()
    raise error or OSError(f"no address for {host}")


def status(url: str, timeout: float = 5.0) -> str:
    parts = _split(url)
    if parts is None:
        import urllib.error
        import urllib.request

        try:
            with urllib.request.urlopen(url, timeout=timeout) as r:
                return str(r.status)
        except urllib.error.HTTPError as e:
            return str(e.code)
    host, port, netloc, path = parts
    request = f"GET {path} HTTP/1.0\r\nHost: {netloc}\r\nConnection: close\r\n\r\n".encode()
    line = _get_status_line(host, port, request, timeout).split()
    if len(line) >= 2 and line[0].startswith(b"HTTP/") and line[1].isdigit():
        return line[1].decode()
    return "none"


if __name__ == "__main__":
    try:
        print(status(sys.argv[1]))
    except Exception:
        print("none")

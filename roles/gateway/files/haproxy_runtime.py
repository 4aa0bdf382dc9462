# Runs on the host (standard library only, imports nothing from llamarack; run by llamarack.remote.command).
"""Speak HAProxy's runtime API on its admin socket: the gateway's side of a rollout.

    python3 -c SOURCE [--socket PATH] [--backend NAME] set STATE SERVER...
    python3 -c SOURCE [--socket PATH] [--backend NAME] show [SERVER...]
    python3 -c SOURCE [--socket PATH] [--backend NAME] audit
    python3 -c SOURCE [--socket PATH] [--backend NAME] wait-empty SECONDS SERVER...
    python3 -c SOURCE [--socket PATH] [--backend NAME] wait-up SECONDS SERVER...

``set``: ``set server BACKEND/SERVER state STATE`` for each (STATE: ready, drain,
maint); a server HAProxy does not know is an error. ``show``: one JSON object,
{"servers": {NAME: {"status", "sessions", "weight", "admin", "check"}}}, from
``show stat`` (status as HAProxy's stats page words it: UP, DOWN, DRAIN,
MAINT, "no check"...; sessions: the streams now open to the server).
``audit``: the audit's read (``stat_servers`` less the sessions, or "none" when
nothing answers on the socket). ``wait-empty``: until no stream is open to any of the SERVERS (a drained
server's last requests have been answered). ``wait-up``: until each SERVER
is in service again (UP, or "no check": HAProxy checks nothing there).
Defaults: ``/run/haproxy/admin.sock``, backend ``llamarack``.
Exit 0: done; 1: HAProxy refused or the wait timed out (the message says
which); 2: the socket could not be reached.
"""

import csv
import io
import json
import socket
import sys
import time

SOCKET = "/run/haproxy/admin.sock"
BACKEND = "llamarack"
STATES = ("ready", "drain", "maint")
IN_SERVICE = ("UP", "no check")
# srv_admin_state: forced, inherited, config, resolution and hostname maintenance; forced and inherited drain.
MAINT_BITS = 0x01 | 0x02 | 0x04 | 0x20 | 0x40
DRAIN_BITS = 0x08 | 0x10


class Unreachable(Exception):
    pass


def ask(path: str, command: str, timeout: float = 10.0) -> str:
    """HAProxy's answer to one runtime command (the non-interactive mode: it closes the
    connection after answering)."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout)
            s.connect(path)
            s.sendall(command.encode() + b"\n")
            chunks = []
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                chunks.append(chunk)
    except OSError as e:
        raise Unreachable(f"HAProxy's admin socket {path}: {e}") from e
    return b"".join(chunks).decode(errors="replace")


def admin_states(path: str, backend: str) -> dict:
    """Each server's admin state (ready, drain, maint) from ``show servers state``: its
    srv_admin_state bits, which hold whatever the checks say (a drained server that is
    down shows as DOWN on the stats page)."""
    text = ask(path, f"show servers state {backend}")
    lines = text.splitlines()
    header = next((line[2:].split() for line in lines if line.startswith("# ")), None)
    if header is None:
        raise Unreachable(f"HAProxy answered 'show servers state' with: {text.strip()[:200]}")
    out = {}
    for line in lines:
        row = dict(zip(header, line.split()))
        if row.get("be_name") == backend and row.get("srv_admin_state", "").isdigit():
            bits = int(row["srv_admin_state"])
            out[row["srv_name"]] = "maint" if bits & MAINT_BITS else "drain" if bits & DRAIN_BITS else "ready"
    return out


def stat_servers(text: str, backend: str) -> dict:
    """Every server of ``backend`` in ``show stat``'s CSV (its first line names the fields):
    {name: {status, sessions, weight, check, address}}; status in HAProxy's own words (UP,
    DOWN, MAINT, DRAIN, NOLB; "UP 1/2" while a check moves it). ValueError: not that CSV."""
    if not text.startswith("# "):
        raise ValueError(f"not show stat's CSV: {text.strip()[:200]!r}")
    out = {}
    for row in csv.DictReader(io.StringIO(text[2:])):
        if row.get("pxname") != backend or row.get("svname") in ("FRONTEND", "BACKEND", None):
            continue
        weight = row.get("weight") or ""
        out[row["svname"]] = {
            "status": row.get("status") or "",
            "sessions": int(row.get("scur") or 0),
            "weight": int(weight) if weight.isdigit() else None,
            "check": (row.get("check_status") or "").lstrip("* "),  # "* L7TOUT": a check in progress
            "address": row.get("addr") or "",
        }
    return out


def servers(path: str, backend: str) -> dict:
    """Every server of ``backend``: ``stat_servers``' fields and its admin state, from
    ``show stat`` and ``show servers state``."""
    try:
        out = stat_servers(ask(path, "show stat"), backend)
    except ValueError as e:
        raise Unreachable(f"HAProxy answered 'show stat' with something else: {e}") from None
    admin = admin_states(path, backend)
    for name, server in out.items():
        server["admin"] = admin.get(name)
    return out


def audit(path: str, backend: str) -> str:
    """The audit's read: {"servers": {name: {status, check, weight, address}}} as JSON, or
    "none" when nothing answers on the admin socket."""
    try:
        text = ask(path, "show stat")
    except Unreachable:
        return "none"
    keep = ("status", "check", "weight", "address")
    found = {name: {k: s[k] for k in keep} for name, s in stat_servers(text, backend).items()}
    return json.dumps({"servers": found}, sort_keys=True)


def set_state(path: str, backend: str, state: str, names: list) -> list:
    """Set each server's admin state; the refusals, as HAProxy words them."""
    if state not in STATES:
        return [f"no state {state!r}: one of {', '.join(STATES)}"]
    refused = []
    for name in names:
        answer = ask(path, f"set server {backend}/{name} state {state}").strip()
        if answer:  # HAProxy answers a done "set server" with nothing
            refused.append(f"{backend}/{name}: {answer}")
    return refused


def wait(path: str, backend: str, seconds: float, names: list, done) -> list:
    """Poll ``show stat`` until ``done(server)`` holds for every named server; the ones
    for which it does not when ``seconds`` have passed (or that HAProxy does not know)."""
    deadline = time.monotonic() + seconds
    while True:
        seen = servers(path, backend)
        pending = [n for n in names if n not in seen or not done(seen[n])]
        if not pending or time.monotonic() >= deadline:
            return [f"{n}: {json.dumps(seen.get(n, 'no such server'))}" for n in pending]
        time.sleep(0.5)


def main(argv: list) -> int:
    path, backend = SOCKET, BACKEND
    while argv[:1] in (["--socket"], ["--backend"]):
        if argv[0] == "--socket":
            path = argv[1]
        else:
            backend = argv[1]
        argv = argv[2:]
    verb, args = (argv[0], argv[1:]) if argv else ("show", [])
    if verb == "audit":
        print(audit(path, backend))
        return 0
    if verb == "show":
        seen = servers(path, backend)
        print(json.dumps({"servers": {k: v for k, v in seen.items() if not args or k in args}}, sort_keys=True))
        return 0
    if verb == "set" and args:
        failed = set_state(path, backend, args[0], args[1:])
        what = f"set {args[0]}"
    elif verb in ("wait-empty", "wait-up") and args:
        done = (lambda s: s["sessions"] == 0) if verb == "wait-empty" else (lambda s: s["status"] in IN_SERVICE)
        failed = wait(path, backend, float(args[0]), args[1:], done)
        what = "no open stream" if verb == "wait-empty" else "in service"
    else:
        print(__doc__, file=sys.stderr)
        return 1
    for line in failed:
        print(f"not {what}: {line}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except Unreachable as e:
        print(e, file=sys.stderr)
        sys.exit(2)

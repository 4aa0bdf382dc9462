# Runs on the host (standard library only, imports nothing from llamarack; run by llamarack.remote.command).
"""Print the servers of one HAProxy backend as its runtime API shows them, as JSON, or
"none" when nothing answers on the admin socket.

    python3 -c SOURCE SOCKET BACKEND

Asks ``show stat`` (HAProxy's CSV, its first line naming the fields) and keeps each
server of BACKEND: its status in HAProxy's own words (UP, DOWN, MAINT, DRAIN, NOLB;
"UP 1/2" while a check moves it), its last check's status, its weight and address.
"""

import csv
import json
import socket
import sys


def ask(path: str, command: str, timeout: float = 10.0) -> str:
    """One command on HAProxy's runtime API: it answers and closes the connection."""
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
    return b"".join(chunks).decode(errors="replace")


def servers(stat_csv: str, backend: str) -> dict:
    """{server name: {status, check, weight, address}} of ``backend`` in ``show stat``'s CSV."""
    lines = stat_csv.splitlines()
    if not lines or not lines[0].startswith("# "):
        raise ValueError(f"not show stat's CSV: {stat_csv[:80]!r}")
    rows = csv.DictReader([lines[0][2:]] + [line for line in lines[1:] if line.strip()])
    found = {}
    for row in rows:
        if row.get("pxname") != backend or row.get("svname") in ("FRONTEND", "BACKEND"):
            continue
        weight = row.get("weight") or ""
        found[row["svname"]] = {
            "status": row.get("status") or "",
            "check": (row.get("check_status") or "").lstrip("* "),  # "* L7TOUT": a check in progress
            "weight": int(weight) if weight.isdigit() else None,
            "address": row.get("addr") or "",
        }
    return found


if __name__ == "__main__":
    try:
        answer = ask(sys.argv[1], "show stat")
    except OSError:
        print("none")
        sys.exit(0)
    print(json.dumps({"servers": servers(answer, sys.argv[2])}, sort_keys=True))

# Runs on the host (standard library only, imports nothing from llamarack; run by llamarack.remote.command).
"""The host's llama-server units, and whether every one of them is idle.

    python3 -c SOURCE units UNITS_JSON PORT LISTEN
    python3 -c SOURCE idle UNITS_JSON PORT LISTEN SECONDS [KEY_FILE]

UNITS_JSON: the server role's record of the host's units (``<root>/state/units.json``);
where it is absent, the host has one unit, ``llamarack-server.service``, on PORT
at LISTEN (the settings' ``server_port`` and ``server_listen``).

``units`` prints them, one JSON object: {"units": [{"index", "unit", "port",
"url"}]} (url: where the unit answers from this host).

``idle`` waits, at most SECONDS, until every unit is idle twice in a row, half a
second apart: its ``/metrics`` gauges ``llamacpp:requests_processing`` (its slots
that process a request) and ``llamacpp:requests_deferred`` are 0. /metrics is a
task of llama-server's main loop, answered once the loop takes it (as /slots is),
that neither wakes a sleeping server (``--sleep-idle-seconds``) nor starts its
idle time again: asleep, it answers the figures cached as it fell asleep, 0 and
0 (server-context.cpp). /slots would wake it. A unit started without
``--metrics`` answers 501 there: every entry of its ``/slots`` then says, with
``is_processing``. Whatever else a unit answers (no answer within 5 s, an error
status, a body that is not what llama-server sends: /health stays 200 while the
main loop hangs) is "cannot tell", which counts as busy. KEY_FILE: the server's
API key file (its first line), sent as a bearer token: /metrics and /slots ask
for it when the server has one. A unit
systemd has loaded and not running (inactive or failed: a server stopped, or one
that died) has no process and nothing in flight: idle, without asking it.
Prints {"idle": bool, "units": [{"index", "port", "busy": why or null}]}.
Exit 0: idle; 1: still busy after SECONDS.
"""

import json
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request

UNIT = "llamarack-server.service"
UNIT_NAME = re.compile(r"llamarack-server(@[0-9]+)?\.service")
ASK_TIMEOUT = 5.0
GAUGE = r"^llamacpp:{}(?:\{{[^}}]*\}})?\s+(\S+)\s*$"
BUSY_GAUGES = {"requests_processing": "requests processing", "requests_deferred": "requests deferred"}


def address(listen: str) -> str:
    """Where a unit listening on ``listen`` answers from its own host."""
    host = "127.0.0.1" if listen in ("0.0.0.0", "") else "::1" if listen == "::" else listen
    return f"[{host}]" if ":" in host else host


def units(path: str, port: str, listen: str) -> list:
    """The units of the record at ``path``, or the one unit of the settings without it."""
    try:
        with open(path) as f:
            record = json.load(f)
    except FileNotFoundError:
        record = {"units": [{"index": 0, "unit": UNIT, "port": int(port), "listen": listen}]}
    out = []
    for u in record.get("units") or ():
        if not UNIT_NAME.fullmatch(str(u.get("unit"))) or not isinstance(u.get("port"), int):
            raise ValueError(f"{path}: not a llamarack unit: {json.dumps(u)[:200]}")
        where = address(str(u.get("listen") or listen))
        out.append({"index": int(u.get("index", 0)), "unit": u["unit"], "port": u["port"],
                    "url": f"http://{where}:{u['port']}"})
    return out


def key(path: str) -> str:
    try:
        with open(path) as f:
            return f.readline().strip()
    except OSError:
        return ""


def get(url: str, token: str):
    """(status, body) of a GET; status None when nothing answered in time."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with opener.open(request, timeout=ASK_TIMEOUT) as r:
            return r.status, r.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, ""
    except Exception:
        return None, ""


def busy(base: str, token: str):
    """Why the unit at ``base`` is busy (or cannot tell), or None when it is idle: its
    /metrics (its /slots where it has none)."""
    status, body = get(base + "/metrics", token)
    if status == 501:  # started without --metrics
        return slots_busy(base, token)
    if status != 200:
        return f"/metrics answered {status or 'nothing'}: cannot tell"
    for gauge, what in BUSY_GAUGES.items():
        found = re.findall(GAUGE.format(re.escape(gauge)), body, re.M)
        try:
            value = float(found[-1])
        except (IndexError, ValueError):
            return f"/metrics has no number llamacpp:{gauge}: cannot tell"
        if value:
            return f"{value:g} {what}"
    return None


def slots_busy(base: str, token: str):
    """Why a unit without /metrics is busy (or cannot tell), or None: a slot of its /slots processes."""
    status, body = get(base + "/slots", token)
    if status != 200:
        return f"/slots answered {status or 'nothing'}: cannot tell"
    try:
        slots = json.loads(body)
        processing = [s["id"] for s in slots if s["is_processing"] is not False]
    except (ValueError, TypeError, KeyError):
        return "/slots is not llama-server's list of slots: cannot tell"
    if not slots:
        return "/slots lists no slot: cannot tell"
    return f"slots {', '.join(map(str, processing))} processing" if processing else None


def stopped(unit: str) -> bool:
    """Whether systemd has ``unit`` loaded and not running (no process: nothing in flight).
    Anything else (running, starting, unknown to systemd, no systemctl) says nothing."""
    try:
        out = subprocess.run(["systemctl", "show", "-p", "LoadState", "-p", "ActiveState", unit],
                             capture_output=True, text=True, timeout=10).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return False
    state = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    return state.get("LoadState") == "loaded" and state.get("ActiveState") in ("inactive", "failed")


def wait_idle(listed: list, seconds: float, token: str) -> dict:
    """Poll every unit until all are idle on two polls in a row, or ``seconds`` pass."""
    deadline = time.monotonic() + seconds
    quiet = 0
    while True:
        why = {u["index"]: None if stopped(u["unit"]) else busy(u["url"], token) for u in listed}
        quiet = quiet + 1 if not any(why.values()) else 0
        if quiet >= 2 or time.monotonic() >= deadline:
            return {"idle": quiet >= 2,
                    "units": [{"index": u["index"], "port": u["port"], "busy": why[u["index"]]} for u in listed]}
        time.sleep(0.5)


def main(argv: list) -> int:
    verb, path, port, listen = argv[:4]
    listed = units(path, port, listen)
    if verb == "units":
        print(json.dumps({"units": listed}))
        return 0
    seconds = float(argv[4])
    result = wait_idle(listed, seconds, key(argv[5]) if len(argv) > 5 and argv[5] else "")
    print(json.dumps(result))
    return 0 if result["idle"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

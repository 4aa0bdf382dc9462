"""The served unit on a real systemd: its sandbox rated OK, llama-server still serving in it, and a
stop with a request open bounded by the unit.

Runs after a deploy of the lab rack (``test_demo_rack.py`` makes one; here
one host is deployed again, which changes nothing once converged). Needs
the lab: ``pytest -m lab tests/lab/test_unit_sandbox.py``.
"""

import json
import re
import shlex
import urllib.request

import pytest

from tests.lab import deploying

pytestmark = pytest.mark.lab

HOST = "lab-v100-a"
UNIT = "llamarack-server.service"


def test_the_hardened_unit_rates_ok_and_serves(lab_rack):
    rc, out = deploying.deploy(lab_rack, HOST)
    assert rc == 0, out[-6000:]
    ip = next(h.ip for h in lab_rack.hosts if h.name == HOST)
    # The host's own systemd rates the running unit, not only the file.
    rating = deploying.sh(lab_rack, HOST, f"systemd-analyze security --no-pager {UNIT} | tail -n 1")
    assert float(re.search(r"(\d+\.\d+)", rating).group(1)) <= 2.0, rating
    props = deploying.sh(lab_rack, HOST, f"systemctl show -p ActiveState -p NRestarts -p User -p DevicePolicy {UNIT}")
    assert {"ActiveState=active", "NRestarts=0", "User=llamarack", "DevicePolicy=closed"} <= set(props.split()), props
    request = urllib.request.Request(f"http://{ip}:8080/completion",
                                     data=json.dumps({"prompt": "hello", "n_predict": 8}).encode(),
                                     headers={"Content-Type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(request, timeout=60) as r:
        assert json.loads(r.read())["tokens_predicted"] == 8
    # Nothing but the kernel cache is writable to it; the journal has no sandbox denial.
    journal = deploying.sh(lab_rack, HOST, f"journalctl -u {UNIT} -b --no-pager -o cat | tail -n 200")
    assert not re.search(r"Operation not permitted|Permission denied|Read-only file system|status=(226|31)/", journal), journal


def test_a_stop_with_a_request_open_ends_at_the_units_bound(lab_rack):
    """llama-server stops computing on SIGTERM but, with a request streaming, mostly does not exit:
    the unit's ``TimeoutStopSec=10`` ends the stop, where systemd's default would hold it 90 s."""
    rc, out = deploying.deploy(lab_rack, HOST)
    assert rc == 0, out[-6000:]
    props = deploying.sh(lab_rack, HOST, f"systemctl show -p TimeoutStopUSec -p ExecStart {shlex.quote(UNIT)}")
    assert "TimeoutStopUSec=10s" in props.splitlines(), props
    ctx = int(re.search(r"--ctx-size (\d+)", props)[1])
    body = json.dumps({"prompt": "hello", "n_predict": ctx - 16, "ignore_eos": True, "stream": True})
    url, unit = "http://127.0.0.1:8080", shlex.quote(UNIT)
    # On the host, so no SSH round trip lets the request end first (the tiny model answers a
    # whole context in about a second): the stop once the first tokens have streamed.
    stop = (f"since=$(date '+%F %T'); rm -f /tmp/stream; curl -sN {shlex.quote(url + '/completion')} "
            f"-d {shlex.quote(body)} >/tmp/stream 2>&1 & "
            "for i in $(seq 400); do [ -s /tmp/stream ] && break; sleep 0.01; done; "
            f"s=$(date +%s%N); systemctl stop {unit}; echo $(( ($(date +%s%N) - s) / 1000000 )); "
            f"journalctl -u {unit} --since \"$since\" --no-pager -o cat | grep -c 'timed out. Killing' || true")  # fmt: skip
    start = (f"systemctl start {unit} && for i in $(seq 240); do "
             f"curl -sf -o /dev/null {shlex.quote(url + '/health')} && break; sleep 0.5; done")  # fmt: skip
    stops = []
    for _ in range(3):  # llama-server exits by itself now and then; the bound is seen when it does not
        # The stop's milliseconds, then how often the journal says the bound ended it.
        stopped_ms, kills = (int(x) for x in deploying.sh(lab_rack, HOST, stop, timeout=120).split()[-2:])
        deploying.sh(lab_rack, HOST, start, timeout=300)  # back as the deploy left it
        stops.append((stopped_ms, kills > 0))
        if stops[-1][1]:
            break
    assert stops[-1][1], f"llama-server exited by itself at every stop: {stops}"
    assert stops[-1][0] < 20000, f"the stop took {stops[-1][0]} ms"
    deploying.completes(lab_rack, HOST)

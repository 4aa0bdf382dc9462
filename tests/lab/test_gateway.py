"""The rack as one endpoint: the demo deploy puts HAProxy on lab-gw (group ``gateways``) in
front of the four serving hosts. /completion and the OpenAI API answer through lab-gw:8000,
the audit's gateway item lists the four backends UP, and a second deploy changes nothing."""

import json
import subprocess
import sys
import time
import urllib.request

import pytest

from llamarack_lab.pytest_plugin import parse_pyinfra_totals
from tests.lab import deploying

pytestmark = pytest.mark.lab

GATEWAY = "lab-gw"
BACKENDS = {"lab-v100-a_0", "lab-v100-b_0", "lab-v100-32_0", "lab-t4_0"}
# The gateway's own state: its config, the target list, HAProxy's process and packages.
GATEWAY_STATE = ("sha256sum /etc/haproxy/haproxy.cfg /etc/llamarack/prometheus/targets.json; "
                 "stat -c '%a %U %G' /etc/haproxy/haproxy.cfg; dpkg --get-selections | sha256sum; "
                 "systemctl show -p MainPID -p NRestarts haproxy.service")  # fmt: skip


def deploy(lab_rack):
    return lab_rack.run_pyinfra(deploying.ROOT / "deploy.py", inventory=deploying.ROOT / "inventory/lab.py",
                                timeout=3600)  # fmt: skip


def post(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as r:
        return json.loads(r.read())


def gateway_item(*args: str) -> tuple[int, dict]:
    r = subprocess.run([sys.executable, "-m", "llamarack", "audit", str(deploying.ROOT / "inventory/lab.py"),
                        "--limit", GATEWAY, "--json", *args], cwd=deploying.ROOT, capture_output=True, text=True,
                       timeout=300)  # fmt: skip
    return r.returncode, json.loads(r.stdout)["hosts"][GATEWAY]


def all_up(timeout: float = 60) -> dict:
    """The gateway's audit item once every backend is UP (HAProxy's checks: 2 s apart, 2 to rise)."""
    deadline = time.monotonic() + timeout
    while True:
        rc, seen = gateway_item()
        if rc == 0 or time.monotonic() > deadline:
            return seen
        time.sleep(2)


def test_the_rack_answers_through_the_gateway(lab_rack):
    rc, out = deploy(lab_rack)
    assert rc == 0, out[-6000:]
    ip = lab_rack.rack.host(GATEWAY)["ip"]
    assert f"the rack: http://{ip}:8000/v1/chat/completions" in out
    all_up()
    answer = post(f"http://{ip}:8000/completion", {"prompt": "hello", "n_predict": 4})
    assert answer["tokens_predicted"] == 4 and answer["content"], answer
    chat = post(f"http://{ip}:8000/v1/chat/completions",
                {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 4})  # fmt: skip
    assert chat["choices"][0]["message"]["content"] and chat["usage"]["completion_tokens"] == 4, chat
    for i in range(8):
        post(f"http://{ip}:8000/completion", {"prompt": f"hello from conversation {i}", "n_predict": 2})
    # conversation affinity (the default) spreads conversations of different openings over the units
    served = deploying.sh(lab_rack, GATEWAY, "echo 'show stat' | python3 -c \"import socket,sys; "
                          "s=socket.socket(socket.AF_UNIX); s.connect('/run/haproxy/admin.sock'); "
                          "s.sendall(sys.stdin.read().encode()); print(s.makefile().read())\"")  # fmt: skip
    totals = {row.split(",")[1]: int(row.split(",")[7]) for row in served.splitlines()
              if row.startswith("llamarack,") and row.split(",")[1] in BACKENDS}  # fmt: skip
    assert set(totals) == BACKENDS and sum(1 for n in totals.values() if n > 0) >= 2, totals


def test_the_audit_lists_the_four_backends_up(lab_rack):
    seen = all_up()
    item = seen["items"]["gateway"]
    assert seen["drift"] == [] and seen["error"] is None, seen
    assert item["found"] == {"backends": dict.fromkeys(BACKENDS, "UP")}, item
    assert item["wanted"] == item["found"] and item["drift"] is False


def test_a_second_deploy_changes_nothing(lab_rack):
    before = deploying.sh(lab_rack, GATEWAY, GATEWAY_STATE)
    rc, out = deploy(lab_rack)
    assert rc == 0, out[-6000:]
    totals = parse_pyinfra_totals(out)
    assert totals["success"] == 0 and totals["error"] == 0, out[-6000:]
    assert f"[{GATEWAY}]" in out
    assert deploying.sh(lab_rack, GATEWAY, GATEWAY_STATE) == before

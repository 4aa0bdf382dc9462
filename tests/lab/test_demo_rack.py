"""The README's demo as a test: the whole rack deployed, every host serving its model.

    pyinfra -y inventory/lab.py deploy.py

Every host builds llama.cpp (the first compiles, the rest hit the shared
ccache), proves the build by a smoke run before switching it in, fetches
and quantizes the model, and serves it under systemd. Then each host's
served model must answer /completion from this machine, and a second run
must change nothing.
"""

import json
import urllib.request

import pytest

from llamarack.lab.pytest_plugin import parse_pyinfra_totals
from tests.lab import deploying

pytestmark = pytest.mark.lab


def demo(lab_rack):
    return lab_rack.run_pyinfra(deploying.ROOT / "deploy.py", inventory=deploying.ROOT / "inventory/lab.py",
                                timeout=3600)  # fmt: skip


def completion(ip: str, tokens: int) -> dict:
    request = urllib.request.Request(f"http://{ip}:8080/completion",
                                     data=json.dumps({"prompt": "hello", "n_predict": tokens}).encode(),
                                     headers={"Content-Type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(request, timeout=60) as r:
        return json.loads(r.read())


def test_demo_deploy_serves_on_every_host(lab_rack):
    rc, out = demo(lab_rack)
    assert rc == 0, out[-6000:]
    for host in lab_rack.hosts:
        assert f"[{host.name}]" in out and f"serving: http://{host.ip}:8080/v1/chat/completions" in out
        answer = completion(host.ip, 16)
        assert answer["tokens_predicted"] == 16 and answer["content"], (host.name, answer)
        # The build that serves computed before it was switched in, on this host's CPU.
        proof = json.loads(deploying.sh(lab_rack, host.name, "cat /opt/llamarack/builds/current/build-info.json"))["proof"]
        assert proof["attempts"][-1]["ok"] and proof["tokens"] == 8, (host.name, proof)


def test_demo_second_run_changes_nothing(lab_rack):
    rc, out = demo(lab_rack)
    assert rc == 0, out[-6000:]
    totals = parse_pyinfra_totals(out)
    assert totals["success"] == 0 and totals["error"] == 0, out[-6000:]

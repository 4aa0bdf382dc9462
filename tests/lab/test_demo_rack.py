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


def test_an_api_key_uploaded_under_sudo_is_never_readable_by_others(lab_rack, tmp_path):
    # lab-t4 is reached as the 'deploy' user with sudo (inventory/lab.py).
    key = "sk-lab-sudo-" + tmp_path.name
    key_file = tmp_path / "api-key"
    key_file.write_text(key + "\n")
    key_file.chmod(0o600)  # read_token refuses a secret others may read
    # Meanwhile on the host, as a user who is neither root nor the SSH user: any
    # file under /tmp it can read that holds the key (pyinfra's own temporary
    # upload file, mode 644 in /tmp, would be one).
    watcher = ("nohup runuser -u nobody -- sh -c 'end=$(($(date +%s)+120)); while [ $(date +%s) -lt $end ]; do "
               f"grep -rls {key} /tmp 2>/dev/null; done' >> /root/key-watch.log 2>/dev/null & "
               "echo $! > /root/key-watch.pid")  # fmt: skip
    deploying.sh(lab_rack, "lab-t4", f"rm -f /root/key-watch.log; touch /root/key-watch.log; {watcher}")
    rc, out = lab_rack.run_pyinfra(deploying.ROOT / "deploy.py", "--limit", "lab-t4",
                                   "--data", f"server_api_key_file={key_file}", "--data", "llamarack_roles=server",
                                   inventory=deploying.ROOT / "inventory/lab.py")  # fmt: skip
    assert rc == 0, out[-4000:]
    assert key not in out
    assert deploying.sh(lab_rack, "lab-t4", "stat -c '%a %U %G' /etc/llamarack/server-api-key") == "640 root llamarack"
    assert deploying.sh(lab_rack, "lab-t4", "cat /etc/llamarack/server-api-key") == key
    deploying.sh(lab_rack, "lab-t4", "kill $(cat /root/key-watch.pid) || true")
    seen = deploying.sh(lab_rack, "lab-t4", "sort -u /root/key-watch.log")
    assert seen == "", seen
    assert deploying.sh(lab_rack, "lab-t4", f"grep -rls {key} /tmp /var/tmp /home || true") == ""
    request = urllib.request.Request("http://10.77.0.14:8080/v1/models", headers={"Authorization": f"Bearer {key}"})
    with urllib.request.urlopen(request, timeout=30) as r:
        assert r.status == 200
    # Unset again: the key file goes, the rack is back as the demo left it.
    rc, out = lab_rack.run_pyinfra(deploying.ROOT / "deploy.py", "--limit", "lab-t4", "--data", "llamarack_roles=server",
                                   inventory=deploying.ROOT / "inventory/lab.py")  # fmt: skip
    assert rc == 0, out[-4000:]
    assert deploying.sh(lab_rack, "lab-t4", "test -e /etc/llamarack/server-api-key || echo gone") == "gone"

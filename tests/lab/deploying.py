"""Running the project's deploy.py against lab hosts, as a user would."""

import json
import subprocess
import sys
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def deploy(lab_rack, hosts: str, *data: str, timeout: float = 3600, checkout: Path = ROOT):
    """``pyinfra -y inventory/lab.py deploy.py --limit H ... --data K=V ...``: (returncode, output).

    + hosts: one host name, or several separated by commas
    + data: ``key=value`` overrides, as on pyinfra's command line
    + checkout: the llamarack tree whose deploy.py and inventory run (another version of
      it: the caller puts it first on PYTHONPATH too)
    """
    args = [word for host in hosts.split(",") for word in ("--limit", host)]
    for item in data:
        args += ["--data", item]
    return lab_rack.run_pyinfra(checkout / "deploy.py", *args, inventory=checkout / "inventory/lab.py",
                                timeout=timeout)


def sh(lab_rack, host: str, command: str, timeout: float = 300) -> str:
    """Run ``command`` on ``host`` over SSH; its stdout, stripped. A failure fails the test."""
    result = lab_rack.ssh(host, command, timeout=timeout)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout.strip()


# A host's real state, as a converged run must leave it: every file under the root, the
# config and the units by path, size, mtime, mode and owner (the small ones by content
# too), the package selections and holds, and each server's process and restarts.
STATE = ("find /opt/llamarack /etc/llamarack /etc/systemd/system -xdev -path '/etc/systemd/system/*' "
         "! -name 'llamarack-server*' -prune -o -printf '%p %s %T@ %m %u %g\\n' 2>/dev/null | sort | sha256sum; "
         "sha256sum /etc/systemd/system/llamarack-server*.service /etc/llamarack/* 2>/dev/null; "
         "dpkg --get-selections | sha256sum; apt-mark showhold; "
         "for u in /etc/systemd/system/llamarack-server*.service; do "
         "systemctl show -p Id -p MainPID -p NRestarts \"${u##*/}\"; done")


def state(lab_rack, host: str) -> str:
    """``host``'s state (``STATE``): what "nothing changed" is checked against, beside
    pyinfra's own count of changed operations."""
    return sh(lab_rack, host, STATE)


def converges(lab_rack, host: str, *data: str) -> str:
    """A deploy of ``host`` that changes nothing: none by pyinfra's count, and the host's real
    state (``STATE``) the same after it as before. Its output."""
    from llamarack_lab.pytest_plugin import parse_pyinfra_totals

    before = state(lab_rack, host)
    rc, out = deploy(lab_rack, host, *data)
    assert rc == 0 and parse_pyinfra_totals(out)["success"] == 0, out[-6000:]
    assert state(lab_rack, host) == before, f"{host}: its state changed on a run that counted no change"
    return out


def audit_json(host: str, *args: str) -> dict:
    """``llamarack audit inventory/lab.py --json --limit HOST ARGS...``: the host's part."""
    r = subprocess.run([sys.executable, "-m", "llamarack", "audit", str(ROOT / "inventory/lab.py"), "--json",
                        "--limit", host, *args], cwd=ROOT, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert r.stdout.strip().startswith("{"), r.stderr[-3000:]
    return json.loads(r.stdout)["hosts"][host]


def completes(lab_rack, host: str, port: int = 8080) -> None:
    """``host``'s llama-server on ``port`` answers a real /completion of 4 tokens."""
    ip = lab_rack.rack.host(host)["ip"]
    request = urllib.request.Request(f"http://{ip}:{port}/completion", headers={"Content-Type": "application/json"},
                                     data=json.dumps({"prompt": "hello", "n_predict": 4}).encode())  # fmt: skip
    with urllib.request.urlopen(request, timeout=60) as r:
        assert json.loads(r.read())["tokens_predicted"] == 4

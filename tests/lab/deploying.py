"""Running the project's deploy.py against lab hosts, as a user would."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def deploy(lab_rack, hosts: str, *data: str, timeout: float = 3600):
    """``pyinfra -y inventory/lab.py deploy.py --limit H ... --data K=V ...``: (returncode, output).

    + hosts: one host name, or several separated by commas
    + data: ``key=value`` overrides, as on pyinfra's command line
    """
    args = [word for host in hosts.split(",") for word in ("--limit", host)]
    for item in data:
        args += ["--data", item]
    return lab_rack.run_pyinfra(ROOT / "deploy.py", *args, inventory=ROOT / "inventory/lab.py", timeout=timeout)


def sh(lab_rack, host: str, command: str, timeout: float = 300) -> str:
    """Run ``command`` on ``host`` over SSH; its stdout, stripped. A failure fails the test."""
    result = lab_rack.ssh(host, command, timeout=timeout)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout.strip()

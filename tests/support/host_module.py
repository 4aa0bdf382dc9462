"""Run a host module as the hosts run it (``llamarack.remote.command``: ``python3 -c SOURCE``), here."""

import subprocess

from llamarack import remote


def host_run(script: str, *args: str, ok: bool = True) -> subprocess.CompletedProcess:
    """Host module ``script`` with ``args``; it must succeed, or with ``ok=False`` fail."""
    r = subprocess.run(["sh", "-c", remote.command(script, *args)], capture_output=True, text=True, timeout=60)
    assert (r.returncode == 0) == ok, r.stderr
    return r

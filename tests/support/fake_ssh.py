"""An ``ssh`` on PATH for the audit's unit tests: it logs each command line and answers
as told (the audit reaches hosts with the system's ssh, ``llamarack/openssh.py``)."""

import sys


def fake_ssh(tmp_path, monkeypatch, answer: str):
    """Put an ``ssh`` first on PATH that appends its arguments to the returned log file,
    then runs the shell text ``answer`` with the audit's script on its stdin."""
    log = tmp_path / "ssh.log"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ssh").write_text(f'#!/bin/sh\necho "$*" >> {log}\n{answer}\n')
    (bin_dir / "ssh").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{sys.prefix}/bin:/usr/bin:/bin")
    return log

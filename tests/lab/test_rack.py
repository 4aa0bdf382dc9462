"""End-to-end tests on the default lab rack (real hosts, real SSH, pyinfra).

These need root and the lab's tools; when the rack cannot start they fail
(the lab_rack fixture says why), they do not skip."""

import http.server
import re
import shlex
import threading
from pathlib import Path

import pytest

from llamarack_lab import GATEWAY, GUEST_CCACHE_DIR, paths
from llamarack_lab.fake_nvidia.deb import DEFAULT_VERSION
from llamarack_lab.profiles import PROFILES
from llamarack_lab.pytest_plugin import parse_pyinfra_totals

pytestmark = pytest.mark.lab
DEPLOYS = Path(__file__).parent / "deploys"

# What "the host did not change" means: files (mtime, mode, owner, size,
# content) under /etc /opt /usr/local, packages, units. The host's own timers
# start units at any time (systemd-tmpfiles-clean 15 minutes after boot), so a
# unit caught between states (ACTIVE activating, deactivating, reloading...) is
# left out, a timer's SUB (waiting, or running while its unit runs) too, and so
# is every inactive unit: systemd loads one when something refers to it (a timer
# firing) and unloads it when nothing does, so it comes and goes from the list
# by itself (a unit a run stopped still shows: its active line is gone). Each
# unit is printed without systemctl's padding, whose width follows the longest
# state of the moment.
SNAPSHOT = r"""
find /etc /opt /usr/local -xdev -printf '%p %y %m %U:%G %T@ %s %l\n' | sort
find /etc /opt /usr/local -xdev -type f -exec md5sum {} + | sort -k2
dpkg -l | sort
systemctl list-units --all --no-legend --plain |
  awk '$3 ~ /^(active|failed)$/ && $1 !~ /^run-credentials-/ {print $1, $2, $3, ($1 ~ /[.]timer$/ ? "" : $4)}' | sort
systemctl list-unit-files --no-legend | sort
"""


def host_snapshot(lab, host):
    r = lab.ssh(host, SNAPSHOT)
    assert r.returncode == 0, r.stderr
    return r.stdout


def smi_query(lab, host, fields="name,memory.total,compute_cap,driver_version"):
    return lab.ssh(host, f"nvidia-smi --query-gpu={fields} --format=csv,noheader")


def test_hosts_booted_with_systemd(lab_rack):
    problems = {}
    for h in lab_rack.hosts:
        r = lab_rack.ssh(h.name, "hostname; systemctl is-system-running; "
                                 "systemctl --failed --no-legend --plain")
        lines = r.stdout.splitlines()
        assert lines[0] == h.name
        if lines[1] not in ("running", "degraded") or lines[2:]:
            problems[h.name] = lines[1:]
    assert not problems, f"hosts not running cleanly (state, failed units): {problems}"


def test_hosts_have_own_uptime_and_shared_ccache(lab_rack):
    a, b = lab_rack.hosts[0].name, lab_rack.hosts[1].name
    up = float(lab_rack.ssh(a, "cut -d' ' -f1 /proc/uptime").stdout)
    assert up < float(Path("/proc/uptime").read_text().split()[0])
    assert lab_rack.ssh(a, f"echo shared > {shlex.quote(GUEST_CCACHE_DIR + '/.lab-test')}").returncode == 0
    try:
        assert lab_rack.ssh(b, f"cat {shlex.quote(GUEST_CCACHE_DIR + '/.lab-test')}").stdout == "shared\n"
        assert (paths.CCACHE_DIR / ".lab-test").read_text() == "shared\n"
    finally:
        (paths.CCACHE_DIR / ".lab-test").unlink(missing_ok=True)


def test_network_reaches_machine_and_registries_only(lab_rack):
    class Hello(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"hello from the machine")

        def log_message(self, *a):
            pass

    srv = http.server.HTTPServer((GATEWAY, 0), Hello)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        host = lab_rack.hosts[-1].name
        r = lab_rack.ssh(host, f"curl -sS -m 5 http://{GATEWAY}:{srv.server_port}/")
        assert r.stdout == "hello from the machine", r.stderr
    finally:
        srv.shutdown()
    r = lab_rack.ssh(host, "curl -sS -m 10 -o /dev/null -w '%{http_code}' "
                           "http://deb.debian.org/debian/dists/bookworm/InRelease")
    assert r.stdout == "200", r.stderr
    r = lab_rack.ssh(host, "curl -sS -m 10 -o /dev/null -w '%{http_code}' https://pypi.org/simple/pip/")
    assert r.stdout == "200", r.stderr
    # not a registry: dropped by the lab's FORWARD rules
    assert lab_rack.ssh(host, "curl -sS -m 3 -o /dev/null http://192.0.2.1/").returncode != 0


def test_trivial_deploy_converges_and_second_run_changes_nothing(lab_rack):
    rc, out = lab_rack.run_pyinfra(DEPLOYS / "trivial.py")
    assert rc == 0, out
    first = parse_pyinfra_totals(out)
    assert first["error"] == 0, out
    before = {h.name: host_snapshot(lab_rack, h.name) for h in lab_rack.hosts}
    rc, out = lab_rack.run_pyinfra(DEPLOYS / "trivial.py")
    assert rc == 0, out
    second = parse_pyinfra_totals(out)
    assert second["success"] == 0 and second["error"] == 0, out
    assert second["no_change"] == first["success"] + first["no_change"]
    for h in lab_rack.hosts:
        after = host_snapshot(lab_rack, h.name)
        assert after == before[h.name], f"{h.name} changed on a converged run"
        assert lab_rack.ssh(h.name, "systemctl is-active lab-hello").stdout == "active\n"


def test_fake_nvidia_smi_reports_the_profile(lab_rack):
    for h in lab_rack.hosts:
        gpus = PROFILES[h.profile].gpus
        r = smi_query(lab_rack, h.name)
        if not gpus:
            assert r.returncode == 127
            continue
        g = gpus[0]
        assert (r.returncode, r.stdout) == (
            0, f"{g.name}, {g.memory_mib} MiB, {g.compute_cap}, {DEFAULT_VERSION}\n")
        table = lab_rack.ssh(h.name, "nvidia-smi").stdout
        assert f"Driver Version: {DEFAULT_VERSION}" in table and "CUDA Version: 12.4" in table


def test_driver_states(lab_rack):
    host = next(h.name for h in lab_rack.hosts if h.profile == "t4")
    try:
        lab_rack.driver(host, state="no-module")
        r = smi_query(lab_rack, host)
        assert r.returncode == 9
        assert r.stdout.startswith("NVIDIA-SMI has failed because it couldn't communicate")

        lab_rack.driver(host, state="missing")
        r = lab_rack.ssh(host, "nvidia-smi")
        assert r.returncode == 127 and "not found" in r.stderr
        assert lab_rack.ssh(host, "dpkg -s nvidia-driver").returncode != 0

        lab_rack.driver(host, state="ok")
        assert smi_query(lab_rack, host, "driver_version").stdout == f"{DEFAULT_VERSION}\n"
    finally:
        lab_rack.driver(host, state="ok")


def test_driver_upgrade_mismatch_until_reboot(lab_rack):
    host = lab_rack.hosts[1].name
    new = "570.124.06"
    try:
        out = lab_rack.driver(host, version=new)
        assert f"package {new}, loaded module {DEFAULT_VERSION}" in out
        r = smi_query(lab_rack, host)
        assert (r.returncode, r.stdout) == (
            18, "Failed to initialize NVML: Driver/library version mismatch\n"
                "NVML library version: 570.124\n")
        assert DEFAULT_VERSION in lab_rack.ssh(host, "cat /proc/driver/nvidia/version").stdout

        rc, out = lab_rack.run_pyinfra(DEPLOYS / "reboot.py", "--limit", host)
        assert rc == 0, out
        assert parse_pyinfra_totals(out)["success"] == 1, out

        r = smi_query(lab_rack, host, "driver_version")
        assert (r.returncode, r.stdout) == (0, f"{new}\n")
        procver = lab_rack.ssh(host, "cat /proc/driver/nvidia/version").stdout
        assert re.match(rf"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {re.escape(new)}  ",
                        procver)
        # the rest of the host survived the reboot
        assert lab_rack.ssh(host, "systemctl is-system-running --wait").stdout.strip() in (
            "running", "degraded")
    finally:
        lab_rack.driver(host, version=DEFAULT_VERSION, state="ok")

"""roles/server/files/server_idle.py and completion_probe.py, run as a host runs them
(``python3 -c SOURCE ...``) against a local server answering in llama-server's formats."""

import json
import subprocess
import sys
import threading
import time
import urllib.request

from llamarack import remote
from tests.support.fake_llama_server import Behaviour, FakeLlamaServer


def run(name: str, *args: str, timeout: float = 60, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-I", "-S", "-c", remote.source(name), *args], capture_output=True,
                          text=True, timeout=timeout, env=env)  # fmt: skip


def idle(units_json, port, seconds="3", *key, env=None) -> tuple[int, dict]:
    r = run("server_idle", "idle", str(units_json), str(port), "0.0.0.0", seconds, *key, env=env)
    return r.returncode, json.loads(r.stdout)


def test_without_a_record_the_host_has_one_unit_at_the_settings_port(tmp_path):
    r = run("server_idle", "units", str(tmp_path / "units.json"), "8080", "::")
    assert json.loads(r.stdout) == {"units": [{"index": 0, "unit": "llamarack-server.service", "port": 8080,
                                               "url": "http://[::1]:8080"}]}


def test_the_units_of_the_record(tmp_path):
    record = tmp_path / "units.json"
    record.write_text(json.dumps({"units": [
        {"index": 0, "unit": "llamarack-server@0.service", "port": 8080, "listen": "0.0.0.0", "parallel": 4,
         "cards": ["GPU-a"]},
        {"index": 1, "unit": "llamarack-server@1.service", "port": 8081, "listen": "10.0.0.5", "parallel": 2,
         "cards": ["GPU-b"]}]}))
    r = run("server_idle", "units", str(record), "8080", "0.0.0.0")
    assert [(u["unit"], u["url"]) for u in json.loads(r.stdout)["units"]] == [
        ("llamarack-server@0.service", "http://127.0.0.1:8080"), ("llamarack-server@1.service", "http://10.0.0.5:8081")]
    record.write_text(json.dumps({"units": [{"index": 0, "unit": "../../etc/passwd", "port": 1}]}))
    bad = run("server_idle", "units", str(record), "8080", "0.0.0.0")
    assert bad.returncode != 0 and "not a llamarack unit" in bad.stderr


def test_idle_when_no_slot_processes_and_nothing_is_deferred(tmp_path):
    with FakeLlamaServer() as s:
        rc, out = idle(tmp_path / "units.json", s.port)
    assert rc == 0 and out == {"idle": True, "units": [{"index": 0, "port": s.port, "busy": None}]}


def test_a_processing_slot_or_a_deferred_request_is_busy(tmp_path):
    with FakeLlamaServer(Behaviour(processing=[False, True])) as s:
        rc, out = idle(tmp_path / "units.json", s.port, "1")
    assert rc == 1 and out["units"][0]["busy"] == "1 requests processing"
    with FakeLlamaServer(Behaviour(processing=[False, True], metrics=False)) as s:  # no --metrics: its /slots say
        rc, out = idle(tmp_path / "units.json", s.port, "1")
    assert rc == 1 and out["units"][0]["busy"] == "slots 1 processing"
    with FakeLlamaServer(Behaviour(deferred=3)) as s:
        rc, out = idle(tmp_path / "units.json", s.port, "1")
    assert rc == 1 and out["units"][0]["busy"] == "3 requests deferred"


def test_a_unit_becoming_idle_within_the_timeout(tmp_path):
    with FakeLlamaServer(Behaviour(processing=[True, False])) as s:
        threading.Timer(1.0, lambda: s.behaviour.processing.__setitem__(0, False)).start()
        started = time.monotonic()
        rc, out = idle(tmp_path / "units.json", s.port, "20")
    assert rc == 0 and out["idle"] and 1.0 <= time.monotonic() - started < 15


def test_cannot_tell_is_busy(tmp_path):
    with FakeLlamaServer(Behaviour(hang_loop=6.5)) as s:  # /health answers; the main loop hangs past the ask's 5 s
        rc, out = idle(tmp_path / "units.json", s.port, "1")
    assert rc == 1 and out["units"][0]["busy"] == "/metrics answered nothing: cannot tell"
    with FakeLlamaServer(Behaviour(processing=[], metrics=False)) as s:
        rc, out = idle(tmp_path / "units.json", s.port, "1")
    assert rc == 1 and "lists no slot" in out["units"][0]["busy"]
    rc, out = idle(tmp_path / "units.json", 1, "1")  # nothing listens
    assert rc == 1 and "cannot tell" in out["units"][0]["busy"]


def test_without_metrics_the_slots_say_and_the_api_key_is_sent(tmp_path):
    key = tmp_path / "key"
    key.write_text("s3cret\n")
    with FakeLlamaServer(Behaviour(metrics=False, api_key="s3cret")) as s:
        rc, out = idle(tmp_path / "units.json", s.port, "3", str(key))
        assert rc == 0, out
        rc, out = idle(tmp_path / "units.json", s.port, "1")  # no key: 401
    assert rc == 1 and out["units"][0]["busy"] == "/metrics answered 401: cannot tell"


def test_one_busy_unit_of_two_keeps_the_host_busy(tmp_path):
    with FakeLlamaServer() as a, FakeLlamaServer(Behaviour(deferred=1)) as b:
        record = tmp_path / "units.json"
        record.write_text(json.dumps({"units": [
            {"index": i, "unit": f"llamarack-server@{i}.service", "port": s.port, "listen": "127.0.0.1"}
            for i, s in enumerate((a, b))]}))
        rc, out = idle(record, 8080, "1")
    assert rc == 1 and [u["busy"] for u in out["units"]] == [None, "1 requests deferred"]


def test_a_sleeping_unit_is_idle_and_stays_asleep(tmp_path):
    """/metrics answers a sleeping server's cached figures without waking it; /slots would."""
    with FakeLlamaServer(Behaviour(sleep_idle_seconds=0.5, processing=[False, False])) as s:
        time.sleep(0.7)
        assert s.behaviour.sleeping()
        rc, out = idle(tmp_path / "units.json", s.port, "5")
        assert rc == 0 and out["units"][0]["busy"] is None
        assert s.behaviour.sleeping() and s.behaviour.wakes == 0
        assert ("GET", "/slots") not in s.behaviour.requests and ("GET", "/metrics") in s.behaviour.requests
        urllib.request.urlopen(s.url + "/slots", timeout=10).read()  # the stand-in wakes as llama-server does
        assert s.behaviour.wakes == 1 and not s.behaviour.sleeping()


def test_one_real_completion(tmp_path):
    key = tmp_path / "key"
    key.write_text("k\n")
    with FakeLlamaServer(Behaviour(api_key="k")) as s:
        r = run("completion_probe", s.url, "4", "10", str(key))
        assert r.returncode == 0 and json.loads(r.stdout)["tokens_predicted"] == 4
        r = run("completion_probe", s.url, "4", "10")
        assert r.returncode == 1 and "answered 401" in r.stderr
        s.behaviour.completion_status = 500
        r = run("completion_probe", s.url, "4", "10", str(key))
        assert r.returncode == 1 and "answered 500" in r.stderr
    r = run("completion_probe", "http://127.0.0.1:1", "4", "10")
    assert r.returncode == 1 and "no answer" in r.stderr


def systemd_says(tmp_path, load: str, active: str) -> dict:
    """An environment whose ``systemctl show`` answers as systemd does for the unit."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "systemctl"
    fake.write_text(f"#!/bin/sh\nprintf 'LoadState={load}\\nActiveState={active}\\n'\n")
    fake.chmod(0o755)
    return {"PATH": f"{bin_dir}:/usr/bin:/bin"}


def test_a_stopped_or_failed_unit_is_idle_without_being_asked(tmp_path):
    for active in ("inactive", "failed"):
        rc, out = idle(tmp_path / "units.json", 9, "1", env=systemd_says(tmp_path, "loaded", active))
        assert rc == 0 and out["units"][0]["busy"] is None, (active, out)  # port 9: nobody would answer


def test_a_running_or_unknown_unit_is_asked(tmp_path):
    for load, active in (("loaded", "active"), ("loaded", "activating"), ("not-found", "inactive")):
        rc, out = idle(tmp_path / "units.json", 9, "1", env=systemd_says(tmp_path, load, active))
        assert rc == 1 and "cannot tell" in out["units"][0]["busy"], (load, active, out)

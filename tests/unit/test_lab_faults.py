"""The fault bench's judgements, on snapshots made by its own host-side script."""

import json
import os
import socket
import subprocess
import sys
import time

from llamarack_lab import faults
from llamarack.layout import UNIT_PATH

R = "/opt/llamarack"


def f(size=1, mtime=1, sha="a"):
    return ["file", size, mtime, sha]


BEFORE = {
    f"{R}/builds/current": ["link", "s1"],
    f"{R}/builds/s1/build-info.json": f(),
    f"{R}/builds/s1/bin/llama-server": f(9, 1, None),
    f"{R}/models/current": ["link", "m1"],
    f"{R}/models/m1/model.gguf": f(5, 1, None),
    f"{R}/state/gpus.json": f(),
    UNIT_PATH: f(),
}


def test_work_in_the_staging_areas_is_not_a_change():
    after = dict(BEFORE)
    after.update({
        f"{R}/models/.staging/m2/hf/model.safetensors": f(),  # a model being made
        f"{R}/builds/s2/bin/llama-server": f(),  # a build that never counted
        f"{R}/src/llama.cpp/tools/server/server.cpp": f(2),  # the checkout moved
        UNIT_PATH + ".new": f(),
    })  # fmt: skip
    assert faults.changed_outside_staging(BEFORE, after, R) == []


def test_a_counted_build_or_anything_served_is_a_change():
    after = dict(BEFORE)
    after[f"{R}/builds/s2/build-info.json"] = f()  # s2 counts now: its files are the deployment's
    after[f"{R}/builds/s2/bin/llama-server"] = f()
    after[f"{R}/models/m1/model.gguf"] = f(5, 2, None)  # touched
    after[UNIT_PATH + ".prev"] = f()
    del after[f"{R}/state/gpus.json"]
    assert faults.changed_outside_staging(BEFORE, after, R) == sorted([
        f"{R}/builds/s2/build-info.json", f"{R}/builds/s2/bin/llama-server", f"{R}/models/m1/model.gguf",
        UNIT_PATH + ".prev", f"{R}/state/gpus.json"])  # fmt: skip


def test_the_current_build_is_never_staging_even_without_its_record():
    after = dict(BEFORE)
    del after[f"{R}/builds/s1/build-info.json"]
    assert faults.changed_outside_staging(BEFORE, after, R) == [f"{R}/builds/s1/build-info.json"]


def test_snapshot_script_lists_files_and_links_with_hashes_of_small_files(tmp_path):
    (tmp_path / "envs/awq").mkdir(parents=True)
    (tmp_path / "envs/awq/x.py").write_text("x")
    (tmp_path / "models/m1").mkdir(parents=True)
    (tmp_path / "models/m1/stamp.json").write_text("{}")
    (tmp_path / "models/current").symlink_to("m1")
    out = subprocess.run([sys.executable, "-", "100", f"{tmp_path}/envs/", str(tmp_path), str(tmp_path / "nothing")],
                         input=faults._SNAPSHOT, capture_output=True, text=True, check=True).stdout  # fmt: skip
    snap = json.loads(out)
    assert snap[f"{tmp_path}/models/current"] == ["link", "m1"]
    kind, size, mtime, sha = snap[f"{tmp_path}/models/m1/stamp.json"]
    assert (kind, size, mtime) == ("file", 2, os.stat(tmp_path / "models/m1/stamp.json").st_mtime_ns)
    assert sha == "44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"  # sha256 of "{}"
    assert snap[f"{tmp_path}/envs/awq/x.py"][3] is None  # not hashed: size and mtime say enough
    assert set(snap) == {f"{tmp_path}/models/current", f"{tmp_path}/models/m1/stamp.json", f"{tmp_path}/envs/awq/x.py"}


def test_poller_records_every_failure_and_the_longest_outage():
    p = faults.Poller("127.0.0.1", interval=0.25, timeout=0.5)
    p.samples = [(0.5, 200), (1.0, 0), (1.25, 0), (1.5, 503), (3.0, 200), (9.0, 200), (10.0, 0), (10.25, 200)]
    p.requests, p.failures = len(p.samples), [x for x in p.samples if x[1] != 200]
    s = p.summary()
    assert s["failures"] == 4 and s["requests"] == 8
    assert s["longest_outage_s"] == 2.5  # from the answer at 0.5 to the one at 3.0; 9.0 .. 10.25 is 1.25


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_poller_counts_a_dead_port_as_failures_and_200_as_served(tmp_path):
    dead = free_port()
    p = faults.Poller("127.0.0.1", interval=0.05, timeout=0.2, port=dead).start()
    time.sleep(1.0)
    s = p.stop()
    assert s["requests"] >= 3 and s["failures"] == s["requests"]
    assert {status for _, status in p.failures} == {0}
    (tmp_path / "health").write_text("ok")  # GET /health answers 200
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "http.server", "--bind", "127.0.0.1", "--directory",
                               str(tmp_path), str(port)], stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        deadline = time.monotonic() + 10
        while faults.health("127.0.0.1", port) != 200 and time.monotonic() < deadline:
            time.sleep(0.05)
        p = faults.Poller("127.0.0.1", interval=0.05, timeout=0.5, port=port).start()
        time.sleep(1.0)
        s = p.stop()
    finally:
        server.kill()
        server.wait()
    assert s["requests"] >= 3 and s["failures"] == 0, s

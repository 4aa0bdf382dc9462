"""The lab's hub: the tiny model is bit-for-bit the same wherever it is built, so its
hub revision (a content hash of its files) is a constant the lab inventory pins;
and ``services.start_all``/``stop_all`` run the file server and the hub as
detached processes (here on 127.0.0.1 and free ports, never the lab's address).
"""

import json
import os
import select
import socket
import time
import urllib.request
from pathlib import Path

import pytest

from roles.model.hub import repo_files
from llamarack_lab import services, tiny_model
from llamarack_lab.hub_server import HubServer, Repo
from llamarack_lab.tiny_model import TINY_MODEL_REVISION
from tests.support.cache import CACHE
from tests.support.tiny_model import tiny_model as cached_tiny_model


def fresh_cache(path: Path) -> Path:
    """An empty cache sharing only the (slow, pinned) tools venv with the test cache."""
    (CACHE / "venvs").mkdir(parents=True, exist_ok=True)
    path.mkdir()
    (path / "venvs").symlink_to(CACHE / "venvs")
    return path


def test_tiny_model_is_the_same_from_scratch_anywhere(tmp_path):
    built = [tiny_model.tiny_model(fresh_cache(tmp_path / name)) for name in ("a", "b")]
    assert built[0] != built[1]
    for model in built:
        assert Repo.scan("lab/tiny-llama", model).sha == TINY_MODEL_REVISION
    assert {p.name: p.read_bytes() for p in built[0].iterdir()} == {p.name: p.read_bytes() for p in built[1].iterdir()}
    assert Repo.scan("lab/tiny-llama", cached_tiny_model()).sha == TINY_MODEL_REVISION


def test_revision_is_a_content_hash_of_the_repo_files(tmp_path):
    (tmp_path / "a.json").write_text("{}")
    first = Repo.scan("lab/x", tmp_path).sha
    assert Repo.scan("lab/x", tmp_path).sha == first
    (tmp_path / "a.json").write_text("{ }")
    assert Repo.scan("lab/x", tmp_path).sha != first


def test_hub_lists_the_tiny_model_at_the_pinned_revision():
    with HubServer({"lab/tiny-llama": cached_tiny_model()}) as hub:
        listing = repo_files(hub.url, "lab/tiny-llama", TINY_MODEL_REVISION, None)
    assert listing.sha == TINY_MODEL_REVISION
    assert {"config.json", "model.safetensors", "tokenizer.model"} <= {f.path for f in listing.files}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_start_all_serves_both_detached_and_stop_all_stops_them(tmp_path, monkeypatch):
    srv = tmp_path / "srv"
    (srv / "pypi" / "simple" / "demo").mkdir(parents=True)
    (srv / "pypi" / "simple" / "demo" / "index.html").write_text("<a href='x'>x</a>")
    model = cached_tiny_model()
    monkeypatch.setenv("LLAMARACK_LAB_DIR", str(tmp_path / "state"))
    (tmp_path / "state").mkdir()
    monkeypatch.setattr(services, "srv_dir", lambda: srv)
    monkeypatch.setattr(services, "prepare", lambda: None)
    monkeypatch.setattr(services, "prepare_index", lambda m: srv / "pypi" / "simple")
    monkeypatch.setattr(services, "prepare_hub", lambda: model)
    monkeypatch.setattr(services, "SERVICES_PORT", free_port())
    monkeypatch.setattr(services, "HUB_PORT", free_port())

    record = services.start_all("127.0.0.1")
    try:
        json.dumps(record)  # goes into rack.json
        assert record["hub"]["revision"] == TINY_MODEL_REVISION
        page = urllib.request.urlopen(f"http://127.0.0.1:{record['port']}/pypi/simple/demo/").read()
        assert b"href" in page
        info = json.loads(urllib.request.urlopen(
            f"http://127.0.0.1:{record['hub']['port']}/api/models/lab/tiny-llama/revision/main").read())
        assert info["sha"] == TINY_MODEL_REVISION
        # detached: their own sessions, so a terminal's ^C or hangup does not reach them
        assert os.getsid(record["pid"]) == record["pid"] and os.getsid(record["hub"]["pid"]) == record["hub"]["pid"]
    finally:
        services.stop_all(record)
    assert gone(record["pid"]) and gone(record["hub"]["pid"])
    services.stop_all(record)  # again: nothing to do
    services.stop_all({"pid": record["pid"], "port": 8470})  # a record of an older `lab up`


def test_start_all_stops_the_file_server_when_the_hub_fails(tmp_path, monkeypatch):
    monkeypatch.setenv("LLAMARACK_LAB_DIR", str(tmp_path))
    monkeypatch.setattr(services, "srv_dir", lambda: tmp_path)
    monkeypatch.setattr(services, "prepare", lambda: None)
    monkeypatch.setattr(services, "prepare_index", lambda m: tmp_path)
    monkeypatch.setattr(services, "prepare_hub", lambda: cached_tiny_model())
    monkeypatch.setattr(services, "SERVICES_PORT", free_port())
    started = []
    real_start = services.start
    monkeypatch.setattr(services, "start", lambda bind: started.append(real_start(bind)) or started[-1])
    with socket.socket() as taken:  # the hub's port is taken: it cannot start
        taken.bind(("127.0.0.1", 0))
        monkeypatch.setattr(services, "HUB_PORT", taken.getsockname()[1])
        try:
            with pytest.raises(RuntimeError, match="lab hub"):
                services.start_all("127.0.0.1")
        finally:
            for pid in started:
                if not gone(pid):
                    services.stop(pid)
                    pytest.fail("the file server was left running")
    assert started and gone(started[0])


def printed_lines(proc, n: int, timeout: float = 10.0) -> list:
    """The next ``n`` lines a process prints (waited for up to ``timeout`` s): the hub prints a
    request's record once its answer is sent, so after the client has the whole body."""
    out, deadline = b"", time.monotonic() + timeout
    while out.count(b"\n") < n and time.monotonic() < deadline:
        if select.select([proc.stdout], [], [], 0.1)[0]:
            chunk = os.read(proc.stdout.fileno(), 65536)
            if not chunk:
                break
            out += chunk
    return out.decode().splitlines()


def test_the_hub_process_takes_its_faults_as_options(tmp_path):
    """``hub_server.py --drop-after PATH=BYTESxTIMES --corrupt PATH``: the faults the
    reliability bench injects, as options of the lab's hub process."""
    import subprocess
    import sys

    from llamarack_lab import hub_server

    (tmp_path / "a.safetensors").write_bytes(bytes(range(256)) * 40)  # 10240 bytes
    (tmp_path / "b.safetensors").write_bytes(b"b" * 1000)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, hub_server.__file__, "--port", str(port),
                             "--drop-after", "a.safetensors=4096x2", "--corrupt", "b.safetensors",
                             f"org/x={tmp_path}"], stdout=subprocess.PIPE, bufsize=0)  # fmt: skip
    try:
        assert len(printed_lines(proc, 1)) == 1  # the listing URL: it serves
        url = f"http://127.0.0.1:{port}/org/x/resolve/main"

        def get(path, start=0):
            req = urllib.request.Request(f"{url}/{path}", headers={"Range": f"bytes={start}-"} if start else {})
            body = b""
            try:
                with urllib.request.urlopen(req, timeout=10) as r:
                    while chunk := r.read(1024):
                        body += chunk
            except Exception:  # the cut: fewer bytes than Content-Length
                pass
            return body

        assert len(get("a.safetensors")) == 4096  # cut at byte 4096
        assert get("a.safetensors", 4096) == b""  # the second try, resumed there, is cut at once
        assert get("a.safetensors", 4096) == (bytes(range(256)) * 40)[4096:]  # then whole
        wrong = get("b.safetensors")
        assert len(wrong) == 1000 and wrong != b"b" * 1000
        # each answered request, printed as a JSON line: what a bench counts the hub's bytes from
        records = [json.loads(line) for line in printed_lines(proc, 4)]
    finally:
        proc.kill()
        proc.wait()
    # (in any order: each request's thread prints its record once the answer is sent)
    assert sorted(((r["path"].rsplit("/", 1)[1], r["range"], r["sent"]) for r in records), key=str) == [
        ("a.safetensors", "bytes=4096-", 0), ("a.safetensors", "bytes=4096-", 6144), ("a.safetensors", None, 4096),
        ("b.safetensors", None, 1000)]  # fmt: skip


def test_each_record_is_one_whole_line_in_one_write(monkeypatch):
    """The hub answers in threads: a record written in pieces (print's text, then its newline)
    let two records share one line of hub.log, which a bench then cannot read."""
    import sys
    import threading

    from llamarack_lab import hub_server

    writes = []

    class Recorder:
        def write(self, text):
            writes.append(text)

        def flush(self):
            pass

    monkeypatch.setattr(sys, "stdout", Recorder())
    entry = hub_server.Logged("GET", "/org/x/resolve/main/a.safetensors", None, "none", status=200)
    threads = [threading.Thread(target=hub_server.print_record, args=(entry,)) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(writes) == 16
    assert all(w.endswith("\n") and w.count("\n") == 1 and json.loads(w)["status"] == 200 for w in writes)

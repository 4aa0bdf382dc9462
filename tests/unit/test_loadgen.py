"""bench/loadgen.py: a bounded load against a local server (llama-server's formats)."""

import importlib.util
import json
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.support.fake_llama_server import Behaviour, FakeLlamaServer

_spec = importlib.util.spec_from_file_location("loadgen", Path(__file__).resolve().parents[2] / "bench/loadgen.py")
loadgen = sys.modules.setdefault("loadgen", importlib.util.module_from_spec(_spec))
_spec.loader.exec_module(loadgen)


def test_a_fixed_count_at_a_concurrency():
    with FakeLlamaServer(Behaviour(completion_delay=0.05)) as s:
        summary = loadgen.Load(s.url, requests=20, concurrency=4, time_limit=60).start().wait()
        posts = [r for r in s.behaviour.requests if r == ("POST", "/completion")]
    assert (summary["sent"], summary["ok"], summary["failed"]) == (20, 20, 0) and len(posts) == 20
    assert 0.05 <= summary["p50_s"] <= summary["p99_s"] < 5
    assert summary["seconds"] < 20 * 0.05  # four at a time


def test_the_chat_api_and_failures_are_counted():
    with FakeLlamaServer() as s:
        summary = loadgen.Load(s.url, requests=5, concurrency=2, api="chat").start().wait()
        assert summary["ok"] == 5 and ("POST", "/v1/chat/completions") in s.behaviour.requests
        s.behaviour.completion_status = 503
        summary = loadgen.Load(s.url, requests=3, concurrency=1).start().wait()
    assert (summary["ok"], summary["failed"], summary["errors"], summary["p50_s"]) == (0, 3, ["HTTP 503"], None)
    summary = loadgen.Load("http://127.0.0.1:1", requests=2, concurrency=1).start().wait()
    assert summary["failed"] == 2 and "Connection refused" in summary["errors"][0]


def test_it_stops_by_itself_at_its_time_limit_and_when_told():
    with FakeLlamaServer(Behaviour(completion_delay=0.2)) as s:
        started = time.monotonic()
        summary = loadgen.Load(s.url, requests=10_000, concurrency=2, time_limit=1.0).start().wait()
        assert time.monotonic() - started < 3 and 2 <= summary["sent"] <= 14 and summary["failed"] == 0
        load = loadgen.Load(s.url, requests=10_000, concurrency=2, time_limit=600).start()
        threading.Timer(0.5, load.stop.set).start()
        summary = load.wait()
    assert summary["sent"] < 20 and summary["failed"] == 0


def test_only_private_addresses():
    for url in ("http://8.8.8.8:8000", "http://0.0.0.0:8000", "ftp://10.0.0.1/", "http://[2001:4860::8888]:80"):
        with pytest.raises(loadgen.Refused):
            loadgen.Load(url)
    for url in ("http://10.77.0.20:8000", "http://127.0.0.1:8080", "http://[::1]:8080", "http://192.168.1.4"):
        loadgen.Load(url)
    assert loadgen.main(["http://1.1.1.1:80", "--requests", "1"]) == 2


def test_the_command_writes_every_request(tmp_path, capsys):
    with FakeLlamaServer() as s:
        assert loadgen.main([s.url, "--requests", "3", "--concurrency", "1", "--out", str(tmp_path / "o.json")]) == 0
    out = json.loads((tmp_path / "o.json").read_text())
    assert [r["index"] for r in out["requests"]] == [0, 1, 2] and out["summary"]["ok"] == 3
    assert json.loads(capsys.readouterr().out)["sent"] == 3


def test_percentiles():
    assert loadgen.percentile([], 50) is None
    assert loadgen.percentile([3, 1, 2], 50) == 2 and loadgen.percentile(list(range(1, 101)), 99) == 99
    assert loadgen.percentile([5], 99) == 5

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
    assert (summary["ok"], summary["failed"], summary["reasons"], summary["p50_s"]) == (0, 3, {"HTTP 503": 3}, None)
    assert summary["errors"] == ['HTTP 503: {"error": {"code": 503, "message": "no", "type": "server_error"}}']
    summary = loadgen.Load("http://127.0.0.1:1", requests=2, concurrency=1).start().wait()
    assert summary["reasons"] == {"connection refused": 2} and "Connection refused" in summary["errors"][0]


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


def run(behaviour=None, **load) -> tuple:
    """(the summary, the records by index, the bodies the server got) of one load."""
    with FakeLlamaServer(behaviour or Behaviour()) as s:
        one = loadgen.Load(s.url, **{"requests": 4, "concurrency": 2, **load}).start()
        summary = one.wait()
        bodies = list(s.behaviour.bodies)
    return summary, sorted(one.records, key=lambda r: r.index), bodies


def test_a_200_is_a_success_only_with_a_completion_in_its_body():
    error = json.dumps({"error": {"code": 500, "message": "the slot failed", "type": "server_error"}})
    with FakeLlamaServer() as s:
        for body, api, reason in ((error, "completion", "error in body"), ("", "completion", "empty body"),
                                  ("  ", "chat", "empty body"), ("<html>oops</html>", "completion", "body not JSON"),
                                  ("[1, 2]", "completion", "body not JSON"),
                                  ('{"content": "", "stop": true}', "completion", "empty completion"),
                                  ('{"choices": []}', "chat", "empty completion"),
                                  ('{"choices": [{"message": {"role": "assistant", "content": ""}}]}', "chat",
                                   "empty completion")):  # fmt: skip
            s.behaviour.body = body
            load = loadgen.Load(s.url, requests=4, concurrency=2, api=api).start()
            summary = load.wait()
            assert (summary["ok"], summary["failed"], summary["reasons"]) == (0, 4, {reason: 4}), (body, summary)
            assert {r.status for r in load.records} == {200}
    summary, _, bodies = run(n_predict=16)  # the real bodies pass; each asks its tokens, to the end
    assert summary["ok"] == 4
    assert {(b["n_predict"], b["ignore_eos"], "stream" in b) for b in bodies} == {(16, True, False)}


@pytest.mark.parametrize("api", ["completion", "chat"])
def test_a_stream_is_read_to_its_last_event(api):
    summary, records, bodies = run(api=api, stream_share=1, n_predict=5)
    assert (summary["ok"], summary["streamed"], summary["failed"]) == (4, 4, 0)
    assert all(b["stream"] is True for b in bodies) and all(r.streamed and r.first_token_s is not None for r in records)
    assert summary["first_token_p50_s"] is not None


@pytest.mark.parametrize("api", ["completion", "chat"])
@pytest.mark.parametrize("fault, reason", [({"stream_end": False}, "stream: no end"),
                                           ({"stream_error": True}, "stream: error event"),
                                           ({"stream_cut": True}, "connection closed")])
def test_a_stream_without_its_end_or_with_an_error_failed(api, fault, reason):
    summary, records, _ = run(Behaviour(**fault), api=api, stream_share=1)
    assert (summary["ok"], summary["failed"], summary["reasons"]) == (0, 4, {reason: 4})
    assert {r.status for r in records} == {200} and summary["streamed_failed"] == 4


def test_a_stream_with_no_token_or_a_broken_event_failed():
    no_token = [b'data: {"index": 0, "content": "", "stop": true}\n', b"\n"]
    assert loadgen.stream_fault("completion", no_token) == ("stream: no token", None)
    assert loadgen.stream_fault("chat", [b"data: [DONE]\n"]) == ("stream: no token", None)
    assert loadgen.stream_fault("completion", [b'data: {"content": "a"}\n', b"data: {oops\n"])[0] == \
        "stream: event not JSON"  # fmt: skip
    reason, first = loadgen.stream_fault("completion", [b": a comment\n", b'data: {"content": "a", "stop": false}\n',
                                                        b"\n", b'data: {"content": "", "stop": true}\n'])  # fmt: skip
    assert reason is None and first is not None


def test_the_stream_share_is_spread_evenly_and_deterministically():
    summary, records, bodies = run(requests=8, concurrency=1, stream_share=0.25)
    assert [r.index for r in records if r.streamed] == [3, 7] and summary["streamed"] == 2 and summary["ok"] == 8
    assert [bool(b.get("stream")) for b in bodies] == [i in (3, 7) for i in range(8)]
    assert [i for i in range(10) if loadgen.streams(i, 0.1)] == [9]
    assert all(loadgen.streams(i, 1) for i in range(5)) and not any(loadgen.streams(i, 0) for i in range(5))
    assert sum(loadgen.streams(i, 1 / 3) for i in range(300)) == 100


def test_failures_are_counted_by_the_seconds_they_started_in():
    records = [loadgen.Record(0, 0.1, status=503, latency_s=0.01, error="HTTP 503"),
               loadgen.Record(1, 0.9, error="connection refused", latency_s=0.01),
               loadgen.Record(2, 1.5, status=200, latency_s=0.2),
               loadgen.Record(3, 2.0, status=200, latency_s=0.3, error="stream: no end", streamed=True),
               loadgen.Record(4, 2.99, status=200, latency_s=0.1)]  # fmt: skip
    tally = loadgen.tally(records)
    assert (tally["sent"], tally["ok"], tally["failed"], tally["streamed_failed"]) == (5, 2, 3, 1)
    assert (tally["seconds_with_failure"], tally["failure_seconds"]) == (2, [0, 2])
    assert tally["reasons"] == {"HTTP 503": 1, "connection refused": 1, "stream: no end": 1}
    assert records[3].compact() == [2.0, 200, 0.3, "stream: no end", True]
    assert loadgen.COMPACT_FIELDS == ("started_s", "status", "latency_s", "reason", "streamed")


def test_an_outage_counts_its_seconds_not_how_fast_its_errors_come():
    """A paced load across a short outage (503s from 1.2 s to 1.6 s): its failures fall in
    the one second they started in, and are few."""
    with FakeLlamaServer() as s:
        load = loadgen.Load(s.url, requests=10_000, concurrency=1, time_limit=2.6, pace=0.1).start()
        threading.Timer(1.2, setattr, (s.behaviour, "completion_status", 503)).start()
        threading.Timer(1.6, setattr, (s.behaviour, "completion_status", 200)).start()
        summary = load.wait()
    assert summary["failure_seconds"] == [1] and summary["seconds_with_failure"] == 1, summary
    assert 2 <= summary["failed"] <= 5 and summary["reasons"] == {"HTTP 503": summary["failed"]}
    assert 20 <= summary["sent"] <= 27


def test_pacing_bounds_the_requests_in_a_window_however_fast_they_fail():
    for status in (200, 503):
        with FakeLlamaServer(Behaviour(completion_status=status)) as s:
            paced = loadgen.Load(s.url, requests=10_000, concurrency=2, time_limit=1.0, pace=0.2).start().wait()
            closed = loadgen.Load(s.url, requests=10_000, concurrency=2, time_limit=1.0).start().wait()
        assert 8 <= paced["sent"] <= 10, paced  # each client: 0, 0.2, 0.4, 0.6, 0.8 s
        assert closed["sent"] > 5 * paced["sent"], closed  # the closed loop: as fast as the answers come
        assert paced["failed"] == (paced["sent"] if status == 503 else 0)
    with FakeLlamaServer(Behaviour(completion_delay=0.3)) as s:  # an answer slower than the pace: the next at once
        slow = loadgen.Load(s.url, requests=10_000, concurrency=1, time_limit=1.0, pace=0.1).start().wait()
    assert 3 <= slow["sent"] <= 4 and slow["failed"] == 0


def test_the_command_takes_a_pace_and_a_stream_share(tmp_path):
    with FakeLlamaServer() as s:
        rc = loadgen.main([s.url, "--requests", "4", "--concurrency", "1", "--pace", "0.05", "--stream-share", "0.5",
                           "--api", "chat", "--out", str(tmp_path / "o.json")])  # fmt: skip
    out = json.loads((tmp_path / "o.json").read_text())
    assert rc == 0 and [r["streamed"] for r in out["requests"]] == [False, True, False, True]
    assert (out["summary"]["pace_s"], out["summary"]["stream_share"], out["summary"]["n_predict"]) == (0.05, 0.5, 16)
    for bad in (["--pace", "-1"], ["--stream-share", "1.5"], ["--n-predict", "0"]):
        assert loadgen.main(["http://127.0.0.1:1", *bad]) == 2

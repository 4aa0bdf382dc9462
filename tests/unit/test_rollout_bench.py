"""bench/rollout_bench.py apart from the lab: the three-way comparison's order, the load
around each action, what the gate's notes say the default gate would do, the result file
and its table."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from roles.rollout import Options, bench_verdict
from tests.support.fake_llama_server import FakeLlamaServer

_spec = importlib.util.spec_from_file_location("rollout_bench",
                                               Path(__file__).resolve().parents[2] / "bench/rollout_bench.py")
bench = sys.modules.setdefault("rollout_bench", importlib.util.module_from_spec(_spec))
_spec.loader.exec_module(bench)


def test_the_default_fraction_is_the_products():
    assert bench.DEFAULT_BENCH_FRACTION == Options().bench_fraction
    assert bench.LAB_GATE == ("--bench-fraction", "1")


def gated_line(host: str, before: dict, after: dict) -> str:
    """A rollout's "gated" line, its notes as the gate writes them (``bench_verdict`` with the lab's fraction)."""
    why, compared = bench_verdict(before, after, 1.0)
    assert why is None
    return f"2026-12-06T10:00:00+00:00 {host}: gated (1 unit(s) healthy, no residency to check (a CPU build), " \
           f"completing; {compared})"  # fmt: skip


def record(build: str, pp: float, tg) -> dict:
    return {"key": {"build": build, "model": "m"}, "pp512": {"tokens_per_second": pp},
            "tg128": {"tokens_per_second": tg}}  # fmt: skip


def test_the_gate_notes_say_what_the_default_gate_would_have_done():
    output = "\n".join([
        "2026-12-06T10:00:00+00:00 lab-v100-a: draining",
        gated_line("lab-v100-a", record("b1", 9000.0, 2549.0), record("b2", 8800.0, 117.0)),
        gated_line("lab-v100-b", record("b1", 9000.0, 2549.0), record("b2", 8000.0, 2400.0)),
        "2026-12-06T10:00:09+00:00 lab-v100-32: gated (1 unit(s) healthy, on their cards, completing; no new "
        "llama-bench record (no new build or model measured))",
    ])  # fmt: skip
    notes = bench.gated_notes(output)
    assert set(notes) == {"lab-v100-a", "lab-v100-b", "lab-v100-32"}
    seen = bench.bench_gate(notes)
    assert set(seen) == {"lab-v100-a", "lab-v100-b"}  # lab-v100-32 compared nothing
    assert seen["lab-v100-a"] == [
        {"unit": None, "test": "pp512", "tokens_per_second": 8800.0, "before": 9000.0, "ratio": 0.978,
         "default_gate": "passes"},
        {"unit": None, "test": "tg128", "tokens_per_second": 117.0, "before": 2549.0, "ratio": 0.046,
         "default_gate": "refuses"}]  # fmt: skip
    assert [f["default_gate"] for f in seen["lab-v100-b"]] == ["passes", "passes"]


def test_a_unit_named_in_the_notes_is_kept():
    notes = {"h": "2 unit(s) healthy, on their cards, completing; llamarack-server.service: pp512 50.0 t/s "
                  "(was 100.0), llamarack-server-1.service: tg128 None t/s (was 100.0), "
                  "llamarack-server-1.service: pp512 90.0 t/s (was 100.0)"}  # fmt: skip
    seen = bench.bench_gate(notes)["h"]
    assert [(f["unit"], f["test"], f["ratio"], f["default_gate"]) for f in seen] == [
        ("llamarack-server.service", "pp512", 0.5, "refuses"), ("llamarack-server-1.service", "tg128", None, "refuses"),
        ("llamarack-server-1.service", "pp512", 0.9, "passes")]


@pytest.fixture
def quick(monkeypatch):
    """The bench's load, shorter: 2 clients, a request each every 0.05 s, 0.2 s before and after."""
    for name, value in {"CONCURRENCY": 2, "PACE_S": 0.05, "LEAD_S": 0.2, "SETTLE_S": 0.2}.items():
        monkeypatch.setattr(bench, name, value)


def test_the_load_runs_before_during_and_after_the_action(quick):
    with FakeLlamaServer() as s:
        done = bench.under_load(s.url, lambda: __import__("time").sleep(0.3) or {"returncode": 0})
        alone = bench.under_load(s.url, seconds=0.3)
    began, ended = done["action_s"]
    assert 0.15 <= began <= 0.4 and 0.25 <= done["seconds"] <= 0.6 and done["returncode"] == 0
    assert done["load"]["failed"] == 0 and done["load"]["pace_s"] == 0.05 and done["load"]["stream_share"] == 0.25
    starts = [r[0] for r in done["requests"]]
    assert starts == sorted(starts) and starts[0] < began and starts[-1] > ended  # the load covers the action
    assert len(done["requests"]) == done["load"]["sent"] and all(len(r) == 5 for r in done["requests"])
    assert sum(r[4] for r in done["requests"]) == done["load"]["streamed"] > 0
    assert "action_s" not in alone and 0.2 <= alone["load"]["seconds"] <= 1.0


def test_the_same_change_is_made_three_ways_from_the_same_state(quick, monkeypatch):
    calls, pids = [], {"a": 1, "b": 1}

    def deploy(flags=(), data=(), must=False):
        calls.append(("pyinfra", flags, data, must))
        if data:
            pids.update({h: pid + 1 for h, pid in pids.items()})  # the change restarts every server
        return {"returncode": 0}

    def rollout(*args, **kw):
        calls.append(("rollout", args, kw))
        pids["a"] += 1  # one host only: not every host restarted
        return {"returncode": 0}

    monkeypatch.setattr(bench, "pyinfra_deploy", deploy)
    monkeypatch.setattr(bench, "rollout", rollout)
    monkeypatch.setattr(bench, "servers", lambda rack, names: {n: str(pids[n]) for n in names})
    monkeypatch.setattr(bench, "drivers", lambda rack, names: {n: "550.127.05" for n in names})
    with FakeLlamaServer() as s:
        out = bench.three_way(None, ["a", "b"], s.url)
    change = bench.THREE_WAY_CHANGE
    assert calls == [("pyinfra", (), (), True), ("rollout", ("--data", change), {}),
                     ("pyinfra", (), (), True), ("pyinfra", ("--serial",), (change,), False),
                     ("pyinfra", (), (), True), ("pyinfra", (), (change,), False),
                     ("pyinfra", (), (), True)]  # fmt: skip
    assert out["change"] == change and list(out) == ["change", "rollout", "serial", "parallel", "put_back"]
    assert [out[w]["every_host_restarted"] for w in bench.WAYS] == [False, True, True]
    assert all(out[w]["load"]["sent"] > 0 and out[w]["requests"] for w in bench.WAYS)


def test_the_result_file_keeps_one_line_per_request():
    result = {"a": {"requests": [[0.0, 200, 0.01, None, False], [0.25, None, 0.002, "connection refused", True]],
                    "load": {"reasons": {"HTTP 503": 2}, "failure_seconds": [], "x": [{"y": [1, "z"]}]}},
              "empty": {}, "none": None}  # fmt: skip
    text = bench.dumps(result)
    assert json.loads(text) == result
    assert text.splitlines()[3:5] == ["   [0.0, 200, 0.01, null, false],",
                                      '   [0.25, null, 0.002, "connection refused", true]']


def load(sent, failed, seconds, p50, p99):
    return {"sent": sent, "failed": failed, "seconds_with_failure": seconds, "reasons": {"HTTP 503": failed} if failed
            else {}, "p50_s": p50, "p99_s": p99}  # fmt: skip


def test_the_summary_and_table_take_every_case_in_order(tmp_path, monkeypatch, capsys):
    hosts = {"a": ["1", "1"], "b": ["1", "1"]}
    result = {"benchmark": "rollout", "baseline": {"load": {**load(240, 0, 0, 0.01, 0.1), "seconds": 60.0}},
              "three_way": {"change": "server_ctx_size=1024",
                            "rollout": {"seconds": 80.5, "load": load(1300, 0, 0, 0.012, 0.2),
                                        "restarted": ["a", "b"], "driver": hosts, "drained_s": {"a": 12, "b": 9}},
                            "serial": {"seconds": 30.0, "load": load(500, 5, 5, 0.01, 0.3), "restarted": ["a", "b"],
                                       "driver": hosts},
                            "parallel": {"seconds": 20.0, "load": load(300, 2474, 36, 0.02, 0.5),
                                         "restarted": ["a", "b"], "driver": hosts}},
              "bump": "abc", "bump_rollout": {"seconds": 170.0, "load": load(2700, 0, 0, 0.011, 0.15),
                                              "restarted": ["a"], "driver": hosts},
              "restore": {"returncode": 0}}  # fmt: skip
    summary = bench.summary(result)
    assert list(summary) == ["baseline", "three_way.rollout", "three_way.serial", "three_way.parallel", "bump_rollout"]
    assert summary["three_way.parallel"] == {"sent": 300, "failed": 2474, "seconds_with_failure": 36,
                                             "reasons": {"HTTP 503": 2474}, "p50_s": 0.02, "p99_s": 0.5,
                                             "seconds": 20.0, "p50_x": 2.0, "p99_x": 5.0}  # fmt: skip
    lines = bench.table(result).splitlines()
    assert lines[3] == "| `llamarack rollout` | 80.5 | 1,300 | 0 | 0 | 12.0 | 200.0 | 2 of 2 | 12 |"
    assert lines[5] == "| plain `pyinfra` (every host at once) | 20.0 | 300 | 2,474 | 36 | 20.0 | 500.0 | 2 of 2 |  |"
    assert lines[2].startswith("| quiet baseline | 60.0 | 240 | 0 | 0 |") and len(lines) == 7
    monkeypatch.setattr(bench, "RESULT", tmp_path / "rollout.json")
    bench.RESULT.write_text(bench.dumps(result))
    assert bench.main(["--table"]) == 0 and capsys.readouterr().out.splitlines() == lines


class FakeRack:
    hosts = [type("Host", (), {"name": n}) for n in ("a", "b", "lab-gw")]

    def host(self, name):
        return {"ip": "127.0.0.1"}


def test_the_three_way_run_writes_its_result(quick, tmp_path, monkeypatch):
    with FakeLlamaServer() as s:
        for name, value in {"GATEWAY_PORT": s.port, "BASELINE_S": 0.3, "RESULT": tmp_path / "rollout.json",
                            "JOURNAL": tmp_path / "journal.json"}.items():  # fmt: skip
            monkeypatch.setattr(bench, name, value)
        monkeypatch.setattr(bench.rackmod, "load", FakeRack)
        monkeypatch.setattr(bench.rackmod, "healthy", lambda rack: True)
        monkeypatch.setattr(bench, "pyinfra_deploy", lambda flags=(), data=(), must=False: {"returncode": 0})
        monkeypatch.setattr(bench, "rollout", lambda *a, **kw: {"returncode": 0})
        monkeypatch.setattr(bench, "servers", lambda rack, names: {n: "1 0" for n in names})
        monkeypatch.setattr(bench, "drivers", lambda rack, names: {n: "550.127.05" for n in names})
        assert bench.main(["--three-way-only"]) == 0
        result = json.loads(bench.RESULT.read_text())
        assert bench.main(["--baseline-only"]) == 0
    assert list(result) == ["benchmark", "provenance", "machine", "load", "baseline", "three_way", "summary"]
    stamp = result["provenance"]
    assert stamp["command"] == "python3 bench/rollout_bench.py --three-way-only" and len(stamp["commit"]) == 40
    assert {"bench/rollout_bench.py", "bench/loadgen.py", "bench/rollout_report.py", "bench/provenance.py"} \
        <= set(stamp["scripts"])  # fmt: skip
    assert stamp["scripts"]["bench/rollout_bench.py"] == bench.provenance.sha256(Path(bench.__file__))
    assert result["machine"]["cores"] >= 1 and result["machine"]["serving_hosts"] == 2
    assert result["load"]["requests_fields"] == ["started_s", "status", "latency_s", "reason", "streamed"]
    assert list(result["summary"]) == ["baseline", "three_way.rollout", "three_way.serial", "three_way.parallel"]
    assert all(v["failed"] == 0 and v["sent"] > 0 for v in result["summary"].values())
    again = json.loads(bench.RESULT.read_text())
    assert again["three_way"] == result["three_way"] and again["baseline"]["when"] >= stamp["started"]
    assert [r["command"] for r in again["provenance"]["runs"]] == [
        "python3 bench/rollout_bench.py --three-way-only", "python3 bench/rollout_bench.py --baseline-only"]
    assert again["provenance"]["mixed"] is False


def test_a_baseline_is_not_added_to_another_versions_result(tmp_path, monkeypatch):
    monkeypatch.setattr(bench, "RESULT", tmp_path / "rollout.json")
    stamp = bench.provenance.stamp(bench.__file__)
    bench.RESULT.write_text(json.dumps({"provenance": {**stamp, "scripts": {**stamp["scripts"],
                                                                            "bench/loadgen.py": "0" * 64}}}))
    with pytest.raises(SystemExit, match="run the whole bench"):
        bench.same_version(json.loads(bench.RESULT.read_text()), ["--baseline-only"])
    bench.same_version({"provenance": stamp}, ["--baseline-only"])  # the same version: added to

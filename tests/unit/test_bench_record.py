"""The host's llama-bench recorder (roles/server/files/bench_record.py) on real llama-bench output.

``tests/fixtures/llama-bench/cpu-lab-tiny.json``: what llama-bench printed
on a lab host (its ``-o json`` stdout, from the record the lab test left);
the recorder is run with ``sh -c 'cat FIXTURE'`` standing in for the binary
(a test double for the binary only: the parsing and the write are real).
"""

import json
import shlex
from pathlib import Path

from llamarack.roles.server.files import bench_record

FIXTURE = json.loads((Path(__file__).resolve().parents[1] / "fixtures/llama-bench/cpu-lab-tiny.json").read_text())
ENTRIES = FIXTURE["entries"]


def test_pp512_and_tg128_are_llama_benchs_own_averages():
    got = bench_record.figures(bench_record.parse(json.dumps(ENTRIES, indent=2)))
    pp = next(e for e in ENTRIES if e["n_prompt"] == 512 and e["n_gen"] == 0)
    tg = next(e for e in ENTRIES if e["n_gen"] == 128 and e["n_prompt"] == 0)
    assert got["pp512"]["tokens_per_second"] == round(pp["avg_ts"], 2)
    assert got["tg128"]["tokens_per_second"] == round(tg["avg_ts"], 2)
    assert got["tg128"]["repetitions"] == len(tg["samples_ts"])


def _bench(tmp_path, exit_code=0):
    stdout = tmp_path / "bench.stdout"
    stdout.write_text(json.dumps(ENTRIES, indent=2) + "\n")
    return ("/bin/sh", "-c", f"cat {shlex.quote(str(stdout))}; echo 'llama-bench log line' >&2; exit {exit_code}")


def test_the_record_is_written_whole_beside_its_inputs(tmp_path):
    out = tmp_path / "state/bench.json"
    entry = {"key": {"build": "b1", "model": "m1"}, "on_card": True,
             "roofline": {"tokens_per_second": 2 * FIXTURE["tg128"]}}  # fmt: skip
    assert bench_record.main(str(out), json.dumps(entry), *_bench(tmp_path)) == 0
    record = json.loads(out.read_text())
    assert record["key"] == {"build": "b1", "model": "m1"}
    assert record["tg128"]["tokens_per_second"] == FIXTURE["tg128"]
    assert record["roofline_fraction"] == 0.5
    assert record["llama_bench"]["entries"] == ENTRIES and record["llama_bench"]["args"][-1].endswith("exit 0")
    assert sorted(p.name for p in out.parent.iterdir()) == ["bench.json", "bench.log"]  # no .new left
    assert "llama-bench log line" in (out.parent / "bench.log").read_text()


def test_a_cpu_measurement_has_no_roofline_fraction(tmp_path):
    out = tmp_path / "bench.json"
    entry = {"key": {}, "on_card": False, "roofline": {"tokens_per_second": 977.0}}
    assert bench_record.main(str(out), json.dumps(entry), *_bench(tmp_path)) == 0
    assert json.loads(out.read_text())["roofline_fraction"] is None


def test_a_failed_bench_replaces_nothing_and_says_why(tmp_path):
    out = tmp_path / "bench.json"
    out.write_text('{"key": "the previous record"}\n')
    problem = bench_record.main(str(out), "{}", *_bench(tmp_path, exit_code=3))
    assert problem.startswith("llama-bench exited 3") and "llama-bench log line" in problem
    assert out.read_text() == '{"key": "the previous record"}\n'

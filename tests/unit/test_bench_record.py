"""The host's llama-bench recorder (roles/server/files/bench_record.py) on real llama-bench output.

``tests/fixtures/llama-bench/cpu-lab-tiny.json``: what llama-bench printed
on a lab host (its ``-o json`` stdout, from the record the lab test left);
the recorder is run with ``sh -c 'cat FIXTURE'`` standing in for the binary
(a test double for the binary only: the parsing and the write are real).
"""

import json
import shlex
from pathlib import Path

from roles.server.files import bench_record

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


# -- the record of a host's units --


def _part(tmp_path, n, key, tg):
    part = tmp_path / f"bench.{n}.json"
    part.write_text(json.dumps({"key": key, "mode": "stopped", "served": {"gpu_layers": 3}, "seconds": 1.5,
                                "pp512": {"tokens_per_second": 10.0 * tg}, "tg128": {"tokens_per_second": tg},
                                "roofline_fraction": 0.5, "llama_bench": {"args": [str(n)]}}))  # fmt: skip
    return str(part)


def test_the_join_records_each_unit_with_its_measurement_or_the_one_it_shares(tmp_path):
    key = {"build": "b1", "model": "m1"}
    units = {"units": [{"name": "u@0", "index": 0, "cards": ["G0"], "part": _part(tmp_path, 0, key, 50.0)},
                       {"name": "u@1", "index": 1, "cards": ["G1"], "as": "u@0"},
                       {"name": "u@2", "index": 2, "cards": ["G2"], "part": _part(tmp_path, 1, key, 40.0)}],
             "alternative": [{"name": "split: cards 0, 1", "cards": ["G0", "G1"],
                              "part": _part(tmp_path, 2, key, 45.0)}]}  # fmt: skip
    out = tmp_path / "bench.json"
    assert bench_record.join(str(out), json.dumps(units)) == 0
    record = json.loads(out.read_text())
    # the top level: the first measurement whole, as a record of one unit has it
    assert record["key"] == key and record["tg128"] == {"tokens_per_second": 50.0} and record["seconds"] == 1.5
    assert [u["tg128"]["tokens_per_second"] for u in record["units"]] == [50.0, 50.0, 40.0]
    assert record["units"][1] == {"name": "u@1", "index": 1, "cards": ["G1"], "as": "u@0",
                                  "pp512": {"tokens_per_second": 500.0},
                                  "tg128": {"tokens_per_second": 50.0}, "roofline_fraction": 0.5}  # fmt: skip
    assert record["units"][2]["llama_bench"] == {"args": ["1"]} and "part" not in record["units"][2]
    assert record["alternative"][0]["tg128"] == {"tokens_per_second": 45.0}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bench.json"]  # the parts removed, no .new left
    # the readers
    assert [e["name"] for e in bench_record.entries(record)] == ["u@0", "u@1", "u@2"]
    assert [e["name"] for e in bench_record.entries(record, serving=False)][-1] == "split: cards 0, 1"
    assert bench_record.of_unit(record, "u@2")["index"] == 2 and bench_record.of_unit(record, "u@1")["as"] == "u@0"
    assert bench_record.of_unit(record, "u@9") is None and bench_record.of_cards(record, ["G9"]) is None
    assert bench_record.tokens_per_second(bench_record.of_cards(record, ("G2",)), "tg128") == 40.0
    # a unit over cards the host did not serve so when measured: the layout measured beside
    assert bench_record.of_cards(record, ["G0", "G1"])["name"] == "split: cards 0, 1"


def test_a_record_from_before_units_were_listed_reads_as_one_figure_for_every_unit():
    older = json.loads("\n".join(json.loads((Path(__file__).resolve().parents[1] /
                                             "facts/BenchRecord/cpu-lab.json").read_text())["output"]))  # fmt: skip
    (entry,) = bench_record.entries(older)
    assert entry["name"] is None and entry["tg128"] == older["tg128"]
    assert bench_record.of_unit(older, "llamarack-server@3.service") == entry == bench_record.of_cards(older, ["G7"])
    assert bench_record.tokens_per_second(entry, "tg128") == older["tg128"]["tokens_per_second"]
    assert bench_record.entries(None) == [] and bench_record.tokens_per_second(None, "tg128") is None


def test_a_join_of_measurements_of_another_build_or_a_share_of_nothing_writes_nothing(tmp_path):
    out = tmp_path / "bench.json"
    out.write_text('{"key": "the previous record"}\n')
    mixed = {"units": [{"name": "u@0", "part": _part(tmp_path, 0, {"build": "b1"}, 50.0)},
                       {"name": "u@1", "part": _part(tmp_path, 1, {"build": "b0"}, 50.0)}]}  # fmt: skip
    assert "measured {'build': 'b0'}, not {'build': 'b1'}" in bench_record.join(str(out), json.dumps(mixed))
    orphan = {"units": [{"name": "u@1", "as": "u@0"}]}
    assert "which no unit before it is" in bench_record.join(str(out), json.dumps(orphan))
    assert out.read_text() == '{"key": "the previous record"}\n'


def test_each_measurement_logs_beside_itself(tmp_path):
    out = tmp_path / "bench.3.json"
    assert bench_record.main(str(out), json.dumps({"key": {}}), *_bench(tmp_path)) == 0
    assert (tmp_path / "bench.3.log").read_text().strip() == "llama-bench log line"

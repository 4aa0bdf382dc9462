"""The bench on a host of several units: each distinct unit measured on its own cards with its
own flags, alike units sharing one measurement ("as"), the record per unit, and the layout
the ledger alone cannot choose settled by the record. Facts in, commands out; the record is
joined here by the host's own script (roles/server/files/bench_record.py)."""

import json
import shlex
from pathlib import Path

from llamarack.layout import unit_path
from roles.model.shapes import shape_from_config
from roles.gateway.plan import backends_of, serving_host
from roles.model.reads import GgufShape
from roles.server.files import bench_record
from roles.server.operations import bench, service
from roles.server.plan import host_layouts
from tests.roles.test_draft_bench_ops import bench_facts, joined, measured
from tests.roles.test_server_multicard import (EIGHT, GEMMA27B, MIXED, TWO, converged, outside_preflights_read,
                                               uploads)  # fmt: skip
from tests.roles.test_server_ops import ROOT, settings
from tests.support.ophost import fact_key, run_op

LLAMA8B = shape_from_config(json.loads((Path(__file__).resolve().parents[1] / "fixtures/configs/"
                                        "llama-3.1-8b-instruct.config.json").read_text()), "Q4_K_M")  # fmt: skip
# Llama-3.1-8B Q4_K_M with 4 slots on V100s 16 GB: one card alone holds every layer at 74,240
# tokens per slot, two hold the trained 131,072: the ledger offers a trade, not an answer.
CONTESTED = {"server_parallel": 4}


def with_shape(shape, record=None) -> dict:
    f = bench_facts(record)
    for path in (f"{ROOT}/models/m1/model.gguf", f"{ROOT}/models/current/model.gguf"):
        f[fact_key(GgufShape, path=path)] = shape
    return f


def record_of(commands, tmp_path, tg=lambda n, entry: 50.0 + n) -> dict:
    """The record the host would hold after these commands: each run's measurement written as
    llama-bench's figures would be (tg128 ``tg(n, its entry)``), then the join run here."""
    *runs, join = commands
    units = joined(join)
    for n, command in enumerate(runs):
        part = tmp_path / f"bench.{n}.json"
        entry = measured(command, n)
        part.write_text(json.dumps({**entry, "pp512": {"tokens_per_second": 900.0 + n},
                                    "tg128": {"tokens_per_second": tg(n, entry)}}))  # fmt: skip
        for e in units["units"] + units["alternative"]:
            if e.get("part") == f"{ROOT}/state/bench.{n}.json":
                e["part"] = str(part)
    out = tmp_path / "bench.json"
    assert bench_record.join(str(out), json.dumps(units)) == 0
    assert not list(tmp_path.glob("bench.*.json"))  # the parts are removed once joined
    return json.loads(out.read_text())


def test_an_eight_card_per_card_host_runs_llama_bench_once_and_records_every_unit(tmp_path):
    commands, _ = run_op(bench, bench_facts(), settings=settings(), gpus=EIGHT)
    run, join = commands
    assert run.startswith(f"systemctl stop llamarack-server@0.service; env CUDA_VISIBLE_DEVICES={EIGHT[0].uuid} "
                          "python3 -c ")  # fmt: skip
    assert "http://127.0.0.1:8080/health" in run and "llamarack-server@1.service" not in run
    record = record_of(commands, tmp_path)
    units = record["units"]
    assert [u["name"] for u in units] == [f"llamarack-server@{i}.service" for i in range(8)]
    assert [u["port"] for u in units] == [8080 + i for i in range(8)]
    assert [u["cards"] for u in units] == [[g.uuid] for g in EIGHT]
    assert "as" not in units[0] and all(u["as"] == "llamarack-server@0.service" for u in units[1:])
    assert {u["tg128"]["tokens_per_second"] for u in units} == {50.0} and record["tg128"]["tokens_per_second"] == 50.0
    # the top level is unit 0's measurement, as a record of one unit has it (its readers read it)
    assert record["unit"]["name"] == "llamarack-server@0.service" and record["key"] == {"build": "b1", "model": "m1"}
    assert "alternative" not in record


def test_a_split_unit_is_measured_over_its_cards_with_its_split():
    (run, join), _ = run_op(bench, with_shape(GEMMA27B), settings=settings(), gpus=TWO)
    assert " -ngl 63 " in run and " -sm layer -ts 33/30 -mg 1" in run
    assert f"CUDA_VISIBLE_DEVICES={TWO[0].uuid},{TWO[1].uuid} " in run
    (unit,) = joined(join)["units"]
    assert unit["split_args"] == ["--split-mode", "layer", "--tensor-split", "33,30", "--main-gpu", "1"]
    assert unit["name"] == "llamarack-server.service" and unit["card_names"] == ["Tesla V100-SXM2-16GB"] * 2


def test_a_mixed_host_measures_each_kind_of_card(tmp_path):
    commands, _ = run_op(bench, bench_facts(), settings=settings(), gpus=MIXED)
    assert len(commands) == 3  # the 3090's unit, the first P40's, the join
    assert f"CUDA_VISIBLE_DEVICES={MIXED[0].uuid} " in commands[0] and f"={MIXED[1].uuid} " in commands[1]
    record = record_of(commands, tmp_path)
    assert [u.get("as") for u in record["units"]] == [None, None] + ["llamarack-server@1.service"] * 2
    assert [u["tg128"]["tokens_per_second"] for u in record["units"]] == [50.0, 51.0, 51.0, 51.0]
    assert record["units"][0]["roofline"]["card"] != record["units"][1]["roofline"]["card"]


def test_a_current_record_of_every_unit_is_a_noop_read_in_preflights_one_read(tmp_path):
    from roles.llamacpp.reads import BenchRecord

    s = settings(server_layout="per_card")
    record = record_of(run_op(bench, bench_facts(), settings=s, gpus=EIGHT)[0], tmp_path)
    host, _ = converged(s, EIGHT)
    host[fact_key(BenchRecord, path=f"{ROOT}/state/bench.json")] = record
    commands, noops, outside = outside_preflights_read(bench, host, s, EIGHT)
    assert commands == [] and outside == []
    assert noops == ["llama-bench has measured build b1 with model m1: pp512 900.0 t/s, tg128 50.0 t/s "
                     "(8 units, 1 measured, the others as one of them)"]  # fmt: skip


def test_a_unit_whose_plan_the_record_lacks_is_measured_again(tmp_path):
    record = record_of(run_op(bench, bench_facts(), settings=settings(), gpus=EIGHT)[0], tmp_path)
    # the same build and model, now split over both cards (the settings changed): no figure of that plan
    commands, noops = run_op(bench, bench_facts(record), settings=settings(server_layout="split"), gpus=EIGHT[:2])
    assert noops == [] and len(commands) == 2 and " -sm layer " in commands[0]
    # the same plan on a card of the same kind (a card back): its figure is there
    commands, noops = run_op(bench, bench_facts(record), settings=settings(), gpus=EIGHT[:3])
    assert commands == [] and noops[0].startswith("llama-bench has measured build b1 with model m1")


def test_a_record_from_before_units_were_listed_stands_for_every_unit():
    older = {"key": {"build": "b1", "model": "m1"}, "pp512": {"tokens_per_second": 900.5},
             "tg128": {"tokens_per_second": 61.2}, "unit": {"name": "llamarack-server@0.service", "of": 8}}
    commands, noops = run_op(bench, bench_facts(older), settings=settings(), gpus=EIGHT)
    assert commands == [] and noops == [
        "llama-bench has measured build b1 with model m1: pp512 900.5 t/s, tg128 61.2 t/s"]
    assert bench_record.of_unit(older, "llamarack-server@5.service")["tg128"]["tokens_per_second"] == 61.2
    assert bench_record.of_cards(older, [EIGHT[3].uuid]) == bench_record.of_unit(older)


# -- the layout the ledger alone cannot choose --


def test_where_the_ledger_cannot_choose_the_bench_measures_the_split_beside(tmp_path):
    s = settings(**CONTESTED)
    commands, _ = run_op(bench, with_shape(LLAMA8B), settings=s, gpus=TWO)
    per_card, split, join = commands
    assert per_card.startswith(f"systemctl stop llamarack-server@0.service; env CUDA_VISIBLE_DEVICES={TWO[0].uuid} ")
    # the split over both cards: both units stopped for it, both must answer /health again
    assert split.startswith("systemctl stop llamarack-server@0.service llamarack-server@1.service; env "
                            f"CUDA_VISIBLE_DEVICES={TWO[0].uuid},{TWO[1].uuid} ")  # fmt: skip
    assert " -sm layer -ts 16/17 -mg 1" in split and split.count("http://127.0.0.1:808") == 2
    units = joined(join)
    assert [u["name"] for u in units["alternative"]] == ["split: cards 0, 1"]
    assert [u.get("as") for u in units["units"]] == [None, "llamarack-server@0.service"]
    # beside: the split would need the cards the units fill; it is not measured
    assert len(run_op(bench, with_shape(LLAMA8B), settings=settings(**CONTESTED, server_bench="beside"),
                      gpus=TWO)[0]) == 2  # fmt: skip


def test_the_record_settles_the_layout_by_the_hosts_total_tg128(tmp_path):
    s = settings(**CONTESTED)
    missing = host_layouts(s, LLAMA8B, TWO, None, None, "m1")[0]
    assert missing.chosen == "per_card" and missing.reason.endswith(
        "; the ledger alone cannot choose: per_card serves 2 units of 74,240 tokens per slot, split serves 1 unit "
        "of 131,072 tokens per slot; no llama-bench record of model m1 on this host yet (the bench measures both "
        "layouts after a new build or model, with server_bench = 'stopped'): per_card, the ledger's answer")
    commands, _ = run_op(bench, with_shape(LLAMA8B), settings=s, gpus=TWO)
    slow_cards = record_of(commands, tmp_path, tg=lambda n, e: 40.0 if e["unit"]["split_args"] else 15.0)
    layout = host_layouts(s, LLAMA8B, TWO, None, slow_cards, "m1")[0]
    assert layout.chosen == "split" and [u.cards for u in layout.units] == [(0, 1)]
    assert layout.contested.endswith("the llama-bench record (build b1, model m1): tg128 split 40 t/s in 1 unit "
                                     "against per_card 2 x 15 = 30 t/s: split")  # fmt: skip
    fast_cards = record_of(commands, tmp_path, tg=lambda n, e: 40.0 if e["unit"]["split_args"] else 38.0)
    assert host_layouts(s, LLAMA8B, TWO, None, fast_cards, "m1")[0].chosen == "per_card"
    # a record of another model decides nothing, nor does one when the bench is off
    assert host_layouts(s, LLAMA8B, TWO, None, slow_cards, "m2")[0].chosen == "per_card"
    assert "server_bench = 'off'" in host_layouts(settings(**CONTESTED, server_bench="off"), LLAMA8B, TWO, None,
                                                  slow_cards, "m1")[0].reason  # fmt: skip
    # the deploy serves what the record decided; the bench then finds every unit measured
    facts = with_shape(LLAMA8B, slow_cards)
    written = uploads(run_op(service, facts, settings=s, gpus=TWO)[0])
    assert "--split-mode layer --tensor-split 16,17" in written[unit_path("llamarack-server.service") + ".new"]
    commands, noops = run_op(bench, facts, settings=s, gpus=TWO)
    assert commands == [] and noops[0].startswith("llama-bench has measured build b1 with model m1")
    # the gateway finds the split unit's figure where the bench measured it, beside the units then served
    units = json.loads(written[f"{ROOT}/state/units.json.new"])
    units["units"][0]["listen"] = "0.0.0.0"  # as a unit behind a gateway listens
    (split_unit,) = backends_of(serving_host("gpu01", "10.0.0.5", s), units, slow_cards)
    assert split_unit.tg128 == 40.0


def test_a_wanted_context_or_a_card_that_holds_the_trained_one_leaves_nothing_to_settle():
    from roles.server.card_layout import cards_of, choose_layout, rival_layout
    from roles.server.plan import knobs

    for data, shape in (({**CONTESTED, "server_ctx_size": 32768}, LLAMA8B),  # a wanted context: per_card serves it
                        ({}, LLAMA8B),  # one slot: one card holds the trained 131,072
                        (CONTESTED, GEMMA27B)):  # no card holds every layer alone: a split
        s = settings(**data)
        chosen = choose_layout(shape, knobs(s), cards_of(TWO), "auto")
        assert rival_layout(shape, knobs(s), cards_of(TWO), chosen) is None, data
        assert "cannot choose" not in host_layouts(s, shape, TWO)[0].reason
    # per_card or split asked: the settings chose
    s = settings(**CONTESTED, server_layout="per_card")
    assert rival_layout(LLAMA8B, knobs(s), cards_of(TWO), choose_layout(LLAMA8B, knobs(s), cards_of(TWO),
                                                                         "per_card")) is None  # fmt: skip


# -- the record's readers: the audit, the gateway --


def test_the_audits_bench_item_checks_every_unit(tmp_path):
    from roles.llamacpp.reads import BenchRecord
    from tests.roles.test_server_multicard import audit_of

    s = settings(server_layout="per_card")
    record = record_of(run_op(bench, bench_facts(), settings=s, gpus=EIGHT)[0], tmp_path)
    host, _ = converged(s, EIGHT)
    host[fact_key(BenchRecord, path=f"{ROOT}/state/bench.json")] = record
    item = audit_of(s, host, EIGHT)["bench"]
    assert not item.drift and item.wanted["units"] == [f"llamarack-server@{i}.service" for i in range(8)]
    assert item.found["tg128"] == 50.0 and [u["tg128"] for u in item.found["units"]] == [50.0] * 8
    assert [u.get("as") for u in item.found["units"]] == [None] + ["llamarack-server@0.service"] * 7
    # the same build and model, the host now split over two cards: no figure of that plan
    split = settings(server_layout="split")
    host2, _ = converged(split, EIGHT[:2])
    host2[fact_key(BenchRecord, path=f"{ROOT}/state/bench.json")] = record
    item = audit_of(split, host2, EIGHT[:2])["bench"]
    assert item.drift and item.wanted["why"] == "no figure of llamarack-server.service (its cards or plan changed)"
    # a record from before units were listed, of the served build and model: current, as it was
    host[fact_key(BenchRecord, path=f"{ROOT}/state/bench.json")] = {k: v for k, v in record.items() if k != "units"}
    item = audit_of(s, host, EIGHT)["bench"]
    assert not item.drift and "units" not in item.found and item.wanted == {"build": "b1", "model": "m1"}
    # another build: the deploy measures again
    host[fact_key(BenchRecord, path=f"{ROOT}/state/bench.json")] = {**record, "key": {"build": "b0", "model": "m1"}}
    assert audit_of(s, host, EIGHT)["bench"].drift


def test_the_gateway_gives_each_unit_its_own_tg128(tmp_path):
    h = serving_host("gpu01", "10.0.0.5", settings())
    units = {"units": [{"index": i, "port": 8080 + i, "listen": "0.0.0.0", "parallel": 1, "cards": [g.uuid]}
                       for i, g in enumerate(MIXED)]}  # fmt: skip
    record = record_of(run_op(bench, bench_facts(), settings=settings(), gpus=MIXED)[0], tmp_path)
    assert [b.tg128 for b in backends_of(h, units, record)] == [50.0, 51.0, 51.0, 51.0]
    # a unit on cards no entry was measured on (a layout the record has not seen): no figure, no alert rule
    units["units"][3]["cards"] = ["GPU-elsewhere"]
    assert backends_of(h, units, record)[3].tg128 is None
    # a record from before units were listed: its one figure for every unit, as it was read
    older = {"key": record["key"], "tg128": {"tokens_per_second": 31.5}}
    assert [b.tg128 for b in backends_of(h, units, older)] == [31.5] * 4
    assert [b.tg128 for b in backends_of(h, units, None)] == [None] * 4

"""Hosts of several cards: one llama-server unit per card, or one over several, each with
its port, its cards (CUDA_VISIBLE_DEVICES by UUID), health and residency lines; units a
card no longer makes retired; state/units.json. Facts in, commands out."""

import dataclasses
import hashlib
import json
from pathlib import Path

from pyinfra.facts.files import FileContents

from llamarack.layout import unit_path
from roles.model.shapes import shape_from_config
from roles.driver.reads import CharDevices, NvidiaSmi
from roles.model.reads import GgufShape
from roles.server.operations import rollback, service
from roles.server.reads import ServedUnits
from tests.roles.test_server_ops import (ROOT, SHAPE, UNIT, UNIT_SHA1, V100, facts, first_run, found_unit,
                                         settings)  # fmt: skip
from tests.support.ophost import fact_key, run_op

HERE = Path(__file__).resolve().parent
FACTS = HERE.parent / "facts"


def gpus(case: str) -> tuple:
    """A host's cards as preflight reads them (tests/facts/NvidiaSmi/<case>.json)."""
    return NvidiaSmi().process(json.loads((FACTS / "NvidiaSmi" / f"{case}.json").read_text())["output"]).gpus


EIGHT = gpus("v100_sxm2_eight_gpus")
TWO = gpus("v100_two_gpus")
MIXED = gpus("rtx3090_beside_three_p40s")
GEMMA27B = shape_from_config(json.loads((HERE.parent / "fixtures/configs/gemma-3-27b-it.config.json").read_text()),
                             "Q4_K_M")  # fmt: skip


def uploads(commands) -> dict:
    """{path: text} of every file the commands upload."""
    return {c[1]: c[2] for c in commands if isinstance(c, tuple) and c[0] == "upload"}


def units_of(commands) -> dict:
    """{unit name: its file} among the uploads."""
    return {Path(p).name[: -len(".new")]: t for p, t in uploads(commands).items() if p.startswith("/etc/systemd/")}


def line(unit: str, prefix: str) -> str:
    return next(x for x in unit.splitlines() if x.startswith(prefix))


def converged(settings_, cards, shape=SHAPE) -> tuple:
    """The facts of a host already serving what ``service`` writes for these cards."""
    commands, _ = run_op(service, facts(shape=shape), settings=settings_, gpus=cards)
    units = units_of(commands)
    record = uploads(commands)[f"{ROOT}/state/units.json.new"]
    found = {n: found_unit(n, hashlib.sha1(t.encode()).hexdigest(), True, lines=t.rstrip("\n").split("\n"))
             for n, t in units.items()}  # fmt: skip
    return facts(unit_sha1="x", shape=shape, units=found, units_json=record.rstrip("\n")), units


def test_eight_v100s_per_card_make_eight_units_each_on_its_card_and_port():
    commands, noops = run_op(service, facts(), settings=settings(server_layout="per_card"), gpus=EIGHT)
    units = units_of(commands)
    assert sorted(units) == [f"llamarack-server@{i}.service" for i in range(8)] and noops == []
    for i, g in enumerate(EIGHT):
        unit = units[f"llamarack-server@{i}.service"]
        assert line(unit, "Environment=CUDA_VISIBLE_DEVICES=") == f"Environment=CUDA_VISIBLE_DEVICES={g.uuid}"
        assert f"--port {8080 + i} " in line(unit, "ExecStart=") and "--split-mode" not in unit
        assert line(unit, "# llamarack health: ") == f"# llamarack health: http://127.0.0.1:{8080 + i}/health"
        assert line(unit, "# llamarack residency: ") == f"# llamarack residency: {g.uuid} 0"
        assert "DeviceAllow=char-nvidia rw" in unit and "--ctx-size 2048" in unit
    record = json.loads(uploads(commands)[f"{ROOT}/state/units.json.new"])
    assert [(u["index"], u["unit"], u["port"], u["cards"]) for u in record["units"]] == [
        (i, f"llamarack-server@{i}.service", 8080 + i, [g.uuid]) for i, g in enumerate(EIGHT)]
    # one switch for the eight, each in its own subshell: one that fails rolls back only itself
    (switch,) = [c for c in commands if isinstance(c, str) and "flock" in c]
    assert switch.count("systemctl restart ") == 16 and '|| failed="$failed llamarack-server@7.service"' in switch
    assert switch.index("llamarack-server@0.service") < switch.index("llamarack-server@7.service")


def test_a_converged_eight_card_host_changes_nothing():
    s = settings(server_layout="per_card")
    host, units = converged(s, EIGHT)
    commands, noops = run_op(service, host, settings=s, gpus=EIGHT)
    assert commands == [] and len(noops) == 1
    assert noops[0].startswith("llama-server serves m1 with build b1 in 8 units (per_card (asked): ")
    assert "llamarack-server@7.service on port 8087: ctx 2048" in noops[0]


def test_the_write_ups_27b_on_two_v100s_is_one_unit_split_over_both():
    """auto: 58 of 63 layers fit one V100 16 GB; the two hold all 63 with llama.cpp's layer split."""
    commands, _ = run_op(service, facts(shape=GEMMA27B), settings=settings(), gpus=TWO)
    (name, unit), = units_of(commands).items()
    assert name == "llamarack-server.service"  # one unit: the host's one name, on server_port
    assert unit == (HERE / "expected/llamarack-server-split.service").read_text()
    start = line(unit, "ExecStart=")
    assert "--n-gpu-layers 63 " in start and "--split-mode layer --tensor-split " in start and "--main-gpu 1" in start
    assert line(unit, "Environment=CUDA_VISIBLE_DEVICES=") == f"Environment=CUDA_VISIBLE_DEVICES={TWO[0].uuid},{TWO[1].uuid}"
    assert line(unit, "# llamarack residency: ").startswith(f"# llamarack residency: {TWO[0].uuid},{TWO[1].uuid} ")


def test_a_3090_beside_three_p40s_gets_a_unit_per_card_each_planned_for_its_own():
    commands, _ = run_op(service, facts(), settings=settings(), gpus=MIXED)
    units = units_of(commands)
    assert len(units) == 4
    assert "Environment=CUDA_VISIBLE_DEVICES=" + MIXED[0].uuid in units["llamarack-server@0.service"]
    for i in range(4):
        assert line(units[f"llamarack-server@{i}.service"], "Description=").endswith("fits 23040 MiB)")
    # the 27B in F16 needs cards together: units over the largest first, the rest free or alone
    f16 = shape_from_config(json.loads((HERE.parent / "fixtures/configs/gemma-3-27b-it.config.json").read_text()), "F16")
    commands, _ = run_op(service, facts(shape=f16), settings=settings(), gpus=MIXED)
    (unit,) = units_of(commands).values()
    assert "--tensor-split " in line(unit, "ExecStart=")


def test_a_card_that_goes_retires_its_unit_and_one_that_comes_back_gets_it_again(caplog):
    s = settings(server_layout="per_card")
    host, units = converged(s, EIGHT)
    without = EIGHT[:3] + EIGHT[4:]  # card 3 fell off the bus
    commands, _ = run_op(service, host, settings=s, gpus=without)
    retire = next(c for c in commands if isinstance(c, str) and c.startswith("systemctl disable --now "))
    assert retire.startswith("systemctl disable --now llamarack-server@3.service >/dev/null 2>&1 || true; rm -f "
                             f"{unit_path('llamarack-server@3.service')} ")  # fmt: skip
    assert f"{ROOT}/state/previous@3.service {ROOT}/state/rollback@3.json" in retire
    assert "retiring llamarack-server@3.service: its card GPU-0b7e2c41-6d3a-4f5e-9c18-7a2d4e6f8b03 no longer listed" \
        in caplog.text
    assert units_of(commands) == {}  # the other seven keep their units, ports and cards
    record = json.loads(uploads(commands)[f"{ROOT}/state/units.json.new"])
    assert [u["port"] for u in record["units"]] == [8080, 8081, 8082, 8084, 8085, 8086, 8087]
    # back: its unit again, the same N and port
    host[fact_key(ServedUnits, state=f"{ROOT}/state", health=True)] = {
        n: f for n, f in host[fact_key(ServedUnits, state=f"{ROOT}/state", health=True)].items() if n != "llamarack-server@3.service"}
    commands, _ = run_op(service, host, settings=s, gpus=EIGHT)
    assert units_of(commands) == {"llamarack-server@3.service": units["llamarack-server@3.service"]}


def test_going_from_one_unit_to_several_retires_the_one_first():
    s = settings(server_layout="per_card")
    one = facts(unit_sha1=UNIT_SHA1, running=True, units={"llamarack-server.service": found_unit(
        sha1=UNIT_SHA1, running=True, lines=UNIT.rstrip("\n").split("\n"))})  # fmt: skip
    commands, _ = run_op(service, one, settings=s, gpus=TWO)
    strings = [c for c in commands if isinstance(c, str)]
    retire = next(i for i, c in enumerate(strings) if c.startswith("systemctl disable --now llamarack-server.service"))
    switch = next(i for i, c in enumerate(strings) if "flock" in c)
    assert retire < switch and sorted(units_of(commands)) == ["llamarack-server@0.service", "llamarack-server@1.service"]


def test_the_one_card_host_is_unchanged():
    commands, _ = first_run(settings())
    assert units_of(commands) == {"llamarack-server.service": UNIT}
    assert "CUDA_VISIBLE_DEVICES" not in UNIT
    commands, noops = run_op(service, facts(unit_sha1=UNIT_SHA1, running=True), settings=settings(), gpus=(V100,))
    assert commands == [] and len(noops) == 1


def test_diff_shows_each_units_file(caplog):
    import logging

    with caplog.at_level(logging.INFO, logger="pyinfra"):
        run_op(service, facts(), diff=True, settings=settings(server_layout="per_card"), gpus=TWO)
    assert f"Will create {unit_path('llamarack-server@0.service')}" in caplog.text
    assert f"Will create {unit_path('llamarack-server@1.service')}" in caplog.text


def test_rollback_puts_back_every_unit_with_a_previous_one_or_only_the_one_asked():
    from roles.llamacpp.reads import BuildSeals, Seals

    old = ["# llamarack health: http://127.0.0.1:8081/health",
           f"ExecStart={ROOT}/builds/b0/bin/llama-server --model {ROOT}/models/m0/model.gguf --port 8081"]
    state = {fact_key(ServedUnits, state=f"{ROOT}/state", health=True): {
                 f"llamarack-server@{i}.service": found_unit(f"llamarack-server@{i}.service", lines=old) for i in (0, 1)},
             fact_key(FileContents, path=f"{ROOT}/state/previous@0.service"): None,
             fact_key(FileContents, path=f"{ROOT}/state/previous@1.service"): old,
             fact_key(BuildSeals, root=ROOT): Seals({"b0": []})}  # fmt: skip
    commands, _ = run_op(rollback, state, settings=settings())
    check, copy, switch, pin = commands
    assert copy == (f"cp -p {ROOT}/state/previous@1.service {unit_path('llamarack-server@1.service')}.new && "
                    f"chmod 644 {unit_path('llamarack-server@1.service')}.new")  # fmt: skip
    assert "llamarack-server@0.service" not in switch and f"> {ROOT}/state/rollback@1.json.new" in pin
    (refused,), _ = run_op(rollback, state, settings=settings(), unit=0)
    assert "rollback: no previous unit" in refused and "previous@0.service" in refused


def test_units_json_is_written_only_when_it_differs():
    commands, _ = run_op(service, facts(unit_sha1=UNIT_SHA1, running=True), settings=settings(), gpus=(V100,))
    assert commands == []
    stale = facts(unit_sha1=UNIT_SHA1, running=True, units_json='{"units": []}')
    commands, _ = run_op(service, stale, settings=settings(), gpus=(V100,))
    assert list(uploads(commands)) == [f"{ROOT}/state/units.json.new"]


def test_units_are_read_in_one_fact_with_their_pins_and_health(tmp_path):
    """The fact's command run here on unit files made in a folder (systemd's stands in)."""
    import subprocess

    (tmp_path / "sys").mkdir()
    (tmp_path / "state").mkdir()
    (tmp_path / "sys/llamarack-server@0.service").write_text("# llamarack health: http://127.0.0.1:9/health\n[Unit]\n")
    (tmp_path / "sys/llamarack-server@1.service").write_text("[Unit]\nDescription=no newline")
    (tmp_path / "sys/llamarack-server@1.service.prev").write_text("")
    (tmp_path / "sys/llamarack-server@x.service").write_text("")  # not a unit the role makes
    (tmp_path / "state/rollback@1.json").write_text('{"unit_sha1": "a"}\n')
    fact = ServedUnits()
    command = fact.command(state=str(tmp_path / "state"), health=True).replace("/etc/systemd/system",
                                                                                str(tmp_path / "sys"))
    found = fact.process(subprocess.run(["sh", "-c", command], capture_output=True, text=True).stdout.splitlines())
    assert sorted(found) == ["llamarack-server@0.service", "llamarack-server@1.service"]
    zero, one = found["llamarack-server@0.service"], found["llamarack-server@1.service"]
    assert zero.lines == ("# llamarack health: http://127.0.0.1:9/health", "[Unit]") and zero.health is None
    assert zero.sha1 == hashlib.sha1((tmp_path / "sys/llamarack-server@0.service").read_bytes()).hexdigest()
    assert one.lines == ("[Unit]", "Description=no newline") and one.prev and one.pin == ('{"unit_sha1": "a"}',)
    assert not zero.prev and zero.pin is None


def outside_preflights_read(op, host: dict, s, cards) -> tuple:
    """(commands, no-op messages, the reads ``op`` made that are not among preflight's one read
    (its own and each role's)) of ``op`` run on a host whose facts are ``host``."""
    from llamarack.facts import FactRead
    from roles.preflight.reads import preflight_reads, role_reads

    read_here = []

    class Recording(dict):
        def __contains__(self, key):
            if isinstance(key, tuple) and len(key) == 2 and isinstance(key[1], frozenset):
                read_here.append(FactRead.of(key[0], **dict(key[1])))
            return super().__contains__(key)

    commands, noops = run_op(op, Recording(host), settings=s, gpus=cards)
    assert FactRead.of(ServedUnits, state=f"{ROOT}/state", health=True) in read_here
    batched = set(preflight_reads(s) + role_reads(s))
    return commands, noops, [r for r in dict.fromkeys(read_here) if r not in batched]


def test_a_converged_eight_card_host_reads_everything_in_preflights_one_read():
    """Every read the service operation makes on a converged 8-card host is one of preflight's
    one read (its own and each role's), whatever the count of units: no read per unit."""
    s = settings(server_layout="per_card")
    host, _ = converged(s, EIGHT)
    commands, _, outside = outside_preflights_read(service, host, s, EIGHT)
    assert commands == [] and outside == []


def audit_of(s, host: dict, cards, asleep: tuple = (), off_card: tuple = ()) -> dict:
    """The server role's audit items of a host whose facts are ``host`` (as the deploy read them);
    the units of ``asleep`` (their indexes) sleep: their /props says so, and they are on no card,
    as are those of ``off_card``."""
    from types import SimpleNamespace

    from llamarack.audit import Answers, Seen
    from llamarack.facts import FactRead
    from roles.driver.reads import GpuProcess, GpuProcesses
    from roles.server.audit import items

    units = host[fact_key(ServedUnits, state=f"{ROOT}/state", health=True)]
    units = {n: dataclasses.replace(u, state={**u.state, "MainPID": str(100 + i)}, health=200, sleeping=i in asleep)
             for i, (n, u) in enumerate(sorted(units.items()))}  # fmt: skip
    fact = Answers((), {})
    fact.values = {FactRead.of(k[0], **dict(k[1])): v for k, v in host.items() if isinstance(k, tuple)}
    fact.values.update({
        FactRead.of(ServedUnits, state=f"{ROOT}/state", health=True): units,
        FactRead.of(GgufShape, path=f"{ROOT}/models/current/model.gguf"): SHAPE,
        FactRead.of(GpuProcesses): tuple(GpuProcess(100 + i, "llama-server", 700, g.uuid) for i, g in enumerate(cards)
                                         if i not in asleep + off_card),
        FactRead.of(CharDevices): host[CharDevices]})  # fmt: skip
    return items(Seen("gpu01", s, SimpleNamespace(gpus=cards), fact))


def test_the_audit_lists_every_unit_of_a_host():
    s = settings(server_layout="per_card")
    host, _ = converged(s, EIGHT)
    found = audit_of(s, host, EIGHT)
    drift = [k for k, v in found.items() if v.drift and k not in ("service_user", "bench")]
    assert drift == [] and found["units"].found == {"units": [f"llamarack-server@{i}.service" for i in range(8)]}
    for i, g in enumerate(EIGHT):
        assert found[f"unit@{i}"].wanted["port"] == 8080 + i and found[f"unit@{i}"].found["cards"] == [g.uuid]
        assert found[f"health@{i}"].found == 200 and found[f"service@{i}"].found["pid"] == 100 + i
        assert found[f"residency@{i}"].found["cards"] == [g.uuid] and not found[f"residency@{i}"].drift
    assert "unit" not in found and found["gpu_processes"].found["others"] == []
    # a card gone: the audit says the deploy would retire its unit
    gone = audit_of(s, host, EIGHT[:3] + EIGHT[4:])
    assert gone["units"].drift and "llamarack-server@3.service" not in gone["units"].wanted["units"]
    # one unit: today's items, by today's names
    one = audit_of(settings(), facts(unit_sha1=UNIT_SHA1, running=True, units={"llamarack-server.service": found_unit(
        sha1=UNIT_SHA1, running=True, lines=UNIT.rstrip("\n").split("\n"))}), (V100,))  # fmt: skip
    assert {"unit", "service", "health", "residency"} <= set(one) and not one["unit"].drift
    assert not [k for k in one if "@" in k]


def test_the_audit_shows_a_sleeping_unit_serving_without_drift():
    s = settings(server_layout="per_card")
    host, _ = converged(s, EIGHT)
    found = audit_of(s, host, EIGHT, asleep=(2,))
    drift = [k for k, v in found.items() if v.drift and k not in ("service_user", "bench")]
    assert drift == [], drift
    assert found["service@2"].found["sleeping"] is True and "sleeping" not in found["service@1"].found
    assert found["residency@2"].found["why"] == "asleep: it freed its weights (its CUDA context stays); checked once a request wakes it"
    assert found["health@2"].found == 200
    # on no card while awake is drift, as before
    awake = audit_of(s, host, EIGHT, off_card=(2,))
    assert awake["residency@2"].drift and "sleeping" not in awake["service@2"].found


def test_plan_upgrade_says_which_unit_goes_and_which_restarts():
    from llamarack.upgrade import server_steps

    s = settings(server_layout="per_card")
    host, _ = converged(s, EIGHT)
    gone = audit_of(s, host, EIGHT[:3] + EIGHT[4:])
    assert [(step.action, step.what) for step in server_steps(gone, False)] == [("retire", "llamarack-server@3.service")]
    assert [step.what for step in server_steps(audit_of(s, host, EIGHT), True)] == [
        f"llamarack-server@{i}" for i in range(8)]  # a new build or model: every unit restarts


def test_the_deploy_ends_by_naming_every_unit_and_its_cards(caplog):
    """A host reseated with a 3090 and three P40s serves 4 units: the closing lines name each
    one's address (ports 8080-8083) and cards, read from the units record the run wrote."""
    import logging

    from llamarack.operations import report
    from roles.server.deploy import serving

    s = settings(server_listen="0.0.0.0", server_api_key_file=None, server_allow_unauthenticated=True)
    commands, _ = run_op(service, facts(), settings=s, gpus=MIXED)
    record = uploads(commands)[f"{ROOT}/state/units.json.new"].rstrip("\n").split("\n")
    with caplog.at_level(logging.INFO, logger="pyinfra"):
        run_op(report, {fact_key(FileContents, path=f"{ROOT}/state/units.json"): record},
               message=lambda: serving(s, "10.77.0.20", MIXED))  # fmt: skip
    cards = ["GPU 0 (NVIDIA GeForce RTX 3090)", "GPU 1 (Tesla P40)", "GPU 2 (Tesla P40)", "GPU 3 (Tesla P40)"]
    assert [r.getMessage() for r in caplog.records] == [
        f"[gpu01] serving: http://10.77.0.20:{port}/v1/chat/completions (OpenAI API), http://10.77.0.20:{port}"
        f"/completion, health at http://10.77.0.20:{port}/health (no API key): llamarack-server@{i} on {cards[i]}"
        for i, port in enumerate(range(8080, 8084))]  # fmt: skip


def test_one_unit_over_several_cards_and_one_on_the_cpu():
    from roles.server.plan import serving_lines

    two = {"units": [{"index": 0, "unit": "llamarack-server.service", "port": 8080, "listen": "0.0.0.0",
                      "cards": [g.uuid for g in TWO]}]}  # fmt: skip
    s = settings(server_listen="0.0.0.0", server_api_key_file=None, server_allow_unauthenticated=True)
    assert serving_lines(s, "gpu01.rack", two, TWO) == (
        "serving: http://gpu01.rack:8080/v1/chat/completions (OpenAI API), http://gpu01.rack:8080/completion, "
        f"health at http://gpu01.rack:8080/health (no API key): on GPU 0 ({TWO[0].name}), GPU 1 ({TWO[1].name})")
    cpu = settings(llamacpp_backend="cpu")
    line = serving_lines(cpu, "gpu01.rack", {"units": [{"index": 0, "port": 8080, "cards": []}]}, ())
    assert line.startswith("serving: http://127.0.0.1:8080/v1/chat/completions") and line.endswith(": on the CPU")
    assert serving_lines(cpu, "gpu01.rack", None, ()).endswith("/health (no API key)")  # no record: no cards to name
    planned = serving_lines(cpu, "gpu01.rack", two, TWO)  # a CPU build planned over the host's cards (the lab)
    assert planned.endswith(f": on GPU 0 ({TWO[0].name}), GPU 1 ({TWO[1].name}), computing on the CPU")

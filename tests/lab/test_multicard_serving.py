"""Hosts with several cards, on one lab host whose fake driver is given other cards.

lab-v100-a's cards are swapped (``lab_rack.reseat``) for an 8x V100 SXM2 16GB box, then a
mixed 3090 + 3x P40 host, then 2 V100 16 GB with ``server_layout = 'split'``, and back to its
one V100. The lab builds llama.cpp for the CPU, so each unit computes there; what is shown is
the layout: the units, their ports, cards (CUDA_VISIBLE_DEVICES by UUID), split flags,
retirement and return, the audit, and that a second deploy changes nothing. The fake driver
is the one test double.

The tests run in order, each from the state the one before left.
"""

import json
import re
import shlex
import time

import pytest

from llamarack_lab.pytest_plugin import count_remote_work, parse_pyinfra_totals
from llamarack_lab import rack as rackmod
from llamarack_lab.fake_nvidia import deb
from tests.lab import deploying

pytestmark = pytest.mark.lab

HOST = "lab-v100-a"
SEEN = {}
ROOT = "/opt/llamarack"
UNITS = "/etc/systemd/system"


def deploy(lab_rack, *data: str) -> str:
    rc, out = deploying.deploy(lab_rack, HOST, *data)
    assert rc == 0, out[-6000:]
    return out


def converged(lab_rack, *data: str) -> None:
    before = deploying.state(lab_rack, HOST)
    out = deploy(lab_rack, *data)
    assert parse_pyinfra_totals(out)["success"] == 0, out[-6000:]
    assert deploying.state(lab_rack, HOST) == before


def units(lab_rack) -> dict:
    """{unit name: its file} on the host."""
    names = deploying.sh(lab_rack, HOST, f"cd {UNITS} && ls llamarack-server*.service 2>/dev/null || true").split()
    return {n: deploying.sh(lab_rack, HOST, f"cat {UNITS}/{n}") for n in names}


def exec_start(unit: str) -> str:
    return next(line for line in unit.splitlines() if line.startswith("ExecStart="))


def visible(unit: str) -> str:
    m = re.search(r"^Environment=CUDA_VISIBLE_DEVICES=(\S+)$", unit, re.M)
    return m.group(1) if m else ""


def audit(*data: str) -> dict:
    """The host's audit against the settings the deploy had (``data``: its --data items)."""
    return deploying.audit_json(HOST, *[w for d in data for w in ("--data", d)])


@pytest.fixture(scope="module", autouse=True)
def cards_restored_afterwards(lab_rack):
    profile = lab_rack.rack.host(HOST)["profile"]
    yield
    lab_rack.reseat(HOST, profile)
    deploying.deploy(lab_rack, HOST)


def remote_work(lab_rack) -> dict:
    """A converged deploy of the host with pyinfra's --debug log: its remote commands, and
    the facts it read more than once (none)."""
    rc, out = lab_rack.run_pyinfra(deploying.ROOT / "deploy.py", "--debug", "--limit", HOST,
                                   inventory=deploying.ROOT / "inventory/lab.py", timeout=600)  # fmt: skip
    assert rc == 0 and parse_pyinfra_totals(out)["success"] == 0, out[-6000:]
    seen = count_remote_work(out, [HOST])[HOST]
    assert seen["facts_read_more_than_once"] == {}, seen
    return seen


def test_eight_cards_serve_eight_units_on_eight_ports(lab_rack):
    deploy(lab_rack)
    SEEN["one_card_commands"] = remote_work(lab_rack)["remote_commands"]
    lab_rack.reseat(HOST, "v100-sxm2-16gb-x8")
    out = deploy(lab_rack)
    found = units(lab_rack)
    assert sorted(found) == [f"llamarack-server@{n}.service" for n in range(8)], out[-4000:]
    cards = [c["uuid"] for c in lab_rack.cards(HOST)]
    for n in range(8):
        unit = found[f"llamarack-server@{n}.service"]
        assert f"--port {8080 + n} " in exec_start(unit)
        assert visible(unit) == cards[n]
        deploying.completes(lab_rack, HOST, 8080 + n)
    record = json.loads(deploying.sh(lab_rack, HOST, f"cat {ROOT}/state/units.json"))
    assert [(u["unit"], u["port"], u["cards"]) for u in record["units"]] == [
        (f"llamarack-server@{n}.service", 8080 + n, [cards[n]]) for n in range(8)]
    # The record's figure was taken on a card of this kind with these flags: no bench ran. Without
    # a record, llama-bench runs once, on unit 0's card: the other seven (the same kind of card,
    # the same flags) share its figures, each named as unit 0's, with no run of their own.
    kept = json.loads(deploying.sh(lab_rack, HOST, "cat " + shlex.quote(f"{ROOT}/state/bench.json")))
    assert [u["name"] for u in kept["units"]] == ["llamarack-server.service"], out[-4000:]
    deploying.sh(lab_rack, HOST, "rm " + shlex.quote(f"{ROOT}/state/bench.json"))
    out = deploy(lab_rack)
    bench = json.loads(deploying.sh(lab_rack, HOST, "cat " + shlex.quote(f"{ROOT}/state/bench.json")))
    assert [(u["name"], u.get("as")) for u in bench["units"]] == [("llamarack-server@0.service", None)] + [
        (f"llamarack-server@{n}.service", "llamarack-server@0.service") for n in range(1, 8)], bench["units"]
    assert len({u["tg128"]["tokens_per_second"] for u in bench["units"]}) == 1 > 0 < bench["tg128"]["tokens_per_second"]
    # the fake driver lists each served process on its own card, as a real one does
    apps = deploying.sh(lab_rack, HOST, "nvidia-smi --query-compute-apps=gpu_uuid,pid --format=csv,noheader")
    assert sorted(line.split(",")[0].strip() for line in apps.splitlines()) == sorted(cards)


def test_the_audit_lists_every_unit_and_a_second_deploy_changes_nothing(lab_rack):
    host = audit()
    items = host["items"]
    assert [f"unit@{n}" for n in range(8)] == sorted(k for k in items if k.startswith("unit@"))
    assert all(not items[f"service@{n}"].get("drift") for n in range(8)), items
    assert not items["units"].get("drift"), items["units"]
    converged(lab_rack)
    # what the converged 8-card host costs: no more remote commands than it did with one card
    seen = remote_work(lab_rack)
    assert seen["remote_commands"] <= SEEN["one_card_commands"], seen


def test_a_card_off_the_bus_retires_its_unit_and_its_return_brings_it_back(lab_rack):
    pids = {n: deploying.sh(lab_rack, HOST, f"systemctl show -p MainPID --value llamarack-server@{n}.service")
            for n in range(8)}  # fmt: skip
    lab_rack.card(HOST, 3, on=False)
    try:
        out = deploy(lab_rack)
        assert "llamarack-server@3.service" in out and "no longer" in out, out[-4000:]
        assert "llamarack-server@3.service" not in units(lab_rack)
        for n in (0, 1, 2, 4, 5, 6, 7):  # the other units keep serving, untouched
            assert deploying.sh(lab_rack, HOST, f"systemctl show -p MainPID --value llamarack-server@{n}.service") \
                == pids[n]  # fmt: skip
    finally:
        lab_rack.card(HOST, 3, on=True)
    deploy(lab_rack)
    found = units(lab_rack)
    assert "llamarack-server@3.service" in found
    assert visible(found["llamarack-server@3.service"]) == lab_rack.cards(HOST)[3]["uuid"]
    deploying.completes(lab_rack, HOST, 8083)


def test_a_mixed_host_gets_a_unit_per_card(lab_rack):
    lab_rack.reseat(HOST, "rtx3090-p40-x3")
    deploy(lab_rack)
    found = units(lab_rack)
    assert sorted(found) == [f"llamarack-server@{n}.service" for n in range(4)]
    for n, card in enumerate(lab_rack.cards(HOST)):
        assert visible(found[f"llamarack-server@{n}.service"]) == card["uuid"]
        deploying.completes(lab_rack, HOST, 8080 + n)
    converged(lab_rack)


def test_a_split_host_runs_one_unit_with_the_planned_tensor_split(lab_rack):
    lab_rack.reseat(HOST, "v100-16gb-x2")
    deploy(lab_rack, "server_layout=split")
    found = units(lab_rack)
    assert list(found) == ["llamarack-server.service"]
    unit = found["llamarack-server.service"]
    start = exec_start(unit)
    assert re.search(r"--split-mode layer --tensor-split \d+,\d+ --main-gpu [01]\b", start), start
    assert visible(unit) == ",".join(c["uuid"] for c in lab_rack.cards(HOST))
    deploying.completes(lab_rack, HOST, 8080)
    converged(lab_rack, "server_layout=split")


def test_a_unit_the_driver_does_not_list_on_its_card_is_rolled_back(lab_rack):
    """server_residency = 'on': the switch checks each unit's process is on its card, as a
    CUDA build's is checked; the fake driver lists it there until the lab hides it."""
    lab_rack.reseat(HOST, "v100-16gb-x2")
    on = ("server_layout=per_card", "server_residency=on")
    deploy(lab_rack, *on)
    before = units(lab_rack)
    assert sorted(before) == ["llamarack-server@0.service", "llamarack-server@1.service"]
    assert all("# llamarack residency: " in u for u in before.values())
    items = audit(*on)["items"]
    assert not items["residency@0"].get("drift") and not items["residency@1"].get("drift"), items
    assert items["residency@1"]["found"]["cards"] == [lab_rack.cards(HOST)[1]["uuid"]], items
    lab_rack.hide_gpu_processes(HOST, units=("llamarack-server@1.service",))
    try:
        rc, out = deploying.deploy(lab_rack, HOST, *on, "server_parallel=2")
        assert rc != 0, out[-6000:]
        assert "does not serve from its cards: CPU fallback" in out and "rolled back" in out, out[-6000:]
        after = units(lab_rack)
        assert after["llamarack-server@1.service"] == before["llamarack-server@1.service"]  # the previous one
        assert "--parallel 2 " in exec_start(after["llamarack-server@0.service"])  # its card lists it: switched
        # The previous unit's own check after its start refuses it too: off its card, it is not up.
        found = audit(*on)["items"]["residency@1"]
        assert found.get("drift") and "CPU fallback" in found["found"]["why"], found
    finally:
        lab_rack.hide_gpu_processes(HOST, hide=False)
    serves_within(lab_rack, 8081, 120)  # listed again: its next restart passes its check
    deploy(lab_rack, *on, "server_parallel=2")
    assert "--parallel 2 " in exec_start(units(lab_rack)["llamarack-server@1.service"])


REFUSED = "llamarack unit check: "


def serves_within(lab_rack, port: int, seconds: float) -> None:
    """The host's unit on ``port`` completes a request within ``seconds`` (it may be starting)."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            return deploying.completes(lab_rack, HOST, port)
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(1)


def test_a_unit_off_its_card_after_a_reboot_fails_its_start_and_the_audit_says_why(lab_rack):
    """A CUDA unit's check after each start (ExecStartPost=) runs at boot too: rebooted onto a
    driver that no longer lists unit@1's process on its card (the lab's stand-in for a driver
    whose device names its rule does not allow: the process then serves from the CPU), unit@1
    fails its start instead of serving, and restarts; its port answers nothing a check could
    count as up; the audit says why. Unit@0 serves throughout. Listed again, unit@1 comes back
    by its own restart, with no deploy."""
    on = ("server_layout=per_card", "server_residency=on", "server_parallel=2")
    deploy(lab_rack, *on)
    found = units(lab_rack)
    assert all("\nExecStartPost=+/usr/bin/python3 -I -S " in u for u in found.values()), found
    lab_rack.hide_gpu_processes(HOST, units=("llamarack-server@1.service",))
    try:
        lab_rack.ssh(HOST, "systemctl reboot")
        time.sleep(3)
        rackmod.wait_booted(lab_rack.rack, 120, names=[HOST])
        serves_within(lab_rack, 8080, 120)
        journal = ""
        for _ in range(120):
            journal = deploying.sh(lab_rack, HOST, "journalctl -b -u llamarack-server@1.service -o cat --no-pager")
            if REFUSED in journal:
                break
            time.sleep(1)
        assert f"{REFUSED}llamarack-server@1.service answers /health but does not serve from its cards: CPU " \
               "fallback" in journal, journal[-3000:]  # fmt: skip
        state = deploying.sh(lab_rack, HOST, "systemctl is-active llamarack-server@1.service || true")
        assert state != "active", state
        item = audit(*on)["items"]["residency@1"]
        assert item.get("drift") and "CPU fallback" in item["found"]["why"], item
    finally:
        lab_rack.hide_gpu_processes(HOST, hide=False)
    serves_within(lab_rack, 8081, 120)
    # its port answers while its check after the start (ExecStartPost=) still runs: "activating" till then
    state, deadline = "", time.monotonic() + 60
    while state != "active" and time.monotonic() < deadline:
        state = deploying.sh(lab_rack, HOST, "systemctl is-active llamarack-server@1.service || true")
        time.sleep(0 if state == "active" else 1)
    assert state == "active", state


def test_back_on_one_card_the_host_serves_its_one_unit_again(lab_rack):
    lab_rack.reseat(HOST, "v100-16gb")
    deploy(lab_rack)
    assert list(units(lab_rack)) == ["llamarack-server.service"]
    deploying.completes(lab_rack, HOST, 8080)
    converged(lab_rack)
    # The record keeps the cards gone as missing; a driver upgrade waiting for its reboot
    # hides the list: the run plans for the card the driver listed last, not the gone ones.
    assert deploying.sh(lab_rack, HOST, "cat " + shlex.quote(f"{ROOT}/state/gpus.json")).count('"missing": true') >= 7
    lab_rack.driver(HOST, version="570.172.08")
    try:
        out = deploy(lab_rack, "driver_reboot_on_mismatch=True")
        assert list(units(lab_rack)) == ["llamarack-server.service"], out[-4000:]
        deploying.completes(lab_rack, HOST, 8080)
    finally:
        lab_rack.driver(HOST, version=deb.DEFAULT_VERSION, state="ok")

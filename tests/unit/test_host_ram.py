"""The host-RAM ledger (``roles/server/host_ram.py``): each unit's share of its host's memory
against llama.cpp's own host buffers, ``--cache-ram`` lowered to what fits down to its floor,
the refusal below it, and where the ledger shows: the units' command lines, the service
operation, the audit, ``llamarack plan``."""

import dataclasses
import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from llamarack.cli import main
from roles.llamacpp.reads import BuildFlags, ServerFlags
from roles.model.files.gguf_header import read_shape
from roles.model.shapes import shape_from_config
from roles.server.host_ram import PROCESS_CUDA_MIB, PROCESS_MIB, HostRam, host_ledger, plan_host, unit_share
from roles.server.plan import host_memory, wanted_units
from roles.server.planner import MIB, Card, Knobs, Plan, PlanError, ledger, plan
from tests.unit.test_server_plan import GPU_LOGS, LOAD_LOGS, _cuda_buffers

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
SMOKE = FIXTURES / "gguf/smoke-Q4_K_M.head.gguf"
LLAMA8B = shape_from_config(json.loads((FIXTURES / "configs/llama-3.1-8b-instruct.config.json").read_text()), "Q4_K_M")
V100 = Card("Tesla V100 SXM2 16GB", 16130, "7.0")
FLAGS = BuildFlags(("--load-mode", "none"), True, True, True, has_cache_ram=True)


def settings(**data):
    from roles.settings import load_settings

    return load_settings("gpu01", {"python_env_backend": "venv", "llamarack_root": "/opt/lr", **data})


def _plan(shape: dict, knobs: Knobs, cards: list, layers: int, k: str, ctx: int) -> Plan:
    return Plan(ctx, knobs.parallel, k, k, layers, (), ledger(shape, knobs, cards, layers, k, k, ctx), "")


@pytest.mark.parametrize("case", json.loads((GPU_LOGS / "cases.json").read_text()), ids=lambda c: c["log"])
def test_a_units_share_is_what_llama_cpp_keeps_in_host_ram_on_cuda(case):
    """On the H200 (tests/fixtures/llama-server/gpu-load-logs): the weights and KV left on the
    host are llama.cpp's CUDA_Host model and CPU KV buffers; the host compute, its CUDA_Host
    compute and output buffers, to 0.2 MiB (a sliding window, a 32K context, 4 slots included)."""
    log = (GPU_LOGS / case["log"]).read_text()
    shape = json.loads((GPU_LOGS / f"{case['shape']}.shape.json").read_text())
    knobs = Knobs(parallel=case["parallel"])
    the_plan = _plan(shape, knobs, [Card("c", 143771)], case["gpu_layers"], case["cache_type"], case["ctx_per_slot"])
    share = unit_share("u", shape, knobs, the_plan, on_cards=True)
    seen = _cuda_buffers(log)
    output = float(re.findall(r"CUDA_Host +output buffer size = +([0-9.]+) MiB", log)[-1])
    assert abs(share.weights / MIB - seen[("model", False)]) <= 0.01
    assert abs(share.kv / MIB - seen.get(("KV", False), 0.0)) <= 0.02
    assert abs(share.compute / MIB - (seen[("compute", False)] + output)) <= 0.2
    assert share.process == PROCESS_CUDA_MIB * MIB and share.cache == 0  # a CUDA build's runtime: measured


@pytest.mark.parametrize("log_name, k, per_slot, slots", [
    ("f16-c1024", "f16", 1024, 1), ("q8_0-c4096", "q8_0", 4096, 1), ("q4_0-c8192-p4", "q4_0", 2048, 4),
])  # fmt: skip
def test_on_a_cpu_build_every_part_is_in_host_ram(log_name, k, per_slot, slots):
    """A CPU build (the lab's) keeps in host RAM what a plan puts on its cards too: the smoke
    model's load logs (tests/fixtures/llama-server/load-logs) name every buffer CPU."""
    log = (LOAD_LOGS / f"{log_name}.log").read_text()
    shape, knobs = read_shape(str(SMOKE)), Knobs(parallel=slots)
    n_all = shape["n_layer"] + 1
    for cards, layers in (([], 0), ([V100], n_all)):  # no card, or a fake card the lab plans against
        share = unit_share("u", shape, knobs, _plan(shape, knobs, cards, layers, k, per_slot), on_cards=False)
        assert round(share.weights / MIB, 2) == float(re.search(r"CPU model buffer size = +([0-9.]+)", log).group(1))
        assert round(share.kv / MIB, 2) == float(re.search(r"CPU KV buffer size = +([0-9.]+)", log).group(1))
        reported = float(re.search(r"CPU compute buffer size = +([0-9.]+)", log).group(1))
        assert reported <= share.compute / MIB <= reported * 1.03


def test_the_prompt_cache_is_cache_ram_none_or_twice_the_contexts_whole_kv():
    """-1: no byte limit; the token limit (the context's cells) is enforced after a new state is saved."""
    knobs = Knobs()
    the_plan = plan(LLAMA8B, Knobs(ctx_size=8192, cache_type_k="f16", cache_type_v="f16"), [V100])
    share = unit_share("u", LLAMA8B, knobs, the_plan, on_cards=True)
    context_kv = 8192 * 128 * 1024  # 32 layers x 8 KV heads x 128 x 2 (K, V) x 2 bytes per cell
    assert share.context_kv == context_kv
    for cache_ram, cache in ((8192, 8192 * MIB), (2048, 2048 * MIB), (0, 0), (None, 0), (-1, 2 * context_kv)):
        assert dataclasses.replace(share, cache_ram=cache_ram).cache == cache


def eight(host_mib, asked=HostRam(), shape=LLAMA8B):
    """The host-RAM ledger of 8 V100 16 GB units of ``shape``, planned as the server role plans them."""
    the_plan = plan(shape, Knobs(), [V100])
    shares = [unit_share(f"llamarack-server@{n}.service", shape, Knobs(), the_plan, True) for n in range(8)]
    return plan_host(shares, host_mib, asked)


def test_eight_units_on_a_64_gib_host_get_their_prompt_caches_lowered_to_what_fits():
    """The case of a DGX-like box with 64 GiB: 8 x 8,192 MiB of prompt cache alone is more than it has."""
    book, refusal = eight(64298)
    fixed = book.units[0].fixed
    assert refusal is None and book.lowered and book.fits()
    assert book.cache_ram == ((64298 - 4096) * MIB - 8 * fixed) // 8 // MIB == 6678
    assert book.budget - book.total < 8 * MIB  # the rest of a MiB per unit is left
    assert "--cache-ram 6678, lowered from 8192: 8 units in 60,202 MiB" in book.why()
    # where the memory is ample, nothing changes: llama.cpp's default, as asked
    ample, _ = eight(257585)
    assert ample.cache_ram == 8192 and not ample.lowered and ample.fits()
    # not known (the audit of a host whose fact is missing, llamarack plan without --host-ram-mib): not checked
    unknown, _ = eight(None)
    assert unknown.cache_ram == 8192 and unknown.fits() is None and "not checked" in unknown.why()


def test_a_lowered_cache_the_units_in_place_run_is_kept_while_it_fits():
    """A card off the bus leaves 7 units with more room each: the 7 keep the 7,071 MiB they run
    (a new value would restart every one of them); above what fits, or below the floor, it is not kept."""
    the_plan = plan(LLAMA8B, Knobs(), [V100])
    seven = [unit_share(f"llamarack-server@{n}.service", LLAMA8B, Knobs(), the_plan, True) for n in range(7)]
    assert plan_host(seven, 64298, HostRam())[0].cache_ram > 6678  # planned afresh: more each
    kept, refusal = plan_host(seven, 64298, HostRam(), kept=6678)
    assert refusal is None and kept.cache_ram == 6678 and kept.lowered and kept.fits()
    assert eight(64298)[0].cache_ram == 6678 and plan_host(list(eight(64298)[0].units), 64298, HostRam(),
                                                           kept=7000)[0].cache_ram == 6678  # fmt: skip
    assert plan_host(seven, 64298, HostRam(cache_ram_min=2048), kept=1024)[0].cache_ram > 6678
    assert plan_host(seven, 257585, HostRam(), kept=6678)[0].cache_ram == 8192  # ample: as asked


def test_the_cache_the_units_in_place_run_is_read_from_their_command_lines():
    from roles.server.plan import cache_in_place
    from roles.server.reads import FoundUnit

    def unit(name, start):
        return FoundUnit(name, "0", ("[Service]", f"ExecStart=/b/bin/llama-server --port 8080 {start}"), False, {})

    two = {"a": unit("a", "--cache-ram 6678 --metrics"), "b": unit("b", "--cache-ram 6678")}
    assert cache_in_place(two) == 6678
    assert cache_in_place({**two, "c": unit("c", "--cache-ram 6000")}) is None  # they differ
    assert cache_in_place({**two, "c": unit("c", "--metrics")}) is None and cache_in_place({}) is None


def test_below_the_floor_the_host_is_refused_with_each_units_share_and_the_fix():
    book, refusal = eight(12000)
    assert refusal.rule == "host-memory" and book.cache_ram == 1024 and not book.fits()
    message = refusal.message("gpu01")
    assert message.startswith("gpu01: host-memory: found MemTotal 12,000 MiB; 8 units at --cache-ram 1024, "
                              "server_cache_ram_min take ")  # fmt: skip
    names = ", ".join(f"llamarack-server@{n}.service" for n in range(8))
    assert f"{names}: 1,870 MiB each (weights 282 + KV 0 + compute 144 + process 420 + prompt cache 1,024)" in message
    assert "needed at most 7,904 MiB for the units: MemTotal less server_host_ram_reserve_mib 4,096" in message
    assert "Fix: fewer units or more layers on the cards" in message and "server_cache_ram_min" in message
    with pytest.raises(PlanError) as raised:
        host_ledger(list(book.units), 12000, HostRam())
    assert raised.value.failure == refusal
    # a lower floor lets the cache go lower: 0 turns it off
    off, refusal = eight(11266, HostRam(cache_ram_min=0))
    assert refusal is None and off.cache_ram == 49, off.cache_ram
    none, refusal = eight(5500, HostRam(cache_ram_min=0))  # not even without a prompt cache
    assert none.cache_ram == 0 and "8 units at --cache-ram 0, server_cache_ram_min take 6,770 MiB" in refusal.found


def test_minus_one_lowered_becomes_a_number_and_a_build_without_the_cache_counts_none():
    book, refusal = eight(30000, HostRam(cache_ram=-1))
    assert refusal is None and book.cache_ram > 0 and book.lowered  # 8 x 2 x 8.5 GiB (twice the context's q8_0 KV) do not fit
    kept, _ = eight(257585, HostRam(cache_ram=-1))
    assert kept.cache_ram == -1 and kept.units[0].cache == 2 * kept.units[0].context_kv
    old, refusal = eight(4000, HostRam(has_cache_ram=False))  # a build before the prompt cache
    assert old.cache_ram is None and all(u.cache == 0 for u in old.units)
    assert "no prompt cache (this llama-server has no --cache-ram)" in refusal.found


def test_every_unit_is_written_with_the_ledgers_cache_ram_where_the_build_has_it():
    from tests.roles.test_server_multicard import EIGHT

    s, args = settings(), ("/opt/lr/builds/b1", "/opt/lr/models/m1", LLAMA8B, EIGHT)
    _, wanted = wanted_units(s, FLAGS, *args, host_mib=64298)
    assert len(wanted) == 8 and all(" --cache-ram 6678 " in w.text for w in wanted)
    assert wanted[0].memory.lowered and wanted[3].share.name == "llamarack-server@3.service"
    _, ample = wanted_units(s, FLAGS, *args, host_mib=257585)
    assert all(" --parallel 1 --cache-ram 8192 --cache-type-k " in w.text for w in ample)
    _, old = wanted_units(s, ServerFlags(("--load-mode", "none"), True, True, True), *args, host_mib=64298)
    assert not any("--cache-ram" in w.text for w in old)  # a build whose --help lacks it: left out
    with pytest.raises(PlanError) as refused:
        wanted_units(s, FLAGS, *args, host_mib=8000)
    assert refused.value.failure.message("gpu01").startswith("gpu01: host-memory: found MemTotal 8,000 MiB; 8 units")
    assert host_memory(settings(server_cache_ram=0), FLAGS, LLAMA8B, [("u", wanted[0].plan)], None, 8000).cache_ram == 0


def test_the_service_refuses_a_host_whose_memory_does_not_hold_its_units_before_touching_them():
    from roles.server.operations import service
    from tests.roles.test_server_multicard import EIGHT
    from tests.roles.test_server_ops import facts
    from tests.support.ophost import run_op

    commands, noops = run_op(service, facts(shape=LLAMA8B, host_mib=8000), settings=settings(), gpus=EIGHT)
    assert noops == [] and len(commands) == 1
    assert "exit 1" in str(commands[0]) and "gpu01: host-memory: found MemTotal 8,000 MiB; 8 units" in str(commands[0])


def test_the_audit_shows_each_units_share_and_the_hosts_ledger():
    from tests.roles.test_server_multicard import EIGHT, audit_of, converged

    s = settings(server_layout="per_card")
    host, _ = converged(s, EIGHT)
    items = audit_of(s, host, EIGHT)
    memory = items["units"].wanted["host_ram"]
    assert memory["mem_total_mib"] == 257585 and memory["cache_ram"] == 8192 and memory["fits"]
    share = items["unit@5"].wanted["host_ram"]
    assert share["unit"] == "llamarack-server@5.service" and share["cache_ram"] == 8192
    assert share["total_mib"] == round(share["weights_mib"] + share["kv_mib"] + share["compute_mib"] + PROCESS_CUDA_MIB
                                       + 8192, 1)  # fmt: skip


def test_llamarack_plan_shows_the_host_ram_ledger_and_refuses_a_host_that_cannot_hold_it():
    config = str(FIXTURES / "configs/llama-3.1-8b-instruct.config.json")
    args = ["plan", "--config", config, "--gpu", "V100 SXM2 16GB", "--gpus", "8"]
    out = CliRunner().invoke(main, [*args, "--host-ram-mib", "64298"]).output
    assert "host RAM: MemTotal 64,298 MiB less the 4,096 MiB reserve: 60,202 for 8 units, MiB:" in out
    assert re.search(r"\n  1-8 +281\.8 +0\.0 +144\.5 +420\.0 +6,678\.0 +7,524\.3\n", out), out
    assert "fits; --cache-ram 6678, lowered from 8192" in out
    refused = CliRunner().invoke(main, [*args, "--host-ram-mib", "12000"])
    assert refused.exit_code == 1 and "host refused: host: host-memory: found MemTotal 12,000 MiB" in refused.output
    data = json.loads(CliRunner().invoke(main, [*args, "--host-ram-mib", "12000", "--cache-ram-min", "0",
                                                "--json"]).output)  # fmt: skip
    assert data["refused"] is None and data["host_ram"]["lowered"] and data["host_ram"]["units"][7]["unit"] == "unit 8"
    assert data["host_ram"]["cache_ram"] == data["host_ram"]["units"][0]["cache_ram"] < 1024
    # a CPU build: the weights and KV the plan puts on the card are in host RAM, beside a CPU process
    cpu = json.loads(CliRunner().invoke(main, [*args, "--gpu-layers", "0", "--cpu-build", "--json"]).output)
    cuda = json.loads(CliRunner().invoke(main, [*args, "--gpu-layers", "0", "--json"]).output)
    assert cpu["host_ram"]["units"][0]["process_mib"] == PROCESS_MIB and cuda["host_ram"]["units"][0]["process_mib"] \
        == PROCESS_CUDA_MIB  # fmt: skip
    full = json.loads(CliRunner().invoke(main, [*args, "--cpu-build", "--json"]).output)["host_ram"]["units"][0]
    on_card = json.loads(CliRunner().invoke(main, [*args, "--json"]).output)["host_ram"]["units"][0]
    assert full["weights_mib"] > 4000 > on_card["weights_mib"]  # an 8B Q4_K_M, all in host RAM on a CPU build


def test_a_cuda_units_resident_memory_on_the_h100_is_within_its_share():
    """bench/results/gpu-host-ram.json: each llama-server's peak VmRSS (its prompt cache
    filled) against its share. A result measured before the ledger counted a CUDA build's own
    memory (its ``process_mib`` 27, the CPU build's) is held to the share as the ledger counts it
    now, from the same items: PROCESS_CUDA_MIB, and -1 at twice the context's KV."""
    from roles.server.host_ram import UnitShare

    result = json.loads((Path(__file__).resolve().parents[2] / "bench/results/gpu-host-ram.json").read_text())
    assert result["build"] == "cuda" and len(result["cases"]) == 4
    for name, case in result["cases"].items():
        u, peak = case["ledger"], max(x["VmHWM"] for x in case["rss_mib"])
        if u["process_mib"] != PROCESS_MIB:
            assert case["within_ledger"], (name, case["rss_minus_ledger_mib"])
            continue
        context_kv = u["prompt_cache_mib"] if u["cache_ram"] == -1 else 0  # then -1 counted it once
        share = UnitShare(name, u["weights_mib"] * MIB, u["kv_mib"] * MIB, u["compute_mib"] * MIB,
                          PROCESS_CUDA_MIB * MIB, int(context_kv * MIB), u["cache_ram"])  # fmt: skip
        assert peak <= share.total / MIB, (name, peak, share.total / MIB)
    beyond = result["cases"]["cache0"]["beyond_buffers_mib"]
    assert beyond <= PROCESS_CUDA_MIB <= beyond * 1.05  # the figure, with its margin

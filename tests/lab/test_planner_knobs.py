"""The memory planner's knobs reach the unit on a lab host, and the server answers.

Runs on the host test_stack_and_model.py deploys (lab-v100-b: a CPU build
of llama.cpp, the tiny Llama, a fake V100 16 GB that the planner plans
against). Each test deploys with --data overrides, reads the running
server's command line and asks llama-server itself (/props) what it made of
it; the last one puts the defaults back.
"""

import json
import urllib.request

import pytest

from llamarack import remote
from roles.server.planner import Card, Knobs, PlanError, plan
from tests.lab.test_stack_and_model import OPT, UNIT_PATH, URL, deploy, http_get, http_post, server_cmdline, sh

pytestmark = pytest.mark.lab

V100_16_PLANNED = 16130  # MiB: what the planner takes a V100 16 GB for (gpu_table)
V100_CC = "7.0"  # the fake card of the host deployed: its prompts go through cuBLAS (planner.prefill_pool_bytes)


def props() -> dict:
    with urllib.request.urlopen(f"{URL}/props", timeout=30) as r:
        return json.loads(r.read().decode())


def answers() -> None:
    assert http_get(f"{URL}/health") == (200, '{"status":"ok"}')
    status, reply = http_post(f"{URL}/completion", {"prompt": "hello", "n_predict": 8})
    assert status == 200 and json.loads(reply)["tokens_predicted"] == 8


def flag(cmdline: list, name: str) -> str:
    return cmdline[cmdline.index(name) + 1]


def host_shape(lab_rack) -> dict:
    """The served model's shape, read on the host as the GgufShape fact reads it."""
    return json.loads(sh(lab_rack, remote.command("gguf_header", f"{OPT}/models/current/model.gguf")))


def test_parallel_slots_and_auto_kv_reach_the_unit(lab_rack):
    rc, out = deploy(lab_rack, "server_parallel=2", "server_ctx_size=1024")
    assert rc == 0, out
    cmdline = server_cmdline(lab_rack)
    # the context per slot x slots; auto picks f16 (it gives the context on the fake card)
    assert (flag(cmdline, "--ctx-size"), flag(cmdline, "--parallel")) == ("2048", "2")
    assert (flag(cmdline, "--cache-type-k"), flag(cmdline, "--cache-type-v")) == ("f16", "f16")
    answers()
    p = props()
    assert p["total_slots"] == 2 and p["default_generation_settings"]["n_ctx"] == 1024


def test_yarn_serves_past_the_trained_context(lab_rack):
    rc, out = deploy(lab_rack, "server_rope_scaling=yarn", "server_rope_scale=2.0", "server_ctx_size=4096")
    assert rc == 0, out
    cmdline = " ".join(server_cmdline(lab_rack))
    assert "--ctx-size 4096" in cmdline
    assert "--rope-scaling yarn --rope-scale 2 --yarn-orig-ctx 2048" in cmdline  # the GGUF's trained 2048
    answers()
    # llama.cpp raised its trained context for YaRN, so the slot keeps all 4096
    assert props()["default_generation_settings"]["n_ctx"] == 4096


def test_partial_offload_is_planned_and_said(lab_rack):
    shape = host_shape(lab_rack)
    # a reserve that leaves room for some layers, not all (found with the planner itself)
    def layers(reserve: int) -> int:
        try:
            return plan(shape, Knobs(reserve_mib=reserve), [Card("V100", V100_16_PLANNED, V100_CC)]).gpu_layers
        except PlanError:
            return 0

    reserve = next(r for r in range(V100_16_PLANNED - 1, 0, -1) if 0 < layers(r) < shape["n_layer"] + 1)
    expected = plan(shape, Knobs(reserve_mib=reserve), [Card("V100", V100_16_PLANNED, V100_CC)])
    rc, out = deploy(lab_rack, f"server_memory_reserve_mib={reserve}")
    assert rc == 0, out
    unit = sh(lab_rack, f"cat {UNIT_PATH}")
    assert f"{expected.gpu_layers} of {shape['n_layer'] + 1} layers on the card" in unit
    assert "--n-gpu-layers" not in server_cmdline(lab_rack)  # a CPU build: the plan is said, not passed
    answers()


def test_defaults_come_back(lab_rack):
    rc, out = deploy(lab_rack)
    assert rc == 0, out
    cmdline = server_cmdline(lab_rack)
    assert (flag(cmdline, "--ctx-size"), flag(cmdline, "--parallel")) == ("2048", "1")
    assert "--rope-scaling" not in cmdline
    answers()

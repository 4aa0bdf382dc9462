"""The draft model in the memory plan: its weights, its KV (the target's cells, the plan's
types) and its compute share the card (common/speculative.cpp: "the draft context holds
as many tokens per sequence as the target context")."""

import json
from pathlib import Path

from roles.model.shapes import shape_from_config
from roles.server.planner import MIB, Card, Knobs, ledger, model_bytes, plan

CONFIGS = Path(__file__).resolve().parents[1] / "fixtures/configs"
LLAMA8B_CONFIG = json.loads((CONFIGS / "llama-3.1-8b-instruct.config.json").read_text())
LLAMA8B = shape_from_config(LLAMA8B_CONFIG, "Q4_K_M")
# Llama-3.2-1B, the usual draft of the 8B (the same 128256-token vocabulary)
LLAMA1B = shape_from_config(json.loads((CONFIGS / "llama-3.2-1b-instruct.config.json").read_text()), "Q8_0")
V100_16 = 16130
CARD = [Card("Tesla V100", V100_16)]


def test_the_draft_counts_its_weights_kv_and_compute_on_the_card():
    knobs = Knobs(parallel=2)
    alone = ledger(LLAMA8B, knobs, CARD, 33, "q8_0", "q8_0", 8192)
    both = ledger(LLAMA8B, knobs, CARD, 33, "q8_0", "q8_0", 8192, LLAMA1B)
    d = model_bytes(LLAMA1B, knobs, True, 17, "q8_0", "q8_0", 8192)
    assert both.draft_gpu_layers == 17  # None: every layer of the draft and its output layer
    assert (both.draft_weights_on_card, both.draft_kv_on_card, both.draft_compute_on_card) == (
        d["weights_on_card"], d["kv_on_card"], d["compute_on_card"])
    assert both.total_on_card == alone.total_on_card + d["weights_on_card"] + d["kv_on_card"] + d["compute_on_card"]
    # the draft's KV: its 16 layers x 8 KV heads x 64 x 2 (K and V) x q8_0, for the target's 8192 x 2 cells
    assert both.draft_kv_on_card == int(8 * (64 * 34 / 32 * 2) * 8192 * 2) * 16
    # the tied embedding is loaded a second time as its output layer, on the card
    assert both.draft_weights_on_host == LLAMA1B["token_embd_bytes"]


def test_the_draft_shrinks_the_largest_context_and_is_said():
    alone = plan(LLAMA8B, Knobs(cache_type_k="q8_0", cache_type_v="q8_0"), CARD)
    both = plan(LLAMA8B, Knobs(cache_type_k="q8_0", cache_type_v="q8_0"), CARD, LLAMA1B)
    assert both.ctx_per_slot < alone.ctx_per_slot
    assert both.ledger.total_on_card <= V100_16 * MIB < ledger(
        LLAMA8B, Knobs(), CARD, 33, "q8_0", "q8_0", both.ctx_per_slot + 256, LLAMA1B).total_on_card


def test_draft_gpu_layers_keep_the_rest_on_the_host_and_cpu_serving_puts_all_there():
    on_card = ledger(LLAMA8B, Knobs(draft_gpu_layers=0), CARD, 33, "f16", "f16", 4096, LLAMA1B)
    assert on_card.draft_weights_on_card == on_card.draft_kv_on_card == on_card.draft_compute_on_card == 0
    assert on_card.draft_kv_on_host > 0
    cpu = ledger(LLAMA8B, Knobs(), [], 0, "f16", "f16", 4096, LLAMA1B)
    whole = sum(LLAMA1B["layer_bytes"]) + 2 * LLAMA1B["token_embd_bytes"] + LLAMA1B["output_bytes"]
    assert cpu.draft_weights_on_card == 0 and cpu.draft_weights_on_host == whole


def test_auto_kv_steps_down_for_the_draft_too():
    # a context f16 gives alone but not with the draft: auto takes q8_0 for both
    alone = plan(LLAMA8B, Knobs(), CARD)
    f16_alone = alone.largest["f16/f16"]
    both = plan(LLAMA8B, Knobs(ctx_size=f16_alone), CARD, LLAMA1B)
    assert both.largest["f16/f16"] < f16_alone and both.cache_type_k == "q8_0"


def test_plan_cli_counts_a_draft():
    from click.testing import CliRunner

    from llamarack.cli import main

    args = ["plan", "--config", str(CONFIGS / "llama-3.1-8b-instruct.config.json"), "--gpu", "V100 SXM2 16GB",
            "--kv", "q8_0", "--json"]  # fmt: skip
    alone = json.loads(CliRunner().invoke(main, args).output)
    both = json.loads(CliRunner().invoke(main, args + ["--draft-config", str(CONFIGS / "llama-3.2-1b-instruct.config.json"),
                                                       "--draft-quant", "Q8_0"]).output)  # fmt: skip
    assert both["draft"]["n_layer"] == 16 and alone["draft"] is None
    assert both["ledger"]["draft_gpu_layers"] == 17 and both["ledger"]["draft_kv_on_card"] > 0
    assert both["plan"]["ctx_per_slot"] < alone["plan"]["ctx_per_slot"]
    assert both["plan"]["ctx_per_slot"] == plan(LLAMA8B, Knobs(cache_type_k="q8_0", cache_type_v="q8_0"),
                                                [Card("V100", V100_16, "7.0")], LLAMA1B).ctx_per_slot  # fmt: skip

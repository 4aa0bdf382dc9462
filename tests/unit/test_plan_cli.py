"""``llamarack plan``: the planner from the command line, on GGUF headers
(local and from a hub, by HTTP ranges) and on config.json estimates."""

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from llamarack.cli import main
from roles.model.shapes import HEADER_CHUNK, quant_type, shape_from_config
from roles.model.files.gguf_header import read_shape
from tests.support.hub_server import HubServer

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
TINY = FIXTURES / "gguf/tiny-llama-Q4_K_M.head.gguf"
SMOKE = FIXTURES / "gguf/smoke-Q4_K_M.head.gguf"
CONFIGS = FIXTURES / "configs"


def plan(*args, code=0):
    result = CliRunner().invoke(main, ["plan", *args])
    assert result.exit_code == code, result.output
    return result.output


def test_local_gguf_on_a_v100_fits_with_every_layer():
    out = plan(str(TINY), "--gpu", "V100 SXM2 16GB")
    assert "card:  Tesla V100 SXM2 16GB: planned at 16130 MiB" in out
    assert "llama, 2 layers, 2 KV heads, trained 2048: at most 2048 per slot" in out
    assert re.search(r"f16/f16 +2048 ", out) and "does NOT fit" not in out
    assert "--ctx-size 2048 --parallel 1 --n-gpu-layers 3" in out


def test_json_carries_the_ledger_and_the_kv_table():
    data = json.loads(plan(str(TINY), "--gpu", "1500", "--json", "--parallel", "2"))
    shape = read_shape(str(TINY))
    book = data["ledger"]
    # every layer and the output layer on the card; the token embedding on the host
    assert book["weights_on_card"] == sum(shape["layer_bytes"]) + shape["output_bytes"]
    assert book["weights_on_host"] == shape["token_embd_bytes"]
    assert data["plan"]["ctx_size"] == 2 * data["plan"]["ctx_per_slot"] == 4096
    assert [row["kv"] for row in data["kv"]] == ["f16/f16", "q8_0/q8_0", "q4_0/q4_0"]
    assert data["card"] == {"name": "1500 MiB", "count": 1, "planned_mib": 1500, "compute_cap": None, "cublas_prefill": None}


def test_a_card_too_small_offloads_fewer_layers_and_says_so():
    # 1033 MiB: every layer at 2048 tokens needs 1033.4 (1024 reserve, 6.5 compute, 2 KV, 0.88 weights);
    # without block 0 (--n-gpu-layers 2: block 1 and the output layer) it is 1032.1
    data = json.loads(plan(str(TINY), "--gpu", "1033", "--reserve-mib", "1024", "--kv", "f16", "--min-ctx", "2048",
                           "--json"))  # fmt: skip
    assert data["plan"]["gpu_layers"] == 2 and "2 of 3 layers on the card" in data["plan"]["note"]
    # all 3 layers still allow 1792 tokens: under the minimum 2048, so 2 layers and 2048
    assert data["kv"][0] == {"kv": "f16/f16", "all_layers": 1792, "gpu_layers": 2, "with_fewer": 2048}
    out = plan(str(TINY), "--gpu", "1024", "--reserve-mib", "1024", "--kv", "f16", code=1)
    assert "plan refused:" in out and "nothing fits" in out


def test_config_json_estimate_equals_the_converted_and_quantized_gguf():
    # the lab's tiny Llama: its config.json, and the Q4_K_M GGUF llama.cpp made from it
    estimate = shape_from_config(json.loads((CONFIGS / "tiny-llama.config.json").read_text()), "Q4_K_M")
    real = read_shape(str(TINY))
    for key in ("layer_bytes", "token_embd_bytes", "output_bytes", "n_vocab", "n_ctx_train", "n_head_kv", "file_type"):
        assert estimate[key] == real[key], key
    data = json.loads(plan("--config", str(CONFIGS / "tiny-llama.config.json"), "--gpu", "T4", "--json"))
    assert data["model"]["estimated_from"].endswith("at Q4_K_M (llama-quantize's type rules, ggml block sizes)")


def test_quant_rule_matches_llama_quantize_own_choices():
    log = (FIXTURES / "llama-server/load-logs/quantize-smoke-Q4_K_M.log").read_text()
    seen = {m.group(1): m.group(2).upper() for m in re.finditer(r"\] (\S+)\.weight .* converting to (\w+)", log)}
    assert len(seen) == 16
    for name, got in seen.items():
        parts = name.split(".")
        role = parts[-1] if parts[0] == "blk" else parts[0]
        layer = int(parts[1]) if parts[0] == "blk" else 0
        assert quant_type("Q4_K_M", role, layer, 2) == got, name


def test_the_write_ups_case_from_its_config():
    out = plan("--config", str(CONFIGS / "gemma-3-27b-it.config.json"), "--gpu", "V100 SXM2 16GB",
               "--rope-scaling", "yarn", "--rope-scale", "2", "--kv", "q4_0", "--ctx", "262144", code=1)  # fmt: skip
    assert "gemma3, 62 layers, 16 KV heads, trained 131072, yarn x2 from 131072: at most 262144 per slot" in out
    assert re.search(r"weights on the card +15\.40 GiB", out) and re.search(r"KV on the card +5\.80 GiB", out)
    # a V100 takes cuBLAS for prompts: the weights dequantized for it (0.24 GiB) and cuBLAS's own (88 MiB)
    assert re.search(r"prefill pool +0\.32 GiB", out) and "compute capability 7.0: prompts through cuBLAS" in out
    assert re.search(r"total on the card +24\.47 GiB +of 15\.75 GiB: does NOT fit", out)
    assert re.search(r"q4_0/q4_0 +0 +13056 with --n-gpu-layers 58", out)


def test_unknown_gpu_names_the_known_ones():
    out = plan(str(TINY), "--gpu", "V100", code=2)
    assert "different memory" in out and "Tesla V100 SXM2 32GB" in out


def test_hub_gguf_reads_only_the_header_with_ranges(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    # the tiny header, then 9 MiB standing in for the tensor data
    (repo / "model-Q4_K_M.gguf").write_bytes(TINY.read_bytes() + bytes(9 * 2**20))
    with HubServer({"org/tiny-gguf": repo}) as hub:
        sha = hub.repo("org/tiny-gguf").sha
        data = json.loads(plan("--hub-repo", "org/tiny-gguf", "--revision", sha, "--file", "model-Q4_K_M.gguf",
                               "--hub-endpoint", hub.url, "--gpu", "T4", "--json"))  # fmt: skip
        gets = hub.downloads("model-Q4_K_M.gguf")
    assert data["model"]["size"] == 23008 + 9 * 2**20 and data["model"]["header_requests"] == 1
    assert [g.range for g in gets] == [f"bytes=0-{HEADER_CHUNK - 1}"] and gets[0].status == 206
    assert data["ledger"]["weights_on_card"] == json.loads(plan(str(TINY), "--gpu", "T4", "--json"))[
        "ledger"]["weights_on_card"]


def test_one_source_only():
    assert "give one of" in plan("--gpu", "T4", code=2)
    assert "give one of" in plan(str(TINY), "--config", str(CONFIGS / "tiny-llama.config.json"), "--gpu", "T4", code=2)


@pytest.mark.parametrize("quant", ["Q8_0", "Q4_0", "F16", "Q6_K", "Q5_K_M"])
def test_other_quants_estimate_with_ggml_block_sizes(quant):
    config = json.loads((CONFIGS / "llama-3.1-8b-instruct.config.json").read_text())
    shape = shape_from_config(config, quant)
    params = 32 * (4096 * 4096 * 2 + 4096 * 1024 * 2 + 3 * 4096 * 14336)
    bits = {"Q8_0": 8.5, "Q4_0": 4.5, "F16": 16, "Q6_K": 6.5625, "Q5_K_M": 5.5}[quant]
    # the blocks alone, within what Q6_K layers (Q5_K_M) and f32 norms add
    assert params * bits / 8 <= sum(shape["layer_bytes"]) <= params * bits / 8 * 1.06


def test_each_card_of_several_keeps_its_own_reserve_and_prefill_pool():
    config = str(CONFIGS / "llama-3.1-8b-instruct.config.json")
    one = json.loads(plan("--config", config, "--gpu", "V100 SXM2 16GB", "--json"))
    two = json.loads(plan("--config", config, "--gpu", "V100 SXM2 16GB", "--gpus", "2", "--json"))
    # one V100 holds the 8B: a server per card, each planned as the one card is
    assert two["layout"]["chosen"] == "per_card" and two["ledger"] == one["ledger"] and two["plan"] == one["plan"]
    assert one["ledger"]["prefill_pool"] == 214 * 2**20 and one["ledger"]["reserve"] == 672 * 2**20
    split = json.loads(plan("--config", config, "--gpu", "V100 SXM2 16GB", "--gpus", "2", "--layout", "split",
                            "--json"))["layout"]["units"][0]["plan"]["ledger"]  # fmt: skip
    assert [c["prefill_pool"] for c in split["cards"]] == [214 * 2**20] * 2
    assert [c["reserve"] for c in split["cards"]] == [672 * 2**20] * 2
    t4 = json.loads(plan("--config", config, "--gpu", "T4", "--gpus", "2", "--layout", "split", "--json"))
    assert [c["prefill_pool"] for c in t4["layout"]["units"][0]["plan"]["ledger"]["cards"]] == [0, 0]


def test_the_write_ups_case_on_two_v100s_from_its_config():
    args = ("--config", str(CONFIGS / "gemma-3-27b-it.config.json"), "--gpu", "V100 SXM2 16GB", "--gpus", "2")
    out = plan(*args, "--kv", "q8_0")
    assert "cards: 2 x Tesla V100 SXM2 16GB (16130 MiB, 7.0: prompts through cuBLAS)" in out
    assert ("layout: auto: split over 2 cards (0, 1): 57 of 63 layers fit one Tesla V100 SXM2 16GB at 4,096 tokens "
            "(the minimum); 2 cards hold all 63 at 131,072 tokens (q8_0/q8_0 KV") in out  # fmt: skip
    assert "--n-gpu-layers 63 of 63 over 2 cards, --tensor-split 33,30 (GiB per card):" in out
    assert re.search(r"layers +0-32 +33-61\+out\n", out) and re.search(r"CUDA reserve +0\.66 +0\.66\n", out)
    assert re.search(r"prefill pool +0\.32 +0\.32\n", out) and re.search(r" +fits +fits\n", out)
    assert ("--ctx-size 131072 --parallel 1 --n-gpu-layers 63 --split-mode layer --tensor-split 33,30 --main-gpu 1\n"
            "host RAM: 1 unit, not checked") in out  # the last unit's flags, then the host's memory
    data = json.loads(plan(*args, "--kv", "q4_0", "--rope-scaling", "yarn", "--rope-scale", "2", "--json"))
    unit = data["layout"]["units"][0]
    assert unit["cards"] == [0, 1] and unit["plan"]["ctx_per_slot"] == 262144  # the write-up's 256K
    assert unit["plan"]["ledger"]["tensor_split"] == [33, 30] and data["plan"] == unit["plan"]
    assert [c["layers"] for c in data["ledger"]["cards"]] == [33, 30] and data["card"]["count"] == 2
    assert data["kv"] == [{"kv": "q4_0/q4_0", "all_layers": 262144, "gpu_layers": 63}]


def test_mixed_cards_by_name_and_eight_cards_per_card():
    out = plan("--config", str(CONFIGS / "gemma-3-27b-it.config.json"), "--gpu", "T4,Tesla P40", "--gpu",
               "V100 SXM2 16GB")  # fmt: skip
    assert "cards: 1 x Tesla T4 (15360 MiB, 7.5), 1 x Tesla P40 (23040 MiB, 6.1), 1 x Tesla V100 SXM2 16GB" in out
    assert "layout: auto: mixed: card 1 alone: " in out and "unit 2: cards 2, 0 (Tesla V100 SXM2 16GB, Tesla T4):" in out
    eight = plan("--config", str(CONFIGS / "llama-3.1-8b-instruct.config.json"), "--gpu", "V100 SXM2 16GB",
                 "--gpus", "8", "--layout", "per_card")  # fmt: skip
    assert "unit 1: card 0 (Tesla V100 SXM2 16GB):" in eight and "unit 8: card 7: as unit 1" in eight
    assert "ledger: ctx 131072 per slot x 1, q8_0/q8_0 KV, --n-gpu-layers 33 of 33:" in eight
    assert "name each card with --gpu" in plan(str(TINY), "--gpu", "T4", "--gpu", "T4", "--gpus", "2", code=2)


def test_several_cards_that_serve_nothing_are_refused_with_their_ledger():
    out = plan("--config", str(CONFIGS / "gemma-3-27b-it.config.json"), "--gpu", "4000", "--gpus", "2",
               "--gpu-layers", "63", code=1)  # fmt: skip
    assert "plan refused: 2 cards: memory: found 2 cards of 4000+4000 MiB" in out
    assert "all 2 cards:" in out and "does NOT fit" in out


def test_plan_says_where_the_ledger_alone_cannot_choose_the_layout():
    # Llama-3.1-8B with 4 slots: one V100 alone holds every layer at 74,240 tokens per slot, two
    # the trained 131,072: more servers or more context, which a host's llama-bench record settles
    args = ("--config", str(CONFIGS / "llama-3.1-8b-instruct.config.json"), "--gpu", "V100 SXM2 16GB", "--gpus", "2")
    data = json.loads(plan(*args, "--parallel", "4", "--json"))
    assert data["layout"]["chosen"] == "per_card" and data["layout"]["contested"].startswith(
        "the ledger alone cannot choose: per_card serves 2 units of 74,240 tokens per slot, split serves 1 unit of "
        "131,072 tokens per slot; on a host its llama-bench record of both decides")
    assert "per_card, the ledger's answer" in plan(*args, "--parallel", "4")
    # one slot: one card holds the trained context, nothing to settle
    assert json.loads(plan(*args, "--json"))["layout"]["contested"] is None

"""The context planner and the unit: memory arithmetic, refusals, flags."""

import json
import re
from pathlib import Path

import pytest

from llamarack.facts import parse_server_help
from llamarack.facts.llamacpp import ServerFlags
from llamarack.remote.gguf_header import GgufError, read_shape
from llamarack.roles.server.plan import (
    MIB,
    PlanError,
    kv_bytes_per_token,
    plan_context,
    render_unit,
    server_args,
)
from llamarack.settings import load_settings

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
TINY = FIXTURES / "gguf/tiny-llama-Q4_K_M.head.gguf"
# Llama-3.1-8B-Instruct Q4_K_M: 32 layers, 8 KV heads of 128, 131072 trained.
LLAMA8B = {"architecture": "llama", "size": 4_920_733_696, "n_layer": 32, "n_ctx_train": 131072,
           "n_head": 32, "n_head_kv": 8, "head_dim_k": 128, "head_dim_v": 128}  # fmt: skip
V100_16 = 16384  # MiB, as nvidia-smi lists a V100-SXM2-16GB
NEW_HELP = ServerFlags(("--load-mode", "none"), True, True, True)
OLD_HELP = ServerFlags(("--no-mmap",), False, False, False)


def settings(**data):
    return load_settings("gpu01", {"python_env_backend": "venv", **data})


def test_header_reader_matches_llama_cpp_own_reader():
    # values from gguf-py's GGUFReader on the whole file (tests/fixtures/gguf/README.md)
    shape = read_shape(str(TINY))
    assert {k: v for k, v in shape.items() if k != "path"} == {
        "architecture": "llama", "size": 23008, "file_type": 15, "n_layer": 2,
        "n_ctx_train": 2048, "n_head": 4, "n_head_kv": 2, "head_dim_k": 64, "head_dim_v": 64,
    }  # fmt: skip


def test_header_reader_refuses_what_is_not_gguf(tmp_path):
    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"GGML" + bytes(20))
    with pytest.raises(GgufError, match="not a GGUF"):
        read_shape(str(bad))
    bad.write_bytes(TINY.read_bytes()[:100])
    with pytest.raises(GgufError, match="truncated"):
        read_shape(str(bad))


@pytest.mark.parametrize("k, v, per_token", [
    ("f16", "f16", 128 * 1024),  # the well-known 128 KiB/token of Llama-3-8B at f16
    ("q8_0", "q8_0", 32 * 8 * 128 * 2 * 34 / 32),
    ("q4_0", "q4_0", 36 * 1024),  # 4.5 bits per value: 36 KiB/token
])  # fmt: skip
def test_kv_bytes_per_token_uses_ggml_block_sizes(k, v, per_token):
    s = settings(server_cache_type_k=k, server_cache_type_v=v)
    assert kv_bytes_per_token(s, LLAMA8B, 32) == per_token


def test_largest_context_that_fits_the_card():
    s = settings(server_cache_type_k="f16", server_cache_type_v="f16", server_flash_attn=True)
    plan = plan_context(s, LLAMA8B, V100_16)
    budget = V100_16 * MIB - LLAMA8B["size"] - 1024 * MIB
    assert plan.ctx_size == budget // (128 * 1024) // 256 * 256 == 85248
    assert plan.ctx_size % 256 == 0
    assert "largest that fits 16384 MiB" in plan.note


def test_quantized_kv_reaches_the_trained_context():
    plan = plan_context(settings(), LLAMA8B, V100_16)  # q4_0 K/V by default
    assert plan.ctx_size == 131072


def test_model_too_big_for_the_card_is_refused_with_numbers():
    big = dict(LLAMA8B, size=16_500_000_000, n_layer=62)  # a 27B at Q4_K_M
    with pytest.raises(PlanError) as e:
        plan_context(settings(), big, V100_16)
    msg = e.value.failure.message("gpu07")
    assert msg.startswith("gpu07: memory: found 16384 MiB on the card for 15736 MiB of weights")
    assert "needed" in msg and "Fix: a smaller model_quant" in msg


def test_given_context_that_does_not_fit_names_the_largest_that_does():
    s = settings(server_cache_type_k="f16", server_cache_type_v="f16", server_ctx_size=131072)
    with pytest.raises(PlanError) as e:
        plan_context(s, LLAMA8B, V100_16)
    f = e.value.failure
    assert f.rule == "memory" and "at most 85248 tokens" in f.needed
    assert "server_ctx_size <= 85248" in f.fix


def test_given_context_that_fits_is_kept():
    assert plan_context(settings(server_ctx_size=32768), LLAMA8B, V100_16).ctx_size == 32768


def test_context_beyond_the_trained_one_is_refused():
    with pytest.raises(PlanError) as e:
        plan_context(settings(server_ctx_size=200000), LLAMA8B, V100_16)
    assert e.value.failure.rule == "context-trained"
    assert "131072" in e.value.failure.needed


def test_partial_offload_counts_only_the_layers_on_the_card():
    s = settings(server_gpu_layers=16, server_cache_type_k="f16", server_cache_type_v="f16")
    plan = plan_context(s, LLAMA8B, V100_16)
    assert plan.weights_on_card == LLAMA8B["size"] // 2
    assert plan.kv_bytes_per_token == 64 * 1024


def test_cpu_serving_is_bounded_by_the_trained_context_only():
    plan = plan_context(settings(), LLAMA8B, None)
    assert plan.ctx_size == 131072 and plan.card_mib is None


def test_args_follow_the_built_binary_help():
    s = settings()
    ctx = plan_context(s, LLAMA8B, V100_16)
    new = server_args(s, NEW_HELP, "/opt/llamarack/builds/b1", "/opt/llamarack/models/m1", ctx, cuda=True)
    assert new[:3] == ["/opt/llamarack/builds/b1/bin/llama-server", "--model",
                       "/opt/llamarack/models/m1/model.gguf"]
    text = " ".join(new)
    assert "--load-mode none" in text and "--flash-attn on" in text and "--metrics" in text
    assert "--n-gpu-layers 99" in text and "--ctx-size 131072" in text
    assert "--cache-type-k q4_0 --cache-type-v q4_0" in text
    old = " ".join(server_args(s, OLD_HELP, "/b", "/m", ctx, cuda=True))
    assert "--no-mmap" in old and "--flash-attn " in old + " " and "--flash-attn on" not in old
    assert "--load-mode" not in old and "--metrics" not in old


def test_args_real_help_fixture_and_cpu_build_and_api_key():
    help_fixture = json.loads((Path(__file__).resolve().parents[1]
                               / "facts/LlamaServerFlags/pinned_0c1e57098.json").read_text())
    flags = parse_server_help("\n".join(help_fixture["output"]))
    s = settings(server_api_key_file="/secrets/key", server_mmap=True)
    ctx = plan_context(s, LLAMA8B, None)
    args = server_args(s, flags, "/b", "/m", ctx, cuda=False)
    assert "--n-gpu-layers" not in args and "--load-mode" not in args
    assert args[args.index("--api-key-file") + 1] == "/etc/llamarack/server-api-key"


def test_unit_runs_as_the_service_user_with_the_args():
    s = settings(llamarack_service_user="llm")
    ctx = plan_context(s, LLAMA8B, V100_16)
    unit = render_unit(s, server_args(s, NEW_HELP, "/b", "/m", ctx, cuda=True), "llamarack llama-server: m")
    assert "\nUser=llm\n" in unit and "\nDescription=llamarack llama-server: m\n" in unit
    assert "\nExecStart=/b/bin/llama-server --model /m/model.gguf --host 127.0.0.1 --port 8080 " in unit
    assert "\nRestart=on-failure\n" in unit and "WantedBy=multi-user.target" in unit


def test_kv_arithmetic_matches_what_llama_cpp_allocates():
    # llama.cpp's own report of the KV cache it made for the tiny model at ctx 2048
    log = (FIXTURES / "llama-server/kv-cache-sizes.log").read_text()
    reported = {m.group(2): float(m.group(1)) for m in re.finditer(
        r"llama_kv_cache: size = +([0-9.]+) MiB \( *2048 cells.*K \((\w+)\)", log)}
    assert set(reported) == {"q4_0", "f16", "q8_0"}
    shape = read_shape(str(TINY))
    for cache_type, mib in reported.items():
        s = settings(server_cache_type_k=cache_type, server_cache_type_v=cache_type)
        assert round(kv_bytes_per_token(s, shape, shape["n_layer"]) * 2048 / MIB, 2) == mib

"""The context planner and the unit: memory arithmetic, refusals, flags."""

import json
import re
import struct
from pathlib import Path

import pytest

from roles.llamacpp.reads import BuildFlags, parse_build_help
from roles.llamacpp.reads import ServerFlags
from roles.model.shapes import shape_from_config
from roles.server.planner import (CUBLAS_OWN_MIB, Card, Knobs, context_cap, cublas_prefill, layers_on_card, ledger,
                                  plan, prefill_pool_bytes, sliding_layers)  # fmt: skip
from roles.model.files.gguf_header import GgufError, read_shape
from roles.server.plan import (
    MIB,
    PlanError,
    knobs,
    render_unit,
    server_args,
)
from roles.server.settings import DEFAULT_RESERVE_MIB
from llamarack.errors import SettingsError
from roles.settings import load_settings

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
TINY = FIXTURES / "gguf/tiny-llama-Q4_K_M.head.gguf"
CONFIGS = FIXTURES / "configs"
GPU_LOGS = FIXTURES / "llama-server/gpu-load-logs"
# Llama-3.1-8B-Instruct at Q4_K_M, from its config.json: 32 layers, 8 KV heads of 128, 131072 trained.
LLAMA8B = shape_from_config(json.loads((CONFIGS / "llama-3.1-8b-instruct.config.json").read_text()), "Q4_K_M")
V100_16 = 16384  # MiB, as nvidia-smi lists a V100-SXM2-16GB
V100_CC = "7.0"
NEW_HELP = BuildFlags(("--load-mode", "none"), True, True, True, has_rope_scaling=True)
OLD_HELP = ServerFlags(("--no-mmap",), False, False, False)


def settings(**data):
    return load_settings("gpu01", {"python_env_backend": "venv", **data})


def plan_context(s, shape: dict, card_mib, draft_shape=None, compute_cap=None):
    """The server role's plan of ``shape`` on one card of ``card_mib`` (None: served from the CPU)."""
    return plan(shape, knobs(s), [Card("card", card_mib, compute_cap)] if card_mib is not None else [], draft_shape)


def test_header_reader_matches_llama_cpp_own_reader():
    # values from gguf-py's GGUFReader on the whole file (tests/fixtures/gguf/README.md)
    shape = read_shape(str(TINY))
    assert {k: shape[k] for k in ("architecture", "size", "file_type", "n_layer", "n_ctx_train", "n_head",
                                  "n_head_kv", "head_dim_k", "head_dim_v", "n_vocab")} == {
        "architecture": "llama", "size": 23008, "file_type": 15, "n_layer": 2,
        "n_ctx_train": 2048, "n_head": 4, "n_head_kv": 2, "head_dim_k": 64, "head_dim_v": 64, "n_vocab": 1000,
    }  # fmt: skip
    # The whole file is 1,087,936 bytes, its data from offset 23008: the tensors' own
    # sizes fill that section but for the alignment padding (32 bytes at most each).
    tensors = sum(shape["layer_bytes"]) + shape["token_embd_bytes"] + shape["output_bytes"]
    assert 1_087_936 - 23008 - 21 * 32 <= tensors <= 1_087_936 - 23008
    assert not shape["tied_embeddings"] and shape["n_swa"] == 0


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
    assert plan_context(s, LLAMA8B, V100_16).ledger.kv_bytes_per_token == per_token


def test_largest_context_that_fits_the_card():
    s = settings(server_cache_type_k="f16", server_cache_type_v="f16", server_flash_attn=True)
    plan = plan_context(s, LLAMA8B, V100_16)
    book = plan.ledger
    # every byte counted: weights (all 33 layers), KV, compute estimate, reserve
    spare = V100_16 * MIB - book.total_on_card
    assert 0 <= spare < 128 * 1024 * 256 + 512 * 2 * 256  # one more step of 256 would not fit
    assert plan.ctx_size == 88832 and plan.ctx_size % 256 == 0
    assert plan.gpu_layers == 33 and book.weights_on_host == LLAMA8B["token_embd_bytes"]
    assert "largest that fits 16384 MiB" in plan.note


def test_auto_kv_takes_the_most_precise_type_that_gives_the_context():
    # f16 reaches 88832 on a V100 16 GB; the trained 131072 needs q8_0, not q4_0
    plan = plan_context(settings(), LLAMA8B, V100_16)
    assert (plan.cache_type_k, plan.cache_type_v, plan.ctx_size) == ("q8_0", "q8_0", 131072)
    assert plan.largest == {"f16/f16": 88832, "q8_0/q8_0": 131072, "q4_0/q4_0": 131072}
    # a context f16 gives keeps f16 (quantized KV was 11% slower on the H200)
    small = plan_context(settings(server_ctx_size=32768), LLAMA8B, V100_16)
    assert (small.cache_type_k, small.cache_type_v) == ("f16", "f16")
    # without flash attention V stays f16 (a quantized V needs it); K still steps down
    no_fa = plan_context(settings(server_flash_attn=False), LLAMA8B, V100_16)
    assert no_fa.cache_type_v == "f16" and no_fa.cache_type_k in ("q8_0", "q4_0")
    # a fixed type is kept as given
    fixed = plan_context(settings(server_cache_type_k="q4_0", server_cache_type_v="q4_0"), LLAMA8B, V100_16)
    assert (fixed.cache_type_k, fixed.cache_type_v) == ("q4_0", "q4_0")


def test_given_context_that_does_not_fit_names_the_largest_that_does():
    s = settings(server_cache_type_k="f16", server_cache_type_v="f16", server_ctx_size=131072)
    with pytest.raises(PlanError) as e:
        plan_context(s, LLAMA8B, V100_16)
    f = e.value.failure
    assert f.rule == "memory" and "at most 88832 tokens" in f.needed
    assert "server_ctx_size <= 88832" in f.fix


def test_given_context_that_fits_is_kept():
    assert plan_context(settings(server_ctx_size=32768), LLAMA8B, V100_16).ctx_size == 32768


def test_context_beyond_the_trained_one_is_refused_unless_yarn_allows_it():
    with pytest.raises(PlanError) as e:
        plan_context(settings(server_ctx_size=200000), LLAMA8B, V100_16)
    assert e.value.failure.rule == "context-trained"
    assert "131072" in e.value.failure.needed and "server_rope_scaling = 'yarn'" in e.value.failure.fix
    yarn = settings(server_ctx_size=200000, server_rope_scaling="yarn", server_rope_scale=2.0,
                    server_cache_type_k="q4_0", server_cache_type_v="q4_0", llamacpp_backend="cpu")
    plan = plan_context(yarn, LLAMA8B, None)
    assert plan.ctx_size == 200000 and plan.rope == ("yarn", 2.0, 131072)
    # linear: llama-server caps every slot at the trained context, so no more is allowed
    with pytest.raises(PlanError):
        plan_context(settings(server_ctx_size=200000, server_rope_scaling="linear", server_rope_scale=2.0),
                     LLAMA8B, V100_16)  # fmt: skip


def test_parallel_slots_share_the_context():
    one = plan_context(settings(server_cache_type_k="q4_0", server_cache_type_v="q4_0"), LLAMA8B, V100_16)
    four = plan_context(settings(server_parallel=4, server_ctx_size=32768), LLAMA8B, V100_16)
    assert (four.ctx_per_slot, four.parallel, four.ctx_size) == (32768, 4, 131072)
    assert four.ledger.kv_on_card == four.ledger.kv_bytes_per_token * 131072
    assert (four.cache_type_k, one.ctx_size) == ("q8_0", 131072)  # f16 gives 84480 in all, not 4 x 32768
    args = server_args(settings(server_parallel=4), NEW_HELP, "/b", "/m", four, cuda=True)
    assert " --ctx-size 131072 --parallel 4 " in " ".join(args) + " "


def test_gpu_layers_count_the_last_layers_and_the_output_layer():
    # llama.cpp puts the LAST --n-gpu-layers of n_layer + 1 on the card, the output layer last
    assert list(layers_on_card(32, 33)) == list(range(32))
    assert list(layers_on_card(32, 32)) == list(range(1, 32))  # layer 0 stays on the CPU
    assert list(layers_on_card(32, 1)) == []  # the output layer only
    s = settings(server_gpu_layers=17, server_cache_type_k="f16", server_cache_type_v="f16")
    plan = plan_context(s, LLAMA8B, V100_16)
    book = plan.ledger
    assert plan.gpu_layers == 17
    assert book.weights_on_card == sum(LLAMA8B["layer_bytes"][16:]) + LLAMA8B["output_bytes"]
    assert book.kv_bytes_per_token == 16 * 8 * 128 * 2 * 2
    cpu_only = plan_context(settings(server_gpu_layers=0), LLAMA8B, V100_16)
    # nothing of the model on the card; a CUDA build still makes its context there
    book = cpu_only.ledger
    assert cpu_only.gpu_layers == 0 and book.weights_on_card == book.kv_on_card == 0 and "CPU" in cpu_only.note
    assert book.total_on_card == book.reserve


def test_partial_offload_picks_the_most_layers_that_leave_the_minimum_context():
    big = shape_from_config(json.loads((CONFIGS / "gemma-3-27b-it.config.json").read_text()), "Q4_K_M")
    plan = plan_context(settings(), big, 16130)
    assert plan.gpu_layers == 60 and "60 of 63 layers on the card" in plan.note
    assert ledger(big, knobs(settings()), [Card("c", 16130)], 60, "q4_0", "q4_0", 4096).fits()
    assert not ledger(big, knobs(settings()), [Card("c", 16130)], 61, "q4_0", "q4_0", 4096).fits()
    assert plan.ctx_size >= 4096 and plan.cache_type_k == "q4_0"
    # a fixed count that leaves no room is refused with the numbers
    with pytest.raises(PlanError) as e:
        plan_context(settings(server_gpu_layers=63), big, 16130)
    msg = e.value.failure.message("gpu07")
    assert msg.startswith("gpu07: memory: found 16130 MiB on the card for 15774 MiB of weights")
    assert "Fix: a smaller model_quant" in msg


def test_cpu_serving_is_bounded_by_the_trained_context_only():
    plan = plan_context(settings(), LLAMA8B, None)
    assert plan.ctx_size == 131072 and plan.ledger.card_mib is None and plan.gpu_layers is None


def test_args_follow_the_built_binary_help():
    s = settings()
    ctx = plan_context(s, LLAMA8B, V100_16)
    new = server_args(s, NEW_HELP, "/opt/llamarack/builds/b1", "/opt/llamarack/models/m1", ctx, cuda=True)
    assert new[:3] == ["/opt/llamarack/builds/b1/bin/llama-server", "--model",
                       "/opt/llamarack/models/m1/model.gguf"]
    text = " ".join(new)
    assert "--load-mode none" in text and "--flash-attn on" in text and "--metrics" in text
    assert "--n-gpu-layers 33" in text and "--ctx-size 131072" in text
    assert "--cache-type-k q8_0 --cache-type-v q8_0" in text  # auto's choice reaches the unit
    assert "--rope-scaling" not in text
    old = " ".join(server_args(s, OLD_HELP, "/b", "/m", ctx, cuda=True))
    assert "--no-mmap" in old and "--flash-attn " in old + " " and "--flash-attn on" not in old
    assert "--load-mode" not in old and "--metrics" not in old


def test_args_real_help_fixture_and_cpu_build_and_api_key():
    help_fixture = json.loads((Path(__file__).resolve().parents[1]
                               / "facts/LlamaServerFlags/pinned_0c1e57098.json").read_text())
    flags = parse_build_help("\n".join(help_fixture["output"]))
    s = settings(server_api_key_file="/secrets/key", server_mmap=True)
    ctx = plan_context(s, LLAMA8B, None)
    args = server_args(s, flags, "/b", "/m", ctx, cuda=False)
    assert "--n-gpu-layers" not in args and "--load-mode" not in args
    assert args[args.index("--api-key-file") + 1] == "/etc/llamarack/server-api-key"


def test_backend_sampling_is_on_by_default_where_a_cuda_build_has_it():
    flags = fixture_flags("pinned_0c1e57098")
    assert flags.has_backend_sampling  # "-bs, --backend-sampling" in the pinned build's --help
    ctx = plan_context(settings(), LLAMA8B, V100_16)
    assert settings().server.backend_sampling == "auto"
    assert server_args(settings(), flags, "/b", "/m", ctx, cuda=True)[-2:] == ["--backend-sampling", "--metrics"]
    # auto: not on a CPU build (its backend is the CPU), nor with a build whose --help lacks it
    cpu = plan_context(settings(llamacpp_backend="cpu"), LLAMA8B, None)
    assert "--backend-sampling" not in server_args(settings(llamacpp_backend="cpu"), flags, "/b", "/m", cpu, cuda=False)
    for lacking in (NEW_HELP, OLD_HELP, fixture_flags("late_2024_no_mmap")):
        assert "--backend-sampling" not in server_args(settings(), lacking, "/b", "/m", ctx, cuda=True)
    off = settings(server_backend_sampling="off")
    assert "--backend-sampling" not in server_args(off, flags, "/b", "/m", ctx, cuda=True)


def test_backend_sampling_on_refuses_a_build_without_it():
    flags, ctx = fixture_flags("pinned_0c1e57098"), plan_context(settings(), LLAMA8B, V100_16)
    on = settings(server_backend_sampling="on")
    assert server_args(on, flags, "/b", "/m", ctx, cuda=True)[-2:] == ["--backend-sampling", "--metrics"]
    assert "--backend-sampling" in server_args(on, flags, "/b", "/m", plan_context(on, LLAMA8B, None), cuda=False)
    for lacking in (NEW_HELP, fixture_flags("late_2024_no_mmap")):
        with pytest.raises(PlanError) as e:
            server_args(on, lacking, "/b", "/m", ctx, cuda=True)
        assert e.value.failure.rule == "backend-sampling" and "server_backend_sampling = 'auto'" in e.value.failure.fix
        assert "server_backend_sampling 'on', but this build's llama-server --help has no --backend-sampling" \
            in e.value.failure.message("gpu01")  # fmt: skip


def test_backend_sampling_takes_the_switch_it_was():
    # An inventory written when the setting was a bool still loads and means what it meant.
    flags, ctx = fixture_flags("pinned_0c1e57098"), plan_context(settings(), LLAMA8B, V100_16)
    assert settings(server_backend_sampling=True).server.backend_sampling == "on"
    assert settings(server_backend_sampling=False).server.backend_sampling == "off"
    assert "--backend-sampling" not in server_args(settings(server_backend_sampling=False), flags, "/b", "/m", ctx,
                                                   cuda=True)  # fmt: skip
    with pytest.raises(PlanError):
        server_args(settings(server_backend_sampling=True), NEW_HELP, "/b", "/m", ctx, cuda=True)
    # Only the booleans: 1 and 0 are no switch, and the error names every value it takes.
    for wrong in (1, 0, "true", "yes"):
        with pytest.raises(SettingsError, match="server_backend_sampling: given .*; allowed: one of 'auto', 'on', "
                                                "'off'; still taken: True \\(now 'on'\\), False \\(now 'off'\\)"):
            settings(server_backend_sampling=wrong)


def fixture_flags(case: str):
    """The ``BuildFlags`` of a ``LlamaServerFlags`` fixture's --help."""
    found = json.loads((Path(__file__).resolve().parents[1] / f"facts/LlamaServerFlags/{case}.json").read_text())
    return parse_build_help("\n".join(found["output"]))


def test_sleep_is_asked_only_of_a_build_that_has_it():
    flags = fixture_flags("pinned_0c1e57098")
    assert flags.has_sleep_idle and not fixture_flags("late_2024_no_mmap").has_sleep_idle
    ctx = plan_context(settings(), LLAMA8B, V100_16)
    assert "--sleep-idle-seconds" not in server_args(settings(), flags, "/b", "/m", ctx, cuda=True)  # off by default
    asleep = settings(server_sleep_idle_seconds=300)
    args = server_args(asleep, flags, "/b", "/m", ctx, cuda=True)
    assert args[-3:] == ["--sleep-idle-seconds", "300", "--metrics"]
    assert "--sleep-idle-seconds 300 --metrics" in render_unit(asleep, args, "llamarack llama-server: m")
    for lacking in (fixture_flags("late_2024_no_mmap"), NEW_HELP):
        with pytest.raises(PlanError) as e:
            server_args(asleep, lacking, "/b", "/m", ctx, cuda=True)
        assert e.value.failure.rule == "sleep-idle" and "unset server_sleep_idle_seconds" in e.value.failure.fix
        assert "server_sleep_idle_seconds 300, but this build's llama-server --help has no --sleep-idle-seconds" \
            in e.value.failure.message("gpu01")  # fmt: skip
    with pytest.raises(SettingsError, match="server_sleep_idle_seconds: given 0; allowed: an integer from 1"):
        settings(server_sleep_idle_seconds=0)


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
        book = ledger(shape, knobs(settings()), [], 0, cache_type, cache_type, 2048)
        assert round((book.kv_on_card + book.kv_on_host) / MIB, 2) == mib


LOAD_LOGS = FIXTURES / "llama-server/load-logs"
SMOKE = FIXTURES / "gguf/smoke-Q4_K_M.head.gguf"


def _mib(log: str, pattern: str) -> float:
    return float(re.search(pattern + r" += +([0-9.]+) MiB", log).group(1))


@pytest.mark.parametrize("log_name, k, v, per_slot, slots", [
    ("f16-c1024", "f16", "f16", 1024, 1),
    ("q8_0-c4096", "q8_0", "q8_0", 4096, 1),
    ("q4_0-c8192-p4", "q4_0", "q4_0", 2048, 4),
    ("yarn2-q4_0-c2048", "q4_0", "q4_0", 2048, 1),
    ("q8_0-f16-c1000-p3", "q8_0", "f16", 512, 3),  # llama.cpp: 1000 -> 1024 / 3 -> 341 -> 512 per slot
])  # fmt: skip
def test_ledger_matches_llama_cpp_load_log(log_name, k, v, per_slot, slots):
    """KV, weights and compute against what llama.cpp itself allocated (README of load-logs)."""
    log = (LOAD_LOGS / f"{log_name}.log").read_text()
    shape = read_shape(str(SMOKE))
    book = ledger(shape, Knobs(parallel=slots), [], 0, k, v, per_slot)
    kv = re.search(r"llama_kv_cache: size = +([0-9.]+) MiB \( *(\d+) cells, +2 layers, +(\d+)/", log)
    assert (int(kv.group(2)), int(kv.group(3))) == (per_slot, slots)  # cells per stream, streams
    assert round((book.kv_on_card + book.kv_on_host) / MIB, 2) == float(kv.group(1))
    assert round(book.weights_on_host / MIB, 2) == _mib(log, "CPU model buffer size")
    # the compute estimate errs on the safe side, by less than 3% of llama.cpp's CPU figure
    reported = _mib(log, "CPU compute buffer size")
    assert reported <= book.compute / MIB <= reported * 1.03
    assert f"n_ctx                 = {per_slot * slots}" in log


def test_trained_context_caps_each_slot_unless_yarn_raises_it():
    shape = read_shape(str(SMOKE))
    capped = (LOAD_LOGS / "q8_0-c4096.log").read_text()  # asked 4096, trained 1024
    assert "n_ctx_slot = 1024" in capped
    assert context_cap(shape, Knobs()) == (1024, ())
    yarn = (LOAD_LOGS / "yarn2-q4_0-c2048.log").read_text()
    assert "n_ctx_train adjusted to 2048" in yarn and "n_ctx_slot = 2048" in yarn
    assert context_cap(shape, Knobs(rope_scaling="yarn", rope_scale=2.0)) == (2048, ("yarn", 2.0, 1024))


def test_rope_flags_reach_the_unit_as_the_pinned_help_spells_them():
    help_text = (FIXTURES / "llama-server/help-0c1e57098.txt").read_text()
    flags = parse_build_help(help_text)
    assert flags.has_rope_scaling
    s = settings(server_rope_scaling="yarn", server_rope_scale=2.0, server_ctx_size=262144,
                 server_cache_type_k="q4_0", server_cache_type_v="q4_0")  # fmt: skip
    ctx = plan_context(s, LLAMA8B, 32768)
    text = " ".join(server_args(s, flags, "/b", "/m", ctx, cuda=True))
    assert "--ctx-size 262144" in text and "--rope-scaling yarn --rope-scale 2 --yarn-orig-ctx 131072" in text
    with pytest.raises(PlanError) as e:
        server_args(s, OLD_HELP, "/b", "/m", ctx, cuda=True)  # a build that does not say it has them
    assert e.value.failure.rule == "rope-scaling"


def test_the_write_ups_case_gemma_3_27b_q4_k_m_on_a_v100_16gb():
    """The write-up: 13.5 GB of weights + 5 GB of q4_0 KV at 256K (YaRN x2), and "it does not fit".
    The true numbers, from Gemma-3-27B's published config.json (google/gemma-3-27b-it)."""
    shape = shape_from_config(json.loads((CONFIGS / "gemma-3-27b-it.config.json").read_text()), "Q4_K_M")
    assert shape["n_layer"] == 62 and len(sliding_layers(shape)) == 52  # 5 of every 6 slide (1024)
    assert round(shape["size"] / 1e9, 2) == 16.54  # the published Q4_K_M GGUFs: 16.5 GB
    s = settings(server_rope_scaling="yarn", server_rope_scale=2.0, server_ctx_size=262144,
                 server_cache_type_k="q4_0", server_cache_type_v="q4_0")  # fmt: skip
    book = ledger(shape, knobs(s), [Card("c", 16130, V100_CC)], 63, "q4_0", "q4_0", 262144)
    gib = {k: round(getattr(book, k) / 2**30, 2) for k in ("weights_on_card", "weights_on_host", "kv_on_card",
                                                           "compute_on_card", "prefill_pool", "reserve", "total_on_card")}
    # 15.40 GiB on the card: every layer plus the Q6_K output layer (the tied embedding's second
    # copy); 1.08 GiB of token embedding on the host. KV: 10 dense layers x 256K + 52 at 1536 cells.
    # A V100 multiplies prompts with cuBLAS: a feed-forward weight dequantized (5376 x 21504 x 2 bytes)
    # and the batch (512 x 21504 x 2), and cuBLAS's own 88 MiB.
    assert gib == {"weights_on_card": 15.40, "weights_on_host": 1.08, "kv_on_card": 5.80,
                   "compute_on_card": 2.29, "prefill_pool": 0.32, "reserve": 0.66, "total_on_card": 24.47}  # fmt: skip
    assert book.prefill_pool == 2 * 5376 * 21504 + 2 * 512 * 21504 + 88 * MIB
    assert book.kv_bytes_per_token == 10 * 16 * 128 * 2 * 18 / 32
    with pytest.raises(PlanError) as e:
        plan_context(s, shape, 16130, compute_cap=V100_CC)
    assert "at most 13056 tokens per slot" in e.value.failure.needed
    # what the card does serve: 58 of 63 layers, 13056 tokens per slot. Without the prefill pool
    # it was 60 and 5120: the GPU proof served that plan on an H200 (MMQ, no pool) in 16100 MiB
    # of the 16130 (bench/results/gpu-proof.json, v100_question); a V100 would have needed 330
    # MiB more at its first long prompt. This plan, served through cuBLAS as a V100 serves
    # prompts: test_the_v100_plan_of_the_27b_holds_on_the_cublas_path.
    served = plan_context(settings(server_rope_scaling="yarn", server_rope_scale=2.0), shape, 16130,
                          compute_cap=V100_CC)  # fmt: skip
    assert (served.gpu_layers, served.ctx_size, served.cache_type_k) == (58, 13056, "q4_0")
    h200_path = plan_context(settings(server_rope_scaling="yarn", server_rope_scale=2.0), shape, 16130)
    assert (h200_path.gpu_layers, h200_path.ctx_size) == (60, 5120) and h200_path.ledger.prefill_pool == 0


def test_the_prefill_pool_is_what_a_cublas_build_holds_beyond_mmq():
    """An 8B served on the H200 by the role's build (MMQ) and by a GGML_CUDA_FORCE_CUBLAS build
    of the same source and flags, after a 128- and a 512-token prompt (gpu-load-logs,
    cublas-pool.json). The H200's cuBLAS path computes in f16 through an f16 product buffer,
    as a P100's does (6.0); a V100 writes the f32 product in place."""
    data = json.loads((GPU_LOGS / "cublas-pool.json").read_text())
    shape = json.loads((GPU_LOGS / "llama3-8b.shape.json").read_text())
    used = {(r["build"], r["prompt_tokens"]): r for r in data["rows"] if "env" not in r}
    forced = (GPU_LOGS / used[("GGML_CUDA_FORCE_CUBLAS", 512)]["log"]).read_text()
    assert "FORCE_CUBLAS = 1" in forced and "FORCE_CUBLAS" not in (GPU_LOGS / used[("the role's", 512)]["log"]).read_text()
    extra = {}
    for tokens in (128, 512):
        cublas, mmq = used[("GGML_CUDA_FORCE_CUBLAS", tokens)], used[("the role's", tokens)]
        # the same buffers, the same memory until a prompt runs
        assert _cuda_buffers((GPU_LOGS / cublas["log"]).read_text()) == _cuda_buffers((GPU_LOGS / mmq["log"]).read_text())
        assert cublas["after_load_mib"] == mmq["after_load_mib"]
        extra[tokens] = cublas["process_mib"] - mmq["process_mib"]
        planned = prefill_pool_bytes(shape, "6.0", tokens) / MIB
        assert extra[tokens] <= planned <= extra[tokens] + 3  # covered, to 3 MiB (204 of 204.5, 216 of 218)
    # the batch's share: 384 more tokens, planned 13.5 MiB, measured 12
    assert abs((prefill_pool_bytes(shape, "6.0", 512) - prefill_pool_bytes(shape, "6.0", 128)) / MIB
               - (extra[512] - extra[128])) <= 2  # fmt: skip
    # Volta: no f16 product buffer
    assert prefill_pool_bytes(shape, "7.0") == 2 * 4096 * 14336 + 2 * 512 * 14336 + CUBLAS_OWN_MIB * MIB


def test_the_v100_plan_of_the_27b_holds_on_the_cublas_path():
    """The write-up's 27B planned for a V100 16 GB (58 of 63 layers, 13056 tokens, q4_0, the
    prefill pool counted) and served on the H200 by a GGML_CUDA_FORCE_CUBLAS build, so that
    prompts take the V100's path and the pool is really made: a 1024-token prompt after
    loading (gpu-load-logs, v100-cublas.json)."""
    data = json.loads((GPU_LOGS / "v100-cublas.json").read_text())
    shape = json.loads((GPU_LOGS / "gemma3-27b.shape.json").read_text())
    rows = {r["knob"].split(" ", 1)[1]: r for r in data["rows"]}
    card = 16130
    books = {}
    for name, r in rows.items():
        log = (GPU_LOGS / r["log"]).read_text()
        assert "FORCE_CUBLAS = 1" in log and f"n_ctx                 = {r['ctx_per_slot']}" in log
        k = r["cache_type"]
        books[name] = book = ledger(shape, Knobs(), [Card("c", card, V100_CC)], r["gpu_layers"], k, k, r["ctx_per_slot"])
        seen = _cuda_buffers(log)
        assert abs(book.weights_on_card / MIB - seen[("model", True)]) <= 0.1
        assert abs(book.kv_on_card / MIB - seen[("KV", True)]) <= 0.02
    plan, layer_past, step_past = rows["plan"], rows["one_layer_past"], rows["one_ctx_step_past"]
    assert (plan["gpu_layers"], plan["ctx_per_slot"]) == (58, 13056)
    # the plan holds, after the prompt made the pool: 16094 of the card's 16130 MiB, under the
    # planned 16129; one layer more does not (16348)
    assert plan["process_mib"] <= books["plan"].total_on_card / MIB <= card
    assert layer_past["process_mib"] > card
    # the prompt's growth: the pool as an H200's cuBLAS path makes it (an f16 product buffer as
    # a P100's, 6.0: 334.75 MiB; a V100's is 329.5) and the 12 MiB any build's pool took after a
    # prompt (the 8B's MMQ rows, cublas-pool.json)
    grown = plan["process_mib"] - plan["after_load_mib"]
    mmq = [r for r in json.loads((GPU_LOGS / "cublas-pool.json").read_text())["rows"]
           if "env" not in r and r["build"] == "the role's" and r["prompt_tokens"] == 512]  # fmt: skip
    any_build = mmq[0]["process_mib"] - mmq[0]["after_load_mib"]
    assert abs(grown - (prefill_pool_bytes(shape, "6.0") / MIB + any_build)) <= 2  # 346 against 346.75
    assert books["plan"].prefill_pool == prefill_pool_bytes(shape, V100_CC) == 329.5 * MIB
    # One context step is 256 tokens of a cache that only 1 layer in 6 keeps whole (the others
    # slide over 1024): 5.9 MiB planned, 6 seen; the plan's 36 MiB of margin is six such steps.
    assert step_past["process_mib"] - plan["process_mib"] == 6
    assert abs((books["one_ctx_step_past"].total_on_card - books["plan"].total_on_card) / MIB - 6) <= 0.2


def test_which_cards_take_cublas_for_prompts():
    assert all(cublas_prefill(c) for c in ("7.0", "7.2", "6.0", "5.2"))  # V100, Xavier, P100, Maxwell
    assert not any(cublas_prefill(c) for c in ("7.5", "6.1", "8.0", "8.6", "8.9", "9.0", None, "[N/A]"))
    assert prefill_pool_bytes(LLAMA8B, "7.5") == prefill_pool_bytes(LLAMA8B, "6.1") == 0  # T4, P40: MMQ
    f16_weights = dict(LLAMA8B, file_type=1)  # cuBLAS multiplies those as they are, on every card
    assert prefill_pool_bytes(f16_weights, "7.0") == 0


def test_a_v100_host_plans_the_prefill_pool_and_a_t4_host_does_not():
    from roles.driver.reads import Gpu
    from roles.server.card_layout import cards_of

    v100 = Gpu(0, "Tesla V100-SXM2-16GB", "GPU-1", 16160, "7.0", "550.127.05", "0x1DB110DE")
    t4 = Gpu(1, "Tesla T4", "GPU-2", 15360, "7.5", "550.127.05", "0x1EB810DE")
    s = settings(server_ctx_size=65536, server_cache_type_k="f16", server_cache_type_v="f16")
    pools = [c.prefill_pool for c in plan(LLAMA8B, knobs(s), cards_of((t4, v100)), split_mode="layer").ledger.cards]
    assert pools == [0, 214 * MIB]  # each card by its own capability: the V100's pool, none on the T4
    volta = plan_context(s, LLAMA8B, 16130, compute_cap="7.0").ledger
    turing = plan_context(s, LLAMA8B, 16130, compute_cap="7.5").ledger
    assert volta.prefill_pool == 214 * MIB and turing.prefill_pool == 0
    assert volta.total_on_card - turing.total_on_card == 214 * MIB
    # the unit a V100 host renders loads kernels lazily, as the reserve was measured
    unit = render_unit(s, server_args(s, NEW_HELP, "/b", "/m", plan_context(s, LLAMA8B, 16130), cuda=True), "m")
    assert "\nEnvironment=CUDA_MODULE_LOADING=LAZY\n" in unit


def test_eager_module_loading_holds_more_of_the_card():
    """The same 8B plan with CUDA_MODULE_LOADING=EAGER (the default of CUDA runtimes before 12.2)
    and LAZY (gpu-load-logs, cublas-pool.json): why the unit sets LAZY."""
    rows = {r["env"]["CUDA_MODULE_LOADING"]: r for r in json.loads((GPU_LOGS / "cublas-pool.json").read_text())["rows"]
            if "env" in r}  # fmt: skip
    assert rows["EAGER"]["process_mib"] - rows["LAZY"]["process_mib"] == 112
    assert rows["EAGER"]["after_load_mib"] - rows["LAZY"]["after_load_mib"] == 114


def _gguf_header(meta: list, tensors: list) -> bytes:
    """A GGUF v3 header (no tensor data), written with the smoke model's own writer helpers."""
    from roles.llamacpp.files.llamacpp_proof import _gguf_kv, _gguf_string

    infos = b"".join(_gguf_string(name) + struct.pack("<I", len(dims)) + struct.pack(f"<{len(dims)}Q", *dims)
                     + struct.pack("<IQ", kind, 0) for name, dims, kind in tensors)  # fmt: skip
    return b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(meta)) + b"".join(_gguf_kv(*m) for m in meta) + infos


def test_header_reader_takes_sliding_windows_rope_and_tied_embeddings(tmp_path):
    meta = [("general.architecture", "str", "gemma3"), ("gemma3.block_count", "u32", 6),
            ("gemma3.context_length", "u32", 131072), ("gemma3.embedding_length", "u32", 512),
            ("gemma3.attention.head_count", "u32", 8), ("gemma3.attention.head_count_kv", "u32", 4),
            ("gemma3.attention.key_length", "u32", 128), ("gemma3.attention.value_length", "u32", 128),
            ("gemma3.attention.sliding_window", "u32", 1024), ("gemma3.rope.scaling.type", "str", "yarn"),
            ("gemma3.rope.scaling.factor", "f32", 4.0),
            ("gemma3.rope.scaling.original_context_length", "u32", 32768)]  # fmt: skip
    # token_embd q6_K (14) and no output.weight: tied; one block per layer, q4_K (12)
    tensors = [("token_embd.weight", (512, 1000), 14), ("output_norm.weight", (512,), 0)]
    tensors += [(f"blk.{i}.attn_q.weight", (512, 1024), 12) for i in range(6)]
    path = tmp_path / "g.gguf"
    path.write_bytes(_gguf_header(meta, tensors))
    shape = read_shape(str(path))
    assert shape["tied_embeddings"] and shape["n_vocab"] == 1000
    assert shape["token_embd_bytes"] == 512 * 1000 // 256 * 210 and shape["output_bytes"] == 512 * 4
    assert shape["layer_bytes"] == [512 * 1024 // 256 * 144] * 6
    assert (shape["rope_scaling"], shape["rope_scale"], shape["rope_orig_ctx"]) == ("yarn", 4.0, 32768)
    # llama.cpp's gemma3 default: every 6th layer dense, the others slide
    assert sliding_layers(shape) == frozenset({0, 1, 2, 3, 4})
    assert context_cap(shape, Knobs(rope_scaling="yarn", rope_scale=4.0)) == (131072, ("yarn", 4.0, 32768))
    # the tied embedding goes on the card as the output layer, and stays on the host as the input
    book = ledger(shape, Knobs(), [Card("c", 4096)], 7, "f16", "f16", 4096)
    assert book.weights_on_card == sum(shape["layer_bytes"]) + shape["output_bytes"] + shape["token_embd_bytes"]
    assert book.weights_on_host == shape["token_embd_bytes"]
    # 1 dense layer at 4096 cells, 5 sliding at pad256(1024 + 512) = 1536
    assert book.kv_on_card == (4096 + 5 * 1536) * 4 * 128 * 2 * 2


def _vocab_gguf(tokens: list, merges: list) -> bytes:
    """A llama header whose tokenizer arrays come before the keys the planner keeps."""
    meta = [("general.architecture", "str", "llama"), ("tokenizer.ggml.tokens", "[]str", tokens),
            ("tokenizer.ggml.token_type", "[]i32", [1] * len(tokens)), ("tokenizer.ggml.merges", "[]str", merges),
            ("llama.block_count", "u32", 2), ("llama.context_length", "u32", 8192),
            ("llama.embedding_length", "u32", 256), ("llama.attention.head_count", "u32", 4),
            ("llama.attention.head_count_kv", "u32", 2), ("general.file_type", "u32", 15)]  # fmt: skip
    tensors = [("token_embd.weight", (256, len(tokens)), 12)] + [(f"blk.{i}.attn_q.weight", (256, 256), 12)
                                                                  for i in range(2)]  # fmt: skip
    return _gguf_header(meta, tensors)


def test_the_vocabulary_is_read_past_across_chunks_and_long_strings(tmp_path):
    """A real vocabulary (10^5 strings) is skipped from chunks of the file, not read string
    by string: strings of every length, some across a chunk's end, one longer than a chunk,
    and the keys after them still read right, as the whole-metadata reader reads them."""
    from roles.model.files import gguf_header

    tokens = [("t" * (i % 23)) + str(i) for i in range(30000)]
    tokens[7777] = "L" * (3 * gguf_header._SKIP_CHUNK + 5)  # past two chunks at once
    merges = [f"{a} {b}" for a, b in zip(tokens[:20000], tokens[1:20001])]
    path = tmp_path / "v.gguf"
    path.write_bytes(_vocab_gguf(tokens, merges))
    shape = read_shape(str(path))
    assert (shape["n_layer"], shape["n_ctx_train"], shape["n_head_kv"], shape["file_type"]) == (2, 8192, 2, 15)
    assert shape["n_vocab"] == 30000 and shape["layer_bytes"] == [256 * 256 // 256 * 144] * 2
    whole = gguf_header.read_metadata(str(path))  # every value read, the tokens decoded
    assert whole["tokenizer.ggml.tokens"] == tokens and whole["llama.block_count"] == 2


def test_a_vocabulary_that_runs_past_the_file_is_an_error(tmp_path):
    data = bytearray(_vocab_gguf([f"tok{i}" for i in range(5000)], []))
    at = data.index(b"tok4000") - 8  # that token's length: past the end of the file
    data[at:at + 8] = struct.pack("<Q", len(data))
    path = tmp_path / "v.gguf"
    path.write_bytes(bytes(data))
    with pytest.raises(GgufError, match="past the end of the file"):
        read_shape(str(path))
    (tmp_path / "cut.gguf").write_bytes(bytes(data[:data.index(b"tok4000")]))  # cut inside the array
    with pytest.raises(GgufError):
        read_shape(str(tmp_path / "cut.gguf"))


@pytest.mark.parametrize("offset", [24, 40, 300, 4096, 9000])
def test_a_corrupt_gguf_header_is_an_answer_never_a_crash(tmp_path, offset):
    """Model file metadata is untrusted: 8 bytes overwritten anywhere in the header (a
    length, a count, a type) give an error the planner reports, not a traceback or a
    MemoryError from a claimed 2^60-byte string."""
    import subprocess
    import sys

    from llamarack import remote

    data = bytearray((Path(__file__).parents[1] / "fixtures/gguf/tiny-llama-Q4_K_M.head.gguf").read_bytes())
    data[offset:offset + 8] = b"\xff" * 8
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(bytes(data))
    r = subprocess.run(remote.command("gguf_header", str(gguf), python=sys.executable), shell=True,
                       capture_output=True, text=True, timeout=60)  # fmt: skip
    assert r.returncode == 0 and r.stderr == "", r.stderr[-2000:]
    answer = json.loads(r.stdout)
    assert "error" in answer or answer.get("architecture"), answer


def _cuda_buffers(log: str) -> dict:
    """MiB by (what, on the card): the model buffers as loaded, the KV buffers of the
    context (after its n_ctx line: a fitting dry run comes first), added up over a
    sliding-window model's two caches."""
    out: dict = {}
    ctx_at = log.rfind("llama_context: n_ctx ")
    for m in re.finditer(r"(load_tensors|llama_kv_cache|sched_reserve): +(\S+) (model|KV|compute) buffer size = +"
                         r"([0-9.]+) MiB", log):  # fmt: skip
        if m.group(3) != "model" and m.start() < ctx_at:
            continue
        key = (m.group(3), m.group(2) == "CUDA0")
        out[key] = round(out.get(key, 0.0) + float(m.group(4)), 2)
    return out


@pytest.mark.parametrize("case", json.loads((GPU_LOGS / "cases.json").read_text()), ids=lambda c: c["log"])
def test_ledger_matches_llama_cpp_on_cuda(case):
    """Weights and KV, on the card and on the host, against what llama.cpp allocated on an
    H200 (README of gpu-load-logs); the compute estimate is a bound there, and the reserve
    covers what no buffer line names."""
    log = (GPU_LOGS / case["log"]).read_text()
    shape = json.loads((GPU_LOGS / f"{case['shape']}.shape.json").read_text())
    k = case["cache_type"]
    book = ledger(shape, Knobs(parallel=case["parallel"]), [Card("c", 143771)], case["gpu_layers"], k, k, case["ctx_per_slot"])
    seen = _cuda_buffers(log)
    mib = lambda b: round(b / MIB, 2)  # noqa: E731
    # to the 0.1 MiB: CUDA pads the rows of a quantized tensor on the card (Gemma: 0.07 MiB)
    assert abs(mib(book.weights_on_card) - seen[("model", True)]) <= 0.1
    assert mib(book.weights_on_host) == seen[("model", False)]
    # to the 0.02 MiB: a sliding-window model prints two caches, each rounded to 0.01
    assert abs(mib(book.kv_on_card) - seen[("KV", True)]) <= 0.02
    assert abs(mib(book.kv_on_host) - seen.get(("KV", False), 0.0)) <= 0.02
    assert f"n_ctx                 = {case['ctx_per_slot'] * case['parallel']}" in log
    compute, estimate = seen[("compute", True)], mib(book.compute_on_card)
    if case["gpu_layers"] == shape["n_layer"] + 1 and not shape["n_swa"]:
        # a dense model, every layer on the card (3 contexts x 2 KV types, q8_0, auto, 4 slots,
        # YaRN to 131072 cells): the mask beside the larger of the feed-forward and attention
        # peaks (a q4_0 cache converted to f16: 192, 352, 672 MiB at 32K, 64K, 128K) is
        # llama.cpp's figure, to 0.1 MiB
        assert abs(estimate - compute) <= 0.1
    else:
        # layers on the CPU, a sliding window: under llama.cpp's figure by 10 to 17%
        assert 0.83 * compute < estimate < compute
    # what no buffer line names (CUDA context, cuBLAS, pools: 601-611 MiB) stays inside the reserve
    beyond = case["process_mib"] - seen[("model", True)] - seen[("KV", True)] - compute
    assert 600 < beyond < 612
    # and so does the process less everything the ledger counts besides the reserve
    assert case["process_mib"] - (book.total_on_card - book.reserve) / MIB < DEFAULT_RESERVE_MIB


def test_an_operator_template_edited_between_two_renders_is_the_one_rendered(tmp_path):
    """Each template search path keeps one jinja2 environment (compiled once, not per host);
    an edit of an operator's template still shows at the next render."""
    import os

    s = settings()
    args = server_args(s, NEW_HELP, "/b", "/m", plan_context(s, LLAMA8B, V100_16), cuda=True)
    own = render_unit(s, args, "m")
    template = tmp_path / "llama-server.service.j2"
    template.write_text("# site A\n{{ exec_start }}\n")
    exec_line = next(line for line in own.splitlines() if line.startswith("ExecStart="))
    assert render_unit(s, args, "m", (tmp_path,)) == f"# site A\n{exec_line.split('=', 1)[1]}\n"
    template.write_text("# site B\n{{ exec_start }}\n")
    os.utime(template, ns=(template.stat().st_mtime_ns + 10**9,) * 2)
    assert render_unit(s, args, "m", (tmp_path,)).startswith("# site B\n")
    assert render_unit(s, args, "m") == own  # the role's own, with no override

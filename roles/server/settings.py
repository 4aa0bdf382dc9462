"""The server role's settings section (host-data keys ``server_*``)."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Literal, Optional

from llamarack.settings_fields import Section, control_file, listen_address, setting

KV_CACHE_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")
UNQUANTIZED = {"f16", "bf16", "f32", "auto"}  # KV types llama.cpp's tensor split takes


def _split_mode(value: str) -> Optional[str]:
    if value in ("layer", "tensor"):
        return None
    row = "; not row: deprecated upstream, and no faster than layer on P40s" if value == "row" else ""
    return "layer or tensor" + row


# The most a setting counts of a model's layers or its context.
MAX_LAYERS = 4096
MAX_CONTEXT = 1 << 24


# Card memory the ledger's items do not count: the CUDA context and pools, and what the
# compute estimate misses (654.5 MiB at most measured, +17.5 MiB; docs/planning.md, "Reserve";
# tests/unit/test_server_plan.py::test_ledger_matches_llama_cpp_on_cuda).
DEFAULT_RESERVE_MIB = 672
# llama-server's prompt cache limit when --cache-ram is not given (llama.cpp's
# common/common.h, cache_ram_mib; its --help says "default: 8192").
DEFAULT_CACHE_RAM_MIB = 8192


@dataclass(frozen=True)
class ServerSettings(Section):
    """How llama-server runs."""

    prefix = "server"

    listen: str = setting("127.0.0.1", "address llama-server listens on; any other than loopback needs "
                          "server_api_key_file or server_allow_unauthenticated", listen_address)
    port: int = setting(8080, "TCP port llama-server listens on", between=(1, 65535))
    # -- the memory plan (roles/server/planner.py) --
    ctx_size: Optional[int] = setting(None, "context per slot; None means the largest that fits the card",
                                      between=(1, MAX_CONTEXT))
    cache_type_k: str = setting("auto", "K cache type; auto: the most precise of f16, q8_0, q4_0 that gives the "
                                "context", choices=("auto",) + KV_CACHE_TYPES)
    cache_type_v: str = setting("auto", "V cache type, as K (quantized V needs flash attention)",
                                choices=("auto",) + KV_CACHE_TYPES)
    gpu_layers: Optional[int] = setting(None, "--n-gpu-layers (n_layer + 1 = all, 0 = CPU only); None: all that fit",
                                        between=(0, MAX_LAYERS))
    min_ctx_size: int = setting(4096, "context per slot below which fewer layers go on the card",
                                between=(1, MAX_CONTEXT))
    rope_scaling: Literal["none", "yarn", "linear"] = setting(
        "none", "RoPE scaling past the trained context (yarn: up to original x scale)")
    rope_scale: float = setting(1.0, "RoPE scale factor (--rope-scale)", between=(1.0, 128.0))
    rope_orig_ctx: Optional[int] = setting(None, "YaRN's original context; None: the GGUF's (--yarn-orig-ctx)",
                                           between=(1, MAX_CONTEXT))
    # -- how a host's cards serve (roles/server/card_layout.py) --
    layout: Literal["auto", "per_card", "split"] = setting(
        "auto", "how a host's cards serve: per_card (one llama-server per card, port server_port + N), split (one "
        "over the fewest cards that hold every layer), auto (per_card when one card holds the model, else split)")
    split_mode: str = setting("layer", "llama.cpp's --split-mode for a unit over several cards: layer, or tensor (an "
                              "unquantized KV cache only)", _split_mode)
    # -- the host's memory (roles/server/host_ram.py) --
    cache_ram: int = setting(
        DEFAULT_CACHE_RAM_MIB, "llama-server's prompt cache in host RAM (--cache-ram, MiB): llama.cpp's default 8192; "
        "-1 no limit but the context's tokens, 0 none; lowered where the host's memory does not hold every unit",
        between=(-1, MAX_CONTEXT))
    cache_ram_min: int = setting(
        1024, "the least --cache-ram (MiB) the planner lowers server_cache_ram to where the host's memory does not "
        "hold every unit; below it the host is refused (0: the prompt cache may go)", between=(0, MAX_CONTEXT))
    host_ram_reserve_mib: int = setting(
        4096, "host memory (of MemTotal) the units leave to the system, its page cache and the deploy's own steps",
        between=(0, MAX_CONTEXT))
    # -- end of the memory plan --
    residency: Literal["auto", "on", "off"] = setting(
        "auto", "check after each start, and in the audit, that the served process is on its planned cards "
        "(nvidia-smi's compute apps): auto (a CUDA build's units), on (every unit planned on a card, whatever the "
        "build: a lab whose fake driver lists the served process), off (never: a driver that cannot list the "
        "host's processes, as in some containers)")
    flash_attn: bool = setting(True, "flash attention")
    backend_sampling: Literal["auto", "on", "off"] = setting(
        "auto", "--backend-sampling: sample on the GPU, greedy tokens unchanged (llama.cpp marks it experimental; "
        "measured on an H200, 8B Q4_K_M: 0.94 of llama-bench's tg128 with it, 0.88-0.92 without): auto (a CUDA "
        "build whose llama-server --help has it), on (refuse a build without it), off (sample on the CPU); "
        "docs/planning.md, \"Backend sampling\", says which samplers still run on the CPU",
        formerly={True: "on", False: "off"})
    mmap: bool = setting(False, "mmap the model file (off: copy weights to the GPU once)")
    repack: bool = setting(True, "CPU weight repacking (AMX and repacked kernels); False serves with --no-repack")
    parallel: int = setting(1, "parallel slots; --ctx-size is the context per slot x slots", between=(1, 1024))
    sleep_idle_seconds: Optional[int] = setting(
        None, "--sleep-idle-seconds: after this many seconds without a request, llama-server frees the model and "
        "its cards' memory until a request wakes it (reloading the model); None: it never sleeps",
        between=(1, 1 << 30))
    api_key_file: Optional[str] = setting(None, "file on the control machine holding the API key (never printed; "
                                          "mode 600 or 400)", control_file)
    allow_unauthenticated: bool = setting(
        False, "True serves an API without a key on an address other than loopback: anyone who reaches "
        "server_listen may use it (a closed lab network)")
    memory_reserve_mib: int = setting(
        DEFAULT_RESERVE_MIB, "card memory kept free of weights, KV cache and compute buffers (CUDA context, "
        "pools, and what the compute estimate misses: up to 654.5 MiB measured on an H200); a V100's or P100's "
        "cuBLAS prefill pool is planned beside it", between=(1, 1 << 18))
    health_timeout: int = setting(600, "seconds a (re)started llama-server has to answer /health before rollback",
                                  between=(1, 86400))
    # -- speculative decoding, with model_draft_repo --
    draft_max: int = setting(16, "most tokens the draft proposes per step (--spec-draft-n-max)", between=(1, 1024))
    draft_min: int = setting(0, "fewest draft tokens worth verifying (--spec-draft-n-min)", between=(0, 1024))
    draft_gpu_layers: Optional[int] = setting(None, "the draft's --spec-draft-ngl (-ngld); None: all of its layers",
                                              between=(0, MAX_LAYERS))
    # -- the benchmark after a new build or model --
    bench: Literal["off", "beside", "stopped"] = setting(
        "stopped", "llama-bench (pp512, tg128, the served flags) of each distinct unit after a new build or model, "
        "recorded in <root>/state/bench.json: stopped (the units on the cards measured are stopped for it and "
        "started again), beside (while they serve: the cards are shared, the figures are lower), off")

    def problems(self) -> list[str]:
        problems = []
        if self.cache_type_v not in ("f16", "auto") and not self.flash_attn:
            problems.append(f"server_flash_attn: given False; allowed: True while server_cache_type_v is "
                            f"{self.cache_type_v!r} (a quantized V cache needs flash attention)")
        if self.split_mode == "tensor" and self.layout != "per_card" and \
                not {self.cache_type_k, self.cache_type_v} <= UNQUANTIZED:
            problems.append(f"server_split_mode: given 'tensor' with a {self.cache_type_k}/{self.cache_type_v} KV "
                            "cache; allowed: layer, or an unquantized KV cache (f16, bf16, f32): llama.cpp's tensor "
                            "split does not take a quantized one")
        if self.draft_min > self.draft_max:
            problems.append(f"server_draft_min: given {self.draft_min}; allowed: at most server_draft_max "
                            f"({self.draft_max})")
        if not (self.api_key_file or self.allow_unauthenticated or ipaddress.ip_address(self.listen).is_loopback):
            problems.append(f"server_listen: given {self.listen!r} with no server_api_key_file; allowed: a loopback "
                            "address (127.0.0.1, ::1), or set server_api_key_file (clients then need the key), or "
                            "server_allow_unauthenticated = True to serve an API anyone on that network may use")
        return problems

# Runs on the host (standard library only, imports nothing from llamarack; run by llamarack.remote.command).
"""Prove a llama.cpp build by making it compute, before it may become current.

    python3 llamacpp_proof.py SPEC.json

A build that compiled and names its commit can still die at its first real
kernel: a CUDA build without code for the card's arch ("no kernel image is
available for execution on the device"), or a ``-march=native`` CPU build
on a virtual CPU that advertises AMX but faults on the first tile
instruction. So, after every build and before ``builds/current`` moves:

1. write a tiny Llama GGUF, deterministically (``write_smoke_gguf``: 2
   layers, 256 wide, a byte-level SentencePiece vocabulary, fixed-seed
   random weights; the same bytes on every host);
2. quantize it with the build's own ``llama-quantize`` to the served type;
3. serve it with the build's ``llama-server`` and the runtime flags the
   unit will use (KV cache types, flash attention, mmap off, every layer on
   the GPU on a CUDA host), ask ``/completion`` for a few tokens after a
   prompt of ``PROOF_BATCH`` tokens (one batch, as large as any tool's
   below), and check that they came back with finite probabilities in
   bounded time;
4. run the other tools the deploy runs with the build, as it runs them:
   ``llama-perplexity`` as the quality runs do (f16 logits, then the
   quant's KL divergence per KV type) and ``llama-bench`` as the bench
   does, each with the same runtime switches (``runtime_args``).

When any of that fails and the spec allows it, the next rung of the spec's ladder
is tried: a runtime switch on the same binary (``--no-repack``: no AMX or
repacked CPU kernels), then rebuilds with fewer CPU extensions
(x86-64-v3, x86-64-v2). The first rung that computes wins. The result, with
every failed attempt and why, goes into ``build-info.json``: written last,
atomically, so a build without it never counts. When no rung computes,
nothing is written, the tail of llama.cpp's own output is printed, and the
exit code is 1: the caller leaves ``current`` and the served unit alone.

The spec (JSON, written by llamarack.operations.build):

    build_dir        <root>/builds/<stamp>
    record           the build plan (written into build-info.json)
    quant            llama-quantize type for the smoke model
    serving          {cache_type_k, cache_type_v, flash_attn, mmap, gpu_layers}
                     (gpu_layers null: a CPU build)
    rungs            [{name, why, serving, cmake_args, configure, build, x86_only}]:
                     serving overrides the serving flags (repack: false);
                     configure/build: shell commands of a rebuild, or absent
    timeout          seconds a server may take to load and answer
    reprove          true: the build exists and a newer proof checks it again in
                     place (its ladder holds no rebuild); on failure the proof's
                     id goes into ``proof-failed.json`` and build-info.json is kept
"""

from __future__ import annotations

import json
import math
import os
import platform
import random
import re
import signal
import socket
import struct
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass
from typing import Optional

# --------------------------------------------------------------------------
# How the built llama-server spells its options (read from its --help)
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class ServerFlags:
    """How the built ``llama-server`` spells the options the unit needs.

    Flags change between llama.cpp versions and a wrong one stops the server
    (``error: invalid argument: --no-mmap``), so the unit is written from
    what the built binary's ``--help`` says, not from a version table.
    """

    mmap_off: tuple
    """Arguments that turn mmap off: ``("--no-mmap",)`` or ``("--load-mode", "none")``."""
    flash_attn_takes_value: bool
    """``--flash-attn on|off|auto`` (True) or a bare switch (False)."""
    has_api_key_file: bool
    has_metrics: bool
    repack_off: tuple = ()
    """Arguments that turn CPU weight repacking (AMX and repacked kernels) off; () when none."""
    proven_args: tuple = ()
    """Runtime arguments the build's smoke run needed to compute (e.g. ``("--no-repack",)``)."""

    def to_json(self) -> dict:
        """For pyinfra's CLI (``fact``, ``--json``), which looks for this method."""
        return asdict(self)

    def flash_attn(self, on: bool) -> tuple:
        if self.flash_attn_takes_value:
            return ("--flash-attn", "on" if on else "off")
        return ("--flash-attn",) if on else ()


def parse_server_help(text: str, proven_args: tuple = ()) -> ServerFlags:
    """Read ``llama-server --help`` into a ServerFlags record."""
    if "--load-mode" in text:
        mmap_off: tuple = ("--load-mode", "none")
    elif "--no-mmap" in text:
        mmap_off = ("--no-mmap",)
    else:
        raise ValueError("llama-server --help names neither --load-mode nor --no-mmap")
    fa = re.search(r"--flash-attn( \[?[A-Za-z|]+\]?| FA)?", text)
    if not fa:
        raise ValueError("llama-server --help does not name --flash-attn")
    return ServerFlags(
        mmap_off=mmap_off,
        flash_attn_takes_value=bool(fa.group(1)),
        has_api_key_file="--api-key-file" in text,
        has_metrics="--metrics" in text,
        repack_off=("--no-repack",) if "--no-repack" in text else (),
        proven_args=tuple(proven_args),
    )


def serving_args(flags: ServerFlags, serving: dict) -> list:
    """The runtime flags llama-server is started with, by the unit and by the smoke run alike.

    ``serving``: cache_type_k, cache_type_v, flash_attn, mmap, repack, and
    gpu_layers (None on a CPU build: no ``--n-gpu-layers``).
    """
    args = ["--cache-type-k", serving["cache_type_k"], "--cache-type-v", serving["cache_type_v"]]
    if serving.get("gpu_layers") is not None:
        args += ["--n-gpu-layers", str(serving["gpu_layers"])]
    args += list(flags.flash_attn(serving["flash_attn"]))
    if not serving["mmap"]:
        args += list(flags.mmap_off)
    if not serving.get("repack", True):
        args += list(flags.repack_off)
    args += [a for a in runtime_args("llama-server", flags.proven_args) if a not in args]
    return args


# How a tool spells a runtime switch where it differs from llama-server's.
TOOL_SPELLING = {"llama-bench": {"--no-repack": ("--repack", "0")}}


def runtime_args(tool: str, proven: tuple) -> list:
    """The runtime switches a build's proof needed (``proof.runtime_args`` of its
    ``build-info.json``, e.g. ``--no-repack``) as ``tool`` spells them: every llama.cpp tool
    the deploy runs (the unit's llama-server, llama-perplexity, llama-bench, and the proof's
    own runs) takes them from here. llama-quantize computes no graph: it takes none."""
    if tool == "llama-quantize":
        return []
    spelling = TOOL_SPELLING.get(tool, {})
    return [word for arg in proven for word in spelling.get(arg, (arg,))]


def bench_args(flags: ServerFlags, serving: dict) -> list:
    """llama-bench's runtime flags for the served ``serving`` (as ``serving_args`` takes it), as
    llama-bench spells them: KV types, flash attention, layers on the GPU, mmap, repacking."""
    fa = serving["flash_attn"]
    args = ["-ctk", serving["cache_type_k"], "-ctv", serving["cache_type_v"],
            "-fa", ("on" if fa else "off") if flags.flash_attn_takes_value else ("1" if fa else "0")]  # fmt: skip
    if serving.get("gpu_layers") is not None:
        args += ["-ngl", str(serving["gpu_layers"])]
    if not serving["mmap"]:
        # llama-bench follows llama-server: --load-mode there, -lm here; --no-mmap there, -mmp 0 here.
        args += ["-lm", "none"] if "--load-mode" in flags.mmap_off else ["-mmp", "0"]
    off = () if serving.get("repack", True) else ("--no-repack",)
    return args + runtime_args("llama-bench", tuple(dict.fromkeys(flags.proven_args + off)))


# --------------------------------------------------------------------------
# The smoke model: a tiny Llama GGUF, the same bytes everywhere
# --------------------------------------------------------------------------

SMOKE_SHAPE = dict(n_embd=256, n_layer=2, n_head=4, n_head_kv=2, n_ff=256, n_ctx_train=1024)
SMOKE_SEED = 20261201
_GGUF_STRING, _GGUF_ARRAY = 8, 9
_GGUF_SCALAR = {"u32": (4, "<I"), "i32": (5, "<i"), "f32": (6, "<f"), "bool": (7, "<?")}
_GGML_F32, _GGML_F16 = 0, 1
_ALIGN = 32


def smoke_vocab() -> tuple:
    """(tokens, scores, types): <unk>, <s>, </s>, the 256 byte tokens, then letters and ▁words."""
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [2, 3, 3] + [6] * 256  # unknown, control, control, byte
    words = ["\u2581"] + [chr(c) for c in range(ord("a"), ord("z") + 1)]
    words += ["\u2581" + w for w in ("hello", "llama", "rack", "the", "a", "of", "and", "to")]
    tokens += words
    types += [1] * len(words)
    scores = [0.0] * 259 + [-float(i) for i in range(len(words))]
    return tokens, scores, types


def _gguf_string(s: str) -> bytes:
    data = s.encode()
    return struct.pack("<Q", len(data)) + data


def _gguf_kv(key: str, kind: str, value) -> bytes:
    out = _gguf_string(key)
    if kind == "str":
        return out + struct.pack("<I", _GGUF_STRING) + _gguf_string(value)
    if kind.startswith("[]"):
        elem = kind[2:]
        out += struct.pack("<IIQ", _GGUF_ARRAY, _GGUF_STRING if elem == "str" else _GGUF_SCALAR[elem][0],
                           len(value))
        if elem == "str":
            return out + b"".join(_gguf_string(v) for v in value)
        return out + struct.pack(f"<{len(value)}{_GGUF_SCALAR[elem][1][1]}", *value)
    code, fmt = _GGUF_SCALAR[kind]
    return out + struct.pack("<I", code) + struct.pack(fmt, value)


def smoke_gguf_bytes() -> bytes:
    """The smoke model as GGUF v3 bytes (f16 matrices, f32 norms), deterministic."""
    s = SMOKE_SHAPE
    tokens, scores, types = smoke_vocab()
    n_vocab, d, head_dim = len(tokens), s["n_embd"], s["n_embd"] // s["n_head"]
    kv_dim = head_dim * s["n_head_kv"]
    meta = [
        ("general.architecture", "str", "llama"),
        ("general.name", "str", "llamarack smoke"),
        ("general.file_type", "u32", 1),
        ("llama.context_length", "u32", s["n_ctx_train"]),
        ("llama.embedding_length", "u32", d),
        ("llama.block_count", "u32", s["n_layer"]),
        ("llama.feed_forward_length", "u32", s["n_ff"]),
        ("llama.attention.head_count", "u32", s["n_head"]),
        ("llama.attention.head_count_kv", "u32", s["n_head_kv"]),
        ("llama.attention.layer_norm_rms_epsilon", "f32", 1e-5),
        ("llama.rope.freq_base", "f32", 10000.0),
        ("llama.rope.dimension_count", "u32", head_dim),
        ("llama.vocab_size", "u32", n_vocab),
        ("tokenizer.ggml.model", "str", "llama"),
        ("tokenizer.ggml.tokens", "[]str", tokens),
        ("tokenizer.ggml.scores", "[]f32", scores),
        ("tokenizer.ggml.token_type", "[]i32", types),
        ("tokenizer.ggml.bos_token_id", "u32", 1),
        ("tokenizer.ggml.eos_token_id", "u32", 2),
        ("tokenizer.ggml.unknown_token_id", "u32", 0),
        ("tokenizer.ggml.add_bos_token", "bool", True),
    ]
    # (name, dims with the row length first as GGUF stores them, type)
    tensors = [("token_embd.weight", (d, n_vocab), _GGML_F16)]
    for i in range(s["n_layer"]):
        b = f"blk.{i}."
        tensors += [
            (b + "attn_norm.weight", (d,), _GGML_F32),
            (b + "attn_q.weight", (d, d), _GGML_F16),
            (b + "attn_k.weight", (d, kv_dim), _GGML_F16),
            (b + "attn_v.weight", (d, kv_dim), _GGML_F16),
            (b + "attn_output.weight", (d, d), _GGML_F16),
            (b + "ffn_norm.weight", (d,), _GGML_F32),
            (b + "ffn_gate.weight", (d, s["n_ff"]), _GGML_F16),
            (b + "ffn_up.weight", (d, s["n_ff"]), _GGML_F16),
            (b + "ffn_down.weight", (s["n_ff"], d), _GGML_F16),
        ]
    tensors += [("output_norm.weight", (d,), _GGML_F32), ("output.weight", (d, n_vocab), _GGML_F16)]

    rng = random.Random(SMOKE_SEED)
    blobs, infos, offset = [], [], 0
    for name, dims, kind in tensors:
        count = math.prod(dims)
        if kind == _GGML_F32:  # norm weights: ones
            data = struct.pack(f"<{count}f", *([1.0] * count))
        else:
            scale = 1.0 / math.sqrt(dims[0])
            data = struct.pack(f"<{count}e", *(rng.uniform(-scale, scale) for _ in range(count)))
        infos.append(_gguf_string(name) + struct.pack("<I", len(dims))
                     + struct.pack(f"<{len(dims)}Q", *dims) + struct.pack("<IQ", kind, offset))
        pad = -len(data) % _ALIGN
        blobs.append(data + b"\0" * pad)
        offset += len(data) + pad
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(meta))
    head += b"".join(_gguf_kv(*m) for m in meta) + b"".join(infos)
    head += b"\0" * (-len(head) % _ALIGN)
    return head + b"".join(blobs)


def write_smoke_gguf(path: str) -> None:
    with open(path + ".tmp", "wb") as f:
        f.write(smoke_gguf_bytes())
    os.replace(path + ".tmp", path)


# --------------------------------------------------------------------------
# One smoke run, and the ladder
# --------------------------------------------------------------------------

# i-quants that llama-quantize refuses without an importance matrix.
NEEDS_IMATRIX = ("IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS")
# A failure of the GPU backend ("no kernel image is available for execution on
# the device": no code for the card's arch): no CPU rung can cure it.
GPU_FAILURE = re.compile(r"CUDA error|no kernel image is available|ggml_cuda_")
# The card had not the memory the smoke run asked (a cudaMalloc at model load, a compute
# buffer, a stream at the first fit). Not the build's fault, and no CPU rung cures it. Whose
# memory filled the card is told by llama.cpp's own buffers on it, as it logs them at load
# ("load_tensors: CUDA0 model buffer size = 4403.49 MiB", "llama_kv_cache: CUDA0 KV buffer
# size = ...", "sched_reserve: CUDA0 compute buffer size = ...") and the allocation that failed
# ("allocating 1234.56 MiB on device 0: cudaMalloc failed: out of memory"), against the card's
# memory where the log says it ("Device 0: NVIDIA H200, ..., VRAM: 143155 MiB", "- CUDA0 :
# NVIDIA H200 (143155 MiB, 142629 MiB free)"): its own buffers, or another process.
GPU_OUT_OF_MEMORY = re.compile(r"cudaMalloc failed: out of memory|(failed|unable) to allocate CUDA\d* buffer"
                               r"|CUDA error: out of memory")
GPU_BUFFER = re.compile(r"\bCUDA(\d+) +(model|KV|compute) buffer size = +(\d+(?:\.\d+)?) MiB")
GPU_FAILED_ALLOC = re.compile(r"allocating (\d+(?:\.\d+)?) MiB on device (\d+): cudaMalloc failed")
GPU_CARD_MIB = re.compile(r"Device (\d+): [^\n]*\bVRAM: (\d+) MiB"
                          r"|- CUDA(\d+) +: [^\n]*\((\d+) MiB, \d+ MiB free\)")
# What a card holds besides the buffers (the CUDA context, cuBLAS, the pools: 522-694 MiB on
# an H200): own buffers within this of the card's memory fill it; below this, they are small.
GPU_OVERHEAD_MIB = 1024
# Why llama.cpp left the card out (it then computes on the CPU with -ngl ignored).
NO_GPU = re.compile(r"no usable GPU found[^\n]*|failed to initialize CUDA[^\n]*|no CUDA-capable device[^\n]*")
SMOKE_TOKENS = 8
# The batch the smoke runs compute in one step: at least that of every tool the deploy runs
# afterwards (llama-bench's pp512, the quality runs' 256), so a kernel that faults only on a
# large batch (a repacked or AMX one) fails here, where the ladder can still climb.
PROOF_BATCH = 512
SMOKE_CTX = 1024  # the smoke model's trained context: the batch and the tokens after it fit
# The KV types the quality runs measure a quant with (roles/model/files/model_quality.py).
QUALITY_KV_TYPES = ("f16", "q8_0", "q4_0")


class SmokeFailure(Exception):
    def __init__(self, why: str, tail: str = "", on_gpu: bool = False):
        super().__init__(why)
        self.why, self.tail, self.on_gpu = why, tail, on_gpu


def named_gpu_failure(e: SmokeFailure) -> SmokeFailure:
    """``e``, or, where its log shows the card ran out of memory, that cause named: the model's
    own buffers (model, KV cache, compute, the failed allocation among them) where they fill the
    card's memory, or come to a GiB or more where the log does not say the card's memory; another
    process where they are small."""
    found = GPU_OUT_OF_MEMORY.search(e.tail)
    if not found:
        return e
    line = next((ln.strip() for ln in e.tail.splitlines() if GPU_OUT_OF_MEMORY.search(ln)), found.group(0))
    failed = GPU_FAILED_ALLOC.findall(e.tail)
    device = failed[-1][1] if failed else "0"
    sizes = [(kind, float(mib)) for dev, kind, mib in GPU_BUFFER.findall(e.tail) if dev == device]
    sizes += [("compute", float(failed[-1][0]))] if failed else []
    cards = [int(m[1] or m[3]) for m in GPU_CARD_MIB.findall(e.tail) if (m[0] or m[2]) == device]
    cards = [mib for mib in cards if mib]  # 0 where cudaMemGetInfo failed on a full card: "(0 MiB, 0 MiB free)"
    own = sum(mib for _, mib in sizes)
    parts = " + ".join(f"{kind} {mib:.2f}" for kind, mib in sizes) + " MiB"
    parts += " (the last the allocation that failed)" if failed else ""
    end = "; the build is not at fault, and what serves now keeps serving"
    if cards and own + GPU_OVERHEAD_MIB > cards[-1]:
        return SmokeFailure(f"the GPU ran out of memory for the smoke run ({line}): the model's own buffers do "
                            f"not fit the card: {parts} = {own:.2f} MiB of its {cards[-1]} MiB, which leaves "
                            f"less than {GPU_OVERHEAD_MIB} MiB for the CUDA context and its pools; another "
                            f"process is not what filled it{end}", e.tail, on_gpu=True)  # fmt: skip
    if not cards and own >= GPU_OVERHEAD_MIB:
        return SmokeFailure(f"the GPU ran out of memory for the smoke run ({line}): the model's own buffers "
                            f"asked for {parts} = {own:.2f} MiB; where that comes near the card's memory "
                            f"(nvidia-smi's memory.total) they do not fit it, else another process holds the "
                            f"rest (nvidia-smi names it){end}", e.tail, on_gpu=True)  # fmt: skip
    return SmokeFailure(f"the GPU ran out of memory for the smoke run ({line}): another process holds the "
                        "card's memory (nvidia-smi names it); the build is not at fault, and what serves now "
                        "keeps serving", e.tail, on_gpu=True)  # fmt: skip


def on_the_card(result: dict, log: str) -> None:
    """A CUDA build counts only when its smoke run computed on the GPU: every layer offloaded
    (its load log), or, where the build does not log that, the server on the card (nvidia-smi)."""
    offloaded = result.get("offloaded")
    done, total = (int(n) for n in offloaded.split("/")) if offloaded else (0, None)
    if (total is not None and done == total and done > 0) or (offloaded is None and result.get("gpu_mib")):
        return
    tail = _tail(log)
    why = NO_GPU.search(_tail(log, 400))  # llama.cpp says it at the start
    counted = f"offloaded {offloaded} layers to the GPU" if offloaded else \
        "named no layer offloaded, and nvidia-smi listed it on no card"  # fmt: skip
    raise SmokeFailure(f"the CUDA build computed on the CPU: llama-server {counted}"
                       + (f" ({why.group(0).strip()})" if why else ""), tail, on_gpu=True)  # fmt: skip


def say(message: str) -> None:
    print(f"llamacpp_proof: {message}", flush=True)


def _tail(path: str, lines: int = 40) -> str:
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return ""


def _exit_reason(rc: int) -> str:
    if rc < 0:
        try:
            return f"died with {signal.Signals(-rc).name}"
        except ValueError:
            return f"died with signal {-rc}"
    return f"exited with status {rc}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _http_json(url: str, body=None, timeout: float = 30):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.status, json.loads(r.read().decode() or "null")


def _numbers(value, keys=("logprob", "prob")):
    """Every probability-like number in a /completion answer."""
    if isinstance(value, dict):
        for k, v in value.items():
            if k in keys and isinstance(v, (int, float)):
                yield v
            else:
                yield from _numbers(v, keys)
    elif isinstance(value, list):
        for v in value:
            yield from _numbers(v, keys)


def smoke_model(build_dir: str, quant: str, work: str) -> dict:
    """Write the smoke GGUF and quantize it with the build's llama-quantize."""
    f16 = os.path.join(work, "smoke-f16.gguf")
    write_smoke_gguf(f16)
    if quant.upper() in ("F16",):
        return {"path": f16, "f16": f16, "quant": "F16", "note": ""}
    chosen, note = quant, ""
    if quant.upper() in NEEDS_IMATRIX:
        chosen, note = "Q4_K_M", f"{quant} needs an importance matrix; the smoke model uses Q4_K_M"
    out = os.path.join(work, f"smoke-{chosen}.gguf")
    log = os.path.join(work, "quantize.log")
    with open(log, "w") as f:
        rc = subprocess.call([f"{build_dir}/bin/llama-quantize", f16, out, chosen],
                             stdout=f, stderr=subprocess.STDOUT, timeout=300)
    if rc != 0:
        raise SmokeFailure(f"llama-quantize {_exit_reason(rc)} on the smoke model", _tail(log))
    return {"path": out, "f16": f16, "quant": chosen, "note": note}


def smoke_words(count: int) -> list:
    """``count`` words of the smoke vocabulary, the same on every host."""
    words = [t[1:] for t in smoke_vocab()[0] if t.startswith("\u2581") and len(t) > 1]
    rng = random.Random(SMOKE_SEED)
    return [rng.choice(words) for _ in range(count)]


def smoke_prompt() -> list:
    """The smoke run's prompt: ``PROOF_BATCH`` token ids, which the server computes as one batch."""
    tokens = smoke_vocab()[0]
    return [tokens.index("\u2581" + w) for w in smoke_words(PROOF_BATCH)]


def _run_tool(argv: list, log: str, timeout: float, what: str) -> None:
    with open(log, "w") as out:
        out.write("$ " + " ".join(argv) + "\n")
        out.flush()
        try:
            rc = subprocess.call(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 timeout=timeout)  # fmt: skip
        except subprocess.TimeoutExpired:
            raise SmokeFailure(f"{what} did not finish within {timeout:.0f} s", _tail(log))
    if rc != 0:
        raise SmokeFailure(f"{what} {_exit_reason(rc)}", _tail(log))


def tool_runs(build_dir: str, model: dict, flags: ServerFlags, serving: dict, proven: list, work: str,
              timeout: float) -> list:  # fmt: skip
    """Run the other tools the deploy runs with this build, as it runs them, on the smoke model:
    llama-perplexity as the quality runs do (the f16 GGUF's logits, then the quant's KL
    divergence with each KV type, ``PROOF_BATCH`` tokens a batch) and llama-bench as the bench
    does (pp``PROOF_BATCH``), each with this rung's runtime switches. Those the build lacks are
    not run. The tools run, or SmokeFailure naming the one that died."""
    ran, ngl = [], ["-ngl", "999"] if serving.get("gpu_layers") is not None else []
    perplexity = f"{build_dir}/bin/llama-perplexity"
    if os.path.exists(perplexity):
        text, logits = os.path.join(work, "quality.txt"), os.path.join(work, "quality.logits")
        with open(text, "w") as f:  # two chunks of PROOF_BATCH tokens at the least (a word is one or more)
            f.write(" ".join(smoke_words(2 * PROOF_BATCH)) + "\n")
        common = ["-f", text, "-c", str(PROOF_BATCH), "-b", str(PROOF_BATCH), "--chunks", "2",
                  "--kl-divergence-base", logits,
                  *ngl, *runtime_args("llama-perplexity", tuple(proven))]  # fmt: skip
        runs = [("base", "the f16 logits", [perplexity, "-m", model["f16"], *common])]
        runs += [(f"kv-{kv}", f"KL divergence, KV {kv}", [perplexity, "-m", model["path"], *common, "--kl-divergence",
                                                          "-ctk", kv, "-ctv", kv, *flags.flash_attn(True)])
                 for kv in QUALITY_KV_TYPES]  # fmt: skip
        for name, what, argv in runs:  # a log each: perplexity-base.log, perplexity-kv-f16.log, ...
            _run_tool(argv, os.path.join(work, f"perplexity-{name}.log"), timeout, f"llama-perplexity ({what})")
        ran.append("llama-perplexity")
    bench = f"{build_dir}/bin/llama-bench"
    if os.path.exists(bench):
        argv = [bench, "-m", model["path"], "-p", str(PROOF_BATCH), "-n", "4", "-r", "1", *bench_args(flags, serving)]
        _run_tool(argv, os.path.join(work, "bench.log"), timeout, f"llama-bench (pp{PROOF_BATCH})")
        ran.append("llama-bench")
    return ran


def _gpu_mib(pid: int) -> Optional[int]:
    """The GPU memory (MiB) ``nvidia-smi --query-compute-apps`` gives process ``pid``; None
    when it lists it on no card (or cannot be asked)."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=60).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    used = [int(f[1]) for f in (line.split(", ") for line in out.splitlines())
            if len(f) == 2 and f[0].strip() == str(pid) and f[1].strip().isdigit()]  # fmt: skip
    return sum(used) if used else None


def serve_once(build_dir: str, model: str, args: list, log: str, timeout: float, cuda: bool = False) -> dict:
    """Start llama-server on the smoke model, ask for a few tokens, stop it; the measurements.
    ``cuda``: also what nvidia-smi says the server holds on the card (``gpu_mib``). Its load
    lines (the layers offloaded) are printed from verbosity 4, set in its environment so that
    its command line stays the unit's."""
    port = _free_port()
    argv = [f"{build_dir}/bin/llama-server", "--model", model, "--host", "127.0.0.1",
            "--port", str(port), "--ctx-size", str(SMOKE_CTX), "--parallel", "1", *args]
    base = f"http://127.0.0.1:{port}"
    with open(log, "w") as out:
        out.write("$ " + " ".join(argv) + "\n")
        out.flush()
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, env={**os.environ, "LLAMA_ARG_LOG_VERBOSITY": "4"})
    try:
        deadline = time.monotonic() + timeout
        while True:
            rc = proc.poll()
            if rc is not None:
                raise SmokeFailure(f"llama-server {_exit_reason(rc)} before it answered /health", _tail(log))
            try:
                status, _ = _http_json(base + "/health", timeout=5)
                if status == 200:
                    break
            except (urllib.error.URLError, OSError, ValueError):
                pass
            if time.monotonic() > deadline:
                raise SmokeFailure(f"llama-server did not answer /health within {timeout:.0f} s", _tail(log))
            time.sleep(0.2)
        body = {"prompt": smoke_prompt(), "n_predict": SMOKE_TOKENS, "temperature": 0,
                "ignore_eos": True, "n_probs": 1, "cache_prompt": False}
        try:
            _, answer = _http_json(base + "/completion", body, timeout=timeout)
        except (urllib.error.URLError, OSError, ValueError) as e:
            rc = proc.poll()
            why = _exit_reason(rc) if rc is not None else f"gave no answer ({e})"
            raise SmokeFailure(f"llama-server {why} on /completion", _tail(log))
        predicted = (answer or {}).get("tokens_predicted", 0)
        if predicted < SMOKE_TOKENS:
            raise SmokeFailure(f"llama-server predicted {predicted} of {SMOKE_TOKENS} tokens", _tail(log))
        bad = [v for v in _numbers(answer.get("completion_probabilities")) if not math.isfinite(v)]
        if bad:
            raise SmokeFailure(f"llama-server computed non-finite probabilities ({bad[0]})", _tail(log))
        timings = answer.get("timings") or {}
        gpu_mib = _gpu_mib(proc.pid) if cuda else None
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    with open(log, errors="replace") as f:
        text = f.read()
    offloaded = re.search(r"offloaded (\d+)/(\d+) layers to GPU", text)
    return {
        "prompt_tokens_per_second": round(float(timings.get("prompt_per_second", 0.0)), 1),
        "tokens_per_second": round(float(timings.get("predicted_per_second", 0.0)), 1),
        "tokens": predicted,
        "offloaded": f"{offloaded.group(1)}/{offloaded.group(2)}" if offloaded else None,
        "gpu_mib": gpu_mib,
        "devices_used": sorted(set(re.findall(r"using device (\S+ \([^)]*\))", text))),
    }


def list_devices(build_dir: str) -> list:
    """What the build's backends report (``llama-server --list-devices``)."""
    try:
        r = subprocess.run([f"{build_dir}/bin/llama-server", "--list-devices"], capture_output=True,
                           text=True, timeout=120)
    except subprocess.TimeoutExpired:
        return []
    lines = (r.stdout + r.stderr).splitlines()
    return [ln.strip() for ln in lines if re.match(r"\s+\S+: ", ln)]


def cpu_model() -> str:
    """The CPU the proof ran on, as /proc/cpuinfo names it."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def run_shell(command: str) -> None:
    """A rebuild step (it logs to configure.log / build.log itself and prints progress lines)."""
    proc = subprocess.Popen(["sh", "-c", command], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, errors="replace")
    seen = []
    for line in proc.stdout:
        print(line, end="", flush=True)
        seen = (seen + [line])[-60:]
    rc = proc.wait()
    if rc != 0:
        raise SmokeFailure(f"the rebuild {_exit_reason(rc)}", "".join(seen))


def prove(spec: dict) -> dict:
    """Climb the ladder until a rung computes; the proof record, or SmokeFailure with every attempt."""
    d = spec["build_dir"]
    work = os.path.join(d, "smoke")
    os.makedirs(work, exist_ok=True)
    with open(os.path.join(d, "server-help.txt"), errors="replace") as f:
        help_text = f.read()
    attempts = []
    model = None
    for i, rung in enumerate(spec["rungs"]):
        if rung.get("x86_only") and platform.machine().lower() not in ("x86_64", "amd64"):
            continue
        name = rung["name"]
        try:
            if rung.get("configure"):
                say(f"rebuilding as {name} ({rung['why']}); log: {d}/build.log")
                run_shell(rung["configure"])
                run_shell(rung["build"])
                model = None  # a new llama-quantize: quantize again
            flags = parse_server_help(help_text)
            serving = {**spec["serving"], **rung.get("serving", {})}
            # What this rung adds to the unit's flags, recorded for the server role.
            runtime_args = list(flags.repack_off) if spec["serving"]["repack"] and not serving["repack"] else []
            if rung.get("serving") and not runtime_args:
                continue  # this build has no such switch: the rung is the one before
            if model is None:
                model = smoke_model(d, spec["quant"], work)
            args = serving_args(flags, serving)
            say(f"smoke run {i + 1} ({name}): llama-server {' '.join(args)}")
            cuda = serving.get("gpu_layers") is not None
            result = serve_once(d, model["path"], args, os.path.join(work, f"server-{i + 1}.log"),
                                spec.get("timeout", 300), cuda)
            if cuda:
                on_the_card(result, os.path.join(work, f"server-{i + 1}.log"))
            tools = tool_runs(d, model, flags, serving, runtime_args, work, spec.get("timeout", 300))
        except SmokeFailure as e:
            e = named_gpu_failure(e)
            say(f"smoke run {i + 1} ({name}) failed: {e.why}")
            attempts.append({"variant": name, "ok": False, "why": e.why, "tail": e.tail.splitlines()[-12:]})
            last = e
            if e.on_gpu or GPU_FAILURE.search(e.tail):
                say("the GPU failed, not the CPU: the CPU rungs cannot help")
                break
            continue
        except (OSError, subprocess.SubprocessError) as e:
            attempts.append({"variant": name, "ok": False, "why": str(e)})
            last = SmokeFailure(str(e))
            continue
        attempts.append({"variant": name, "ok": True})
        say(f"smoke run {i + 1} ({name}) computed: {result['tokens']} tokens at "
            f"{result['tokens_per_second']} t/s" + (f", {result['offloaded']} layers on the GPU"
                                                   if result["offloaded"] else ""))
        return {
            "variant": name,
            "why": rung["why"],
            "runtime_args": runtime_args,
            "cmake_args": rung.get("cmake_args"),
            "flags": args,
            "batch": PROOF_BATCH,
            "tools": tools,
            "model": {"quant": model["quant"], "note": model["note"], **SMOKE_SHAPE},
            "devices": list_devices(d) or result.pop("devices_used") or ["none but the CPU"],
            "cpu": cpu_model(),
            **result,
            "attempts": attempts,
        }
    if not attempts:
        raise SmokeFailure("no rung of the ladder applies to this machine")
    raise SmokeFailure("; ".join(f"{a['variant']}: {a['why']}" for a in attempts), last.tail)


def main(argv: list) -> int:
    with open(argv[1]) as f:
        spec = json.load(f)
    d = spec["build_dir"]
    reprove = spec.get("reprove", False)
    try:
        proof = prove(spec)
    except SmokeFailure as e:
        if reprove:
            _write_json(os.path.join(d, "proof-failed.json"), {"proof_id": spec["record"]["proof_id"], "why": e.why})
            print(f"llama.cpp build {os.path.basename(d)} fails the new proof (builds/current and the served "
                  f"unit are unchanged; the next deploy builds it again beside it): {e.why}", file=sys.stderr)
        else:
            print(f"llama.cpp build {os.path.basename(d)} cannot compute, refusing it "
                  f"(builds/current and the served unit are unchanged): {e.why}", file=sys.stderr)
        if e.tail:
            print("last output of llama.cpp:\n" + e.tail.rstrip(), file=sys.stderr)
        return 1
    if reprove:
        with open(os.path.join(d, "build-info.json")) as f:
            before = json.load(f).get("proof") or {}
        # The binaries are the ones the build's own proof made (maybe a portable rebuild).
        proof["cmake_args"] = proof.get("cmake_args") or before.get("cmake_args")
        if os.path.exists(os.path.join(d, "proof-failed.json")):
            os.remove(os.path.join(d, "proof-failed.json"))
    _write_json(os.path.join(d, "build-info.json"), dict(spec["record"], proof=proof))
    return 0


def _write_json(path: str, value: dict) -> None:
    """Write ``path`` atomically (a reader sees the old file or the new one, never half)."""
    with open(path + ".new", "w") as f:
        json.dump(value, f, indent=1, sort_keys=True)
        f.write("\n")
    os.replace(path + ".new", path)


if __name__ == "__main__":
    sys.exit(main(sys.argv))

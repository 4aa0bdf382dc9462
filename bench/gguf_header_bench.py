#!/usr/bin/env python3
"""What reading a real model's GGUF header costs a host: the ``GgufShape`` fact that every
audit and every deploy reads, with the host module's code now and at an earlier commit.

    python3 bench/gguf_header_bench.py [--reps 7] [--before REV]

The lab serves a tiny model (1,000 tokens), whose header reads in a millisecond; a real
one's tokenizer arrays hold 10^5 strings and more. So the headers here are written with
real models' shapes (metadata and tensor list, no tensor data), their tokenizer arrays at
the real counts, the strings random BPE-like words of 2 to 12 letters (a merge: two of
them and a space):

- llama3-8b: Llama-3 8B, 128,256 tokens and 280,147 merges, 291 tensors;
- qwen2.5-7b: Qwen2.5 7B, 152,064 tokens and 151,387 merges, 339 tensors;
- gemma3-27b: Gemma-3 27B, 262,144 tokens with their scores, no merges, 808 tensors.

For each, with this checkout's ``llamarack/remote/gguf_header.py`` and with the one at
--before (default: the commit before the vocabulary was read past in chunks):

- read_shape_cpu_s: CPU of ``read_shape`` in this process, median of --reps;
- host_command_cpu_s: CPU of the whole command the fact runs (``python3 -I -S -c SOURCE
  MODEL.gguf``, the interpreter's start included), median of --reps;

and checks that both give the same shape. Writes bench/results/gguf-header.json.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import platform
import random
import resource
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from llamarack.remote.llamacpp_proof import _gguf_kv, _gguf_string  # noqa: E402

from converged_bench import _cpu  # noqa: E402  (this folder's)

BEFORE = "1656a69"  # the last commit that read every string of the header one at a time

# name: (architecture, layers, embedding, ffn, heads, kv heads, tokens, merges, scores,
#        tensors per layer, tied embeddings)
MODELS = {
    "llama3-8b": ("llama", 32, 4096, 14336, 32, 8, 128256, 280147, False, 9, False),
    "qwen2.5-7b": ("qwen2", 28, 3584, 18944, 28, 4, 152064, 151387, False, 12, False),
    "gemma3-27b": ("gemma3", 62, 5376, 21504, 32, 16, 262144, 0, True, 13, True),
}


def _words(rng: random.Random, count: int) -> list:
    letters = "abcdefghijklmnopqrstuvwxyz\u0120"
    return ["".join(rng.choice(letters) for _ in range(rng.randint(2, 12))) for _ in range(count)]


def _array(key: str, kind: int, count: int, body: bytes) -> bytes:
    return _gguf_string(key) + struct.pack("<IIQ", 9, kind, count) + body


def header(name: str) -> bytes:
    """A GGUF v3 header of model ``name``'s shape (``MODELS``), no tensor data."""
    arch, layers, embd, ffn, heads, kv_heads, n_tokens, n_merges, scores, per_layer, tied = MODELS[name]
    rng = random.Random(name)
    tokens = _words(rng, n_tokens)
    meta = [("general.architecture", "str", arch), (f"{arch}.block_count", "u32", layers),
            (f"{arch}.context_length", "u32", 131072), (f"{arch}.embedding_length", "u32", embd),
            (f"{arch}.feed_forward_length", "u32", ffn), (f"{arch}.attention.head_count", "u32", heads),
            (f"{arch}.attention.head_count_kv", "u32", kv_heads), ("general.file_type", "u32", 15)]  # fmt: skip
    kv = b"".join(_gguf_kv(*m) for m in meta)
    kv += _array("tokenizer.ggml.tokens", 8, n_tokens, b"".join(_gguf_string(t) for t in tokens))
    if scores:
        kv += _array("tokenizer.ggml.scores", 6, n_tokens, b"\0" * 4 * n_tokens)
    kv += _array("tokenizer.ggml.token_type", 5, n_tokens, b"\0" * 4 * n_tokens)
    if n_merges:
        merges = [f"{rng.choice(tokens)} {rng.choice(tokens)}" for _ in range(n_merges)]
        kv += _array("tokenizer.ggml.merges", 8, n_merges, b"".join(_gguf_string(m) for m in merges))
    tensors = [("token_embd.weight", (embd, n_tokens), 12), ("output_norm.weight", (embd,), 0)]
    tensors += [] if tied else [("output.weight", (embd, n_tokens), 14)]
    for i in range(layers):
        tensors += [(f"blk.{i}.t{j}.weight", (embd, embd), 12) for j in range(per_layer)]
    infos = b"".join(_gguf_string(t) + struct.pack("<I", len(d)) + struct.pack(f"<{len(d)}Q", *d)
                     + struct.pack("<IQ", k, 0) for t, d, k in tensors)  # fmt: skip
    return b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(meta) + 2 + scores + bool(n_merges)) + kv + infos


def _module(source: str, name: str):
    spec = importlib.util.spec_from_loader(name, loader=None)
    module = importlib.util.module_from_spec(spec)
    exec(compile(source, name, "exec"), module.__dict__)
    return module


def _median_cpu(fn, reps: int) -> float:
    runs = []
    for _ in range(reps):
        started = time.process_time()
        fn()
        runs.append(time.process_time() - started)
    return round(statistics.median(runs), 4)


def _command_cpu(source: str, path: Path, reps: int) -> float:
    runs = []
    for _ in range(reps):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        subprocess.run([sys.executable, "-I", "-S", "-c", source, str(path)], stdout=subprocess.DEVNULL, check=True)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        runs.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return round(statistics.median(runs), 4)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--before", default=BEFORE, help=f"the commit to compare with (default {BEFORE})")
    args = ap.parse_args()
    sources = {"now": (ROOT / "llamarack/remote/gguf_header.py").read_text(),
               "before": subprocess.run(["git", "show", f"{args.before}:llamarack/remote/gguf_header.py"], cwd=ROOT,
                                        capture_output=True, text=True, check=True).stdout}  # fmt: skip
    modules = {k: _module(v, f"gguf_header_{k}") for k, v in sources.items()}
    models = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in MODELS:
            path = Path(tmp) / f"{name}.gguf"
            path.write_bytes(header(name))
            shapes = {k: m.read_shape(str(path)) for k, m in modules.items()}
            if shapes["now"] != shapes["before"]:
                raise SystemExit(f"{name}: the two readers disagree")
            row = {"header_bytes": path.stat().st_size, "n_layer": shapes["now"]["n_layer"],
                   "n_vocab": shapes["now"]["n_vocab"]}  # fmt: skip
            for k, m in modules.items():
                row[f"read_shape_cpu_s_{k}"] = _median_cpu(lambda: m.read_shape(str(path)), args.reps)
                row[f"host_command_cpu_s_{k}"] = _command_cpu(sources[k], path, args.reps)
            row["host_command_before_over_now"] = round(row["host_command_cpu_s_before"]
                                                        / row["host_command_cpu_s_now"], 1)  # fmt: skip
            models[name] = row
            print(name, json.dumps(row), flush=True)
    result = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": {"cpu": _cpu(), "cores": len(os.sched_getaffinity(0)),
                    "python": platform.python_version()},
        "reps": args.reps, "before": args.before,
        "strings": "random BPE-like words of 2 to 12 letters; a merge: two of them and a space",
        "models": models,
    }  # fmt: skip
    out = ROOT / "bench/results/gguf-header.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out}")
    return 0



if __name__ == "__main__":
    sys.exit(main())

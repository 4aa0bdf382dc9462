#!/usr/bin/env python3
"""What reading a real model's GGUF header costs a host: the ``GgufShape`` fact that every
audit and every deploy reads, with this checkout's host module and with a reader that
reads every string of the header one at a time.

    python3 bench/gguf_header_bench.py [--reps 7] [--per-string REV]

The lab serves a tiny model (1,000 tokens), whose header reads in a millisecond; a real
one's tokenizer arrays hold 10^5 strings and more. So the headers here are written with
real models' shapes (metadata and tensor list, no tensor data), their tokenizer arrays at
the real counts, the strings random BPE-like words of 2 to 12 letters (a merge: two of
them and a space):

- llama3-8b: Llama-3 8B, 128,256 tokens and 280,147 merges, 291 tensors;
- qwen2.5-7b: Qwen2.5 7B, 152,064 tokens and 151,387 merges, 339 tensors;
- gemma3-27b: Gemma-3 27B, 262,144 tokens with their scores, no merges, 808 tensors.

For each, with this checkout's ``roles/model/files/gguf_header.py`` (``checkout``) and with
the one at --per-string (``per_string``; default: the commit whose reader reads every string
one at a time, the vocabulary not yet read past in chunks):

- read_shape_cpu_s: CPU of ``read_shape`` in this process, median of --reps;
- host_command_cpu_s: CPU of the whole command the fact runs (``python3 -I -S -c SOURCE
  MODEL.gguf``, the interpreter's start included), median of --reps;

and checks that both give the same shape. Then ``host_command_cpu_s_recorded``: the same
command with this checkout's reader once the model role's seal has recorded the shape beside
the file (``--record``; the fact then answers from the record), and whether its output is
the header's, byte for byte. With ``--lab-host NAME`` (a converged lab rack
up, under the lab lock), also ``written_by_gguf_py``: on that host, the pinned llama.cpp's
own writer (gguf-py, in the converter env) writes a header with Llama-3's tokenizer counts
(128,256 tokens and types, 280,147 merges), and the host's python3 reads it with both
readers and from the record: their CPU (bash ``time``) and whether their outputs are the same bytes.
Writes bench/results/gguf-header.json, stamped by ``bench/provenance.py``.
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
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

import provenance  # noqa: E402  (this folder's)

from roles.model.reads import shape_record_name
from roles.llamacpp.files.llamacpp_proof import _gguf_kv, _gguf_string

from converged_bench import _cpu  # noqa: E402  (this folder's)

PER_STRING = "1656a69"  # the last commit that read every string of the header one at a time

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


# Run by the converter env's python on a lab host: gguf-py's GGUFWriter, as convert_hf_to_gguf.py uses it.
GGUF_PY_WRITER = """
import random, sys, numpy as np, gguf
rng = random.Random(1)
letters = "abcdefghijklmnopqrstuvwxyz\u0120"
tokens = ["".join(rng.choice(letters) for _ in range(rng.randint(2, 12))) for _ in range(128256)]
w = gguf.GGUFWriter(sys.argv[1], "llama")
w.add_block_count(2); w.add_context_length(8192); w.add_embedding_length(64); w.add_feed_forward_length(128)
w.add_head_count(4); w.add_head_count_kv(2); w.add_file_type(1); w.add_tokenizer_model("gpt2")
w.add_token_list(tokens); w.add_token_types([1] * len(tokens))
w.add_token_merges([rng.choice(tokens) + " " + rng.choice(tokens) for _ in range(280147)])
w.add_tensor("token_embd.weight", np.zeros((128256, 64), dtype=np.float16))
for i in range(2):
    w.add_tensor(f"blk.{i}.attn_q.weight", np.zeros((64, 64), dtype=np.float16))
w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
"""


def on_lab_host(host: str, sources: dict) -> dict:
    """``written_by_gguf_py`` (see the module's docstring), on lab host ``host``."""
    from llamarack_lab import rack as rackmod
    from llamarack.remote import argv

    rack = rackmod.load()
    if rack is None:
        raise SystemExit("--lab-host: no lab rack is up")
    folder = "/tmp/llamarack-gguf-header-bench"
    gguf, record = f"{folder}/model.gguf", shape_record_name()
    runs = {k: (v, gguf) for k, v in sources.items()}
    runs["recorded"] = (sources["checkout"], gguf, "--recorded", record)
    outputs = {k: f"{gguf}.{k}" for k in runs}
    script = (f"set -e; {argv('mkdir', '-p', folder)}; "
              f"{argv('/opt/llamarack/envs/convert/bin/python', '-c', GGUF_PY_WRITER, gguf)}; "
              f"{argv('stat', '-c', 'bytes %s', gguf)}; "
              f"{argv('python3', '-I', '-S', '-c', sources['checkout'], '--record', record, gguf)} >/dev/null; "
              "TIMEFORMAT='%3U %3S'; "
              + "".join(f"echo cpu_{k} >&2; time {argv('python3', '-I', '-S', '-c', *v)} > {argv(outputs[k])}; "
                        for k, v in runs.items())
              + f"{argv('cmp', '-s', outputs['checkout'], outputs['per_string'])} && "
              f"{argv('cmp', '-s', outputs['checkout'], outputs['recorded'])} && echo same || echo differ; "
              f"{argv('rm', '-rf', folder)}")  # fmt: skip
    r = subprocess.run(rack.ssh_command(host, script), capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        raise SystemExit(f"--lab-host {host}: exit {r.returncode}\n{r.stderr[-2000:]}")
    err = r.stderr.splitlines()
    cpu = {mark[4:]: round(sum(map(float, times.split())), 3) for mark, times in zip(err, err[1:])
           if mark.startswith("cpu_")}  # fmt: skip
    out = r.stdout.split()
    return {"host": host, "tokens": 128256, "merges": 280147, "file_bytes": int(out[out.index("bytes") + 1]),
            **{f"host_command_cpu_s_{k}": v for k, v in cpu.items()}, "same_output": out[-1] == "same"}


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


def _command_cpu(source: str, path: Path, reps: int, *extra: str) -> float:
    runs = []
    for _ in range(reps):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        subprocess.run([sys.executable, "-I", "-S", "-c", source, str(path), *extra], stdout=subprocess.DEVNULL,
                       check=True)  # fmt: skip
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        runs.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return round(statistics.median(runs), 4)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--per-string", default=PER_STRING,
                    help=f"the commit of the per-string reader to compare with (default {PER_STRING})")
    ap.add_argument("--lab-host", help="also read a header gguf-py wrote, on this lab host")
    args = ap.parse_args()
    sources = {"checkout": (ROOT / "roles/model/files/gguf_header.py").read_text(),
               "per_string": subprocess.run(["git", "show", f"{args.per_string}:llamarack/remote/gguf_header.py"],
                                            cwd=ROOT, capture_output=True, text=True, check=True).stdout}  # fmt: skip
    modules = {k: _module(v, f"gguf_header_{k}") for k, v in sources.items()}
    models = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in MODELS:
            (Path(tmp) / name).mkdir()
            path = Path(tmp) / name / "model.gguf"
            path.write_bytes(header(name))
            shapes = {k: m.read_shape(str(path)) for k, m in modules.items()}
            if shapes["checkout"] != shapes["per_string"]:
                raise SystemExit(f"{name}: the two readers disagree")
            row = {"header_bytes": path.stat().st_size, "n_layer": shapes["checkout"]["n_layer"],
                   "n_vocab": shapes["checkout"]["n_vocab"]}  # fmt: skip
            for k, m in modules.items():
                row[f"read_shape_cpu_s_{k}"] = _median_cpu(lambda: m.read_shape(str(path)), args.reps)
                row[f"host_command_cpu_s_{k}"] = _command_cpu(sources[k], path, args.reps)
            row["host_command_per_string_over_checkout"] = round(row["host_command_cpu_s_per_string"]
                                                                 / row["host_command_cpu_s_checkout"], 1)  # fmt: skip
            command = [sys.executable, "-I", "-S", "-c", sources["checkout"]]
            record = shape_record_name()
            subprocess.run([*command, "--record", record, str(path)], stdout=subprocess.DEVNULL, check=True)
            row["host_command_cpu_s_recorded"] = _command_cpu(sources["checkout"], path, args.reps, "--recorded",
                                                              record)  # fmt: skip
            row["host_command_checkout_over_recorded"] = round(row["host_command_cpu_s_checkout"]
                                                               / row["host_command_cpu_s_recorded"], 1)  # fmt: skip
            answers = [subprocess.run([*command, str(path), *extra], capture_output=True, check=True).stdout
                       for extra in ((), ("--recorded", record))]  # fmt: skip
            row["recorded_same_output"] = answers[0] == answers[1]
            models[name] = row
            print(name, json.dumps(row), flush=True)
    if args.lab_host:
        models["written_by_gguf_py"] = on_lab_host(args.lab_host, sources)
        print("written_by_gguf_py", json.dumps(models["written_by_gguf_py"]), flush=True)
    result = {
        "provenance": provenance.stamp(__file__),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": {"cpu": _cpu(), "cores": len(os.sched_getaffinity(0)),
                    "python": platform.python_version()},
        "reps": args.reps, "per_string_reader": args.per_string,
        "strings": "random BPE-like words of 2 to 12 letters; a merge: two of them and a space",
        "models": models,
    }  # fmt: skip
    out = ROOT / "bench/results/gguf-header.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out}")
    return 0



if __name__ == "__main__":
    sys.exit(main())

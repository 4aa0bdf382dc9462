"""Sampling on the card (``--backend-sampling``) against sampling on the CPU, with the unit's
own command line: the server role's plan of DIR/model.gguf on this card (``planner.plan``,
``server_args``, ``render_unit``: its ExecStart and its Environment= lines, verbosity 4
among them), once with ``server_backend_sampling`` 'auto' (a CUDA build with the flag: on)
and once 'off'.

- greedy: 64 tokens (temperature 0) after each of PROMPTS: the same tokens with and without?
- seeded: seed 42, temperature 0.8, top_k 40, top_p 0.95, 64 tokens after each prompt, twice
  on each server: reproducible on each? the same with and without the flag?
- fallback: a request for each of CASES (the samplers llama.cpp runs on the CPU with the flag,
  and some it runs on the card): answered? where each sampler ran, from the server's own
  "sampler chain" trace line ("+name": on the backend; "?name": a sampler its settings leave
  empty), against what llama.cpp's source says (``expected``), and the lines it logged of a
  fallback ("backend sampling is not compatible with grammar, disabling", ...);
- decode: ``timings.predicted_per_second`` of a 128-token completion (greedy, and the server's
  default sampling), REPS times after a warm-up, the median, over llama-bench's tg128 with the
  unit's flags (the server role's own ``bench_args``, -r 5).

Writes OUT/gpu-sampling.json and the servers' logs in OUT/logs/.

    python3 bench/gpu/sampling.py --build DIR --model-dir DIR --out DIR [--commit SHA]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench/gpu"))
sys.path.insert(0, str(REPO / "bench"))

import provenance  # noqa: E402  (bench/provenance.py: standard library)

from roles.llamacpp.reads import parse_build_help  # noqa: E402
from roles.model.shapes import local_gguf_shape  # noqa: E402
from roles.server.plan import bench_args, knobs, render_unit, server_args  # noqa: E402
from roles.server.planner import Card, plan  # noqa: E402
from roles.settings import load_settings  # noqa: E402
from proof import exec_start, parse_bench_json, stop, tokens_sha256  # noqa: E402
from split_ledger import get  # noqa: E402

# What else ran to make the result: its provenance names their sha256 too.
RAN_WITH = ("bench/gpu/sampling.sh", "bench/gpu/build_cuda.sh", "bench/gpu/random_model.py")

PROMPTS = ("The history of the rack server begins with", "Once upon a time, in a data centre far away,",
           "def fibonacci(n):", "Q: What is the capital of France?\nA:")  # fmt: skip
N_GREEDY, N_DECODE, REPS = 64, 128, 5
SEEDED = {"seed": 42, "temperature": 0.8, "top_k": 40, "top_p": 0.95}
# name: (the request's sampling, where llama.cpp runs its chain with the flag: "backend" (all of
# it), "cpu" (all of it), "cpu_from:NAME" (the samplers before NAME on the backend, the rest on
# the CPU)); docs/planning.md, "Backend sampling", names the source lines.
CASES = {
    "default": ({}, "backend"),
    "repeat_penalty": ({"repeat_penalty": 1.1}, "backend"),
    "presence_penalty": ({"presence_penalty": 0.5}, "backend"),
    "dynatemp": ({"dynatemp_range": 0.5}, "backend"),
    "n_probs_post_sampling": ({"n_probs": 5, "post_sampling_probs": True}, "backend"),
    "dry": ({"dry_multiplier": 0.8}, "cpu_from:dry"),
    "top_n_sigma": ({"top_n_sigma": 1.0}, "cpu_from:top-n-sigma"),
    "typical_p": ({"typical_p": 0.9}, "cpu_from:typical"),
    "xtc": ({"xtc_probability": 0.5, "xtc_threshold": 0.1}, "cpu_from:xtc"),
    "mirostat": ({"mirostat": 2}, "cpu_from:mirostat-v2"),
    "n_probs": ({"n_probs": 5}, "cpu"),
    "grammar": ({"grammar": 'root ::= [a-z ]+'}, "cpu"),
    "json_schema": ({"json_schema": {"type": "object", "properties": {"a": {"type": "string"}}}}, "cpu"),
}  # fmt: skip
# Every case biases one token: its chain then starts with logit-bias, which runs on the backend
# ("+logit-bias") where llama.cpp offloads the chain at all, so a chain that falls back from its
# second sampler on ("cpu_from:dry") reads apart from one left whole on the CPU ("cpu").
BIAS = {"logit_bias": [[65, -5.0]]}
# What llama.cpp logs when it leaves the card for the CPU, or cannot use it.
FALLBACK = re.compile(r"sampler chain:|backend sampl|cannot be offloaded|does not have support for op|"
                      r"Failed to initialize samplers")  # fmt: skip


# --------------------------------------------------------------------------
# what the server says (pure: proven here on llama.cpp's own lines)
# --------------------------------------------------------------------------

def chain_split(line: str) -> dict:
    """A "sampler chain: logits -> ?penalties -> +top-k -> dry -> dist" trace line: the
    samplers on the backend ("+"; "-": the device lacks one of its ops, so the CPU runs it),
    those on the CPU, and those their settings leave empty ("?": they do nothing)."""
    names = [n.strip() for n in line.split("sampler chain:", 1)[1].split("->")[1:] if n.strip()]
    return {"backend": [n[1:] for n in names if n.startswith("+")],
            "cpu": [n.lstrip("-") for n in names if not n.startswith(("+", "?"))],
            "empty": [n[1:] for n in names if n.startswith("?")]}  # fmt: skip


def placement(split: dict) -> str:
    """Where a chain ran: "backend", "cpu", or "cpu_from:NAME" (NAME, the first on the CPU)."""
    if not split["cpu"]:
        return "backend"
    return f"cpu_from:{split['cpu'][0]}" if split["backend"] else "cpu"


def fallback_lines(text: str) -> list:
    """The lines of a server's log that say where it sampled, without their timestamps' noise."""
    return [line.strip() for line in text.splitlines() if FALLBACK.search(line)]


def first_difference(a: list, b: list):
    """The index of the first token where two decodes part, None where they are the same."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None if len(a) == len(b) else min(len(a), len(b)))


def verdicts(found: dict) -> dict:
    """The answers: greedy the same, seeded reproducible and the same, fallbacks answered and where
    the source says, served decode over llama-bench's tg128 with and without the flag."""
    on, off = found["servers"]["on"], found["servers"]["off"]
    tg = found["llama_bench"].get("tg128_tps")
    out = {
        "greedy_identical": all(first_difference(a, b) is None for a, b in zip(on["greedy"], off["greedy"])),
        "seeded_reproducible_with_flag": on["seeded"] == on["seeded_again"],
        "seeded_reproducible_without_flag": off["seeded"] == off["seeded_again"],
        "seeded_identical_with_and_without": on["seeded"] == off["seeded"],
        "seeded_first_difference": [first_difference(a, b) for a, b in zip(on["seeded"], off["seeded"])],
        "fallback_requests_answered": all(c["status"] == 200 for s in (on, off) for c in s["cases"].values()),
        "placement_as_the_source_says": {n: c["placement"] == CASES[n][1] for n, c in on["cases"].items()},
        "without_flag_all_on_cpu": all(c["placement"] == "cpu" for c in off["cases"].values()),
    }  # fmt: skip
    for mode, s in (("on", on), ("off", off)):
        for kind in ("greedy", "default_sampling"):
            tps = s["decode"][kind]["median_tps"]
            out[f"served_over_tg128_{kind}_{mode}"] = round(tps / tg, 3) if tg else None
    return out


# --------------------------------------------------------------------------
# the run
# --------------------------------------------------------------------------

def settings_for(mode: str, port: int):
    """A CUDA host's settings, the server role's defaults but ``server_backend_sampling``."""
    return load_settings("gpu-sampling", {
        "llamarack_root": "/opt/sampling/root", "llamarack_allow_shared_dirs": True, "python_env_backend": "venv",
        "llamacpp_git_url": "file:///opt/sampling/src", "llamacpp_commit": "0" * 40, "llamacpp_backend": "cuda",
        "toolchain_cuda_version": "13.0", "server_port": port, "server_backend_sampling": mode})  # fmt: skip


def unit_command(settings, flags, build: Path, model_dir: Path, card: Card) -> tuple:
    """The unit's ExecStart and environment (its Environment= lines but the cache path, a
    systemd specifier), as the server role writes them."""
    ctx = plan(local_gguf_shape(str(model_dir / "model.gguf")), knobs(settings), [card])
    args = server_args(settings, flags, str(build), str(model_dir), ctx,
                       cuda=settings.llamacpp.backend == "cuda")  # fmt: skip
    unit = render_unit(settings, args, f"llamarack llama-server: {model_dir.name} ({ctx.note})")
    env = dict(line.removeprefix("Environment=").split("=", 1) for line in unit.splitlines()
               if line.startswith("Environment=") and "%" not in line)  # fmt: skip
    start = exec_start(unit)
    assert start == args, (start, args)
    return start, env, ctx


def card() -> Card:
    """The machine's card as the planner takes it: nvidia-smi's memory and compute capability."""
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.total,compute_cap,uuid", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True).stdout.splitlines()[0]  # fmt: skip
    mib, cap, uuid = (x.strip() for x in out.split(","))
    return Card("the card", int(mib), cap, uuid)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def complete(url: str, body: dict, timeout: float = 300) -> dict:
    """One /completion: its status and answer (tokens, timings), never kept in the prompt cache."""
    status, text = get(url + "/completion", {"cache_prompt": False, "return_tokens": True, **body}, timeout=timeout)
    try:
        answer = json.loads(text)
    except ValueError:
        answer = {"error": text[-500:]}
    return {"status": status, **answer}


def tokens(url: str, prompt: str, n: int, sampling: dict) -> list:
    r = complete(url, {"prompt": prompt, "n_predict": n, "ignore_eos": True, **sampling})
    assert r["status"] == 200, r
    return r["tokens"]


def decode(url: str, sampling: dict) -> dict:
    """Served decode: N_DECODE tokens after a short prompt, REPS times after a warm-up."""
    tokens(url, PROMPTS[0], 16, sampling)
    rows = []
    for _ in range(REPS):
        r = complete(url, {"prompt": PROMPTS[0], "n_predict": N_DECODE, "ignore_eos": True, **sampling})
        rows.append({"predicted_n": r["timings"]["predicted_n"], "tps": r["timings"]["predicted_per_second"],
                     "tokens_sha256": tokens_sha256(r["tokens"])})  # fmt: skip
    return {"reps": rows, "median_tps": round(statistics.median(r["tps"] for r in rows), 2)}


def case(url: str, log: Path, sampling: dict) -> dict:
    """One request of CASES: its status, and the lines the server logged for it."""
    before = log.stat().st_size
    r = complete(url, {"prompt": PROMPTS[1], "n_predict": 32, "seed": 42, **BIAS, **sampling})
    time.sleep(0.3)  # llama.cpp's log is written by a thread of its own
    with open(log, errors="replace") as f:
        f.seek(before)
        lines = fallback_lines(f.read())
    chain = next((x for x in reversed(lines) if "sampler chain:" in x), None)
    split = chain_split(chain) if chain else {"backend": [], "cpu": [], "empty": []}
    return {"status": r["status"], "n": len(r.get("tokens") or []), "error": r.get("error"), "lines": lines,
            "split": split, "placement": placement(split) if chain else None}  # fmt: skip


@contextlib.contextmanager
def running(argv: list, env: dict, log: Path):
    """llama-server answering /health (5 minutes at most) for the block: its URL and load seconds."""
    proc = subprocess.Popen(argv, stdout=open(log, "w"), stderr=subprocess.STDOUT, env={**os.environ, **env})
    url, began = f"http://127.0.0.1:{argv[argv.index('--port') + 1]}", time.time()
    try:
        while get(url + "/health", timeout=2)[0] != 200:
            if proc.poll() is not None or time.time() - began > 300:
                raise RuntimeError(f"llama-server did not answer /health: {log.read_text(errors='replace')[-2000:]}")
            time.sleep(0.3)
        yield url, round(time.time() - began, 1)
    finally:
        stop(proc)


def serve(a, name: str, mode: str, flags, the_card: Card) -> dict:
    """One server (``server_backend_sampling`` ``mode``): every measurement of it."""
    argv, env, ctx = unit_command(settings_for(mode, free_port()), flags, a.build, a.model_dir, the_card)
    log = a.out / "logs" / f"server-{name}.log"
    found = {"server_backend_sampling": mode, "args": argv[1:], "env": env, "plan": ctx.note,
             "backend_sampling_flag": "--backend-sampling" in argv}  # fmt: skip
    with running(argv, env, log) as (url, found["load_s"]):
        found["greedy"] = [tokens(url, p, N_GREEDY, {"temperature": 0}) for p in PROMPTS]
        found["seeded"] = [tokens(url, p, N_GREEDY, SEEDED) for p in PROMPTS]
        found["seeded_again"] = [tokens(url, p, N_GREEDY, SEEDED) for p in PROMPTS]
        found["cases"] = {name: case(url, log, body) for name, (body, _) in CASES.items()}
        found["decode"] = {"greedy": decode(url, {"temperature": 0}), "default_sampling": decode(url, {})}
    found["log_lines"] = list(dict.fromkeys(fallback_lines(log.read_text(errors="replace"))))  # each line once
    return found


def llama_bench(a, flags, the_card: Card) -> dict:
    """llama-bench pp512 and tg128 with the unit's flags, as the server role runs it after a deploy."""
    settings = settings_for("auto", free_port())
    ctx = plan(local_gguf_shape(str(a.model_dir / "model.gguf")), knobs(settings), [the_card])
    cmd = bench_args(settings, flags, str(a.build), str(a.model_dir), ctx, cuda=True) + ["-r", "5", "-o", "json"]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    (a.out / "logs" / "llama-bench.log").write_text(run.stdout + run.stderr)
    rows = parse_bench_json(run.stdout) if run.returncode == 0 else []
    tg = next((r["avg_ts"] for r in rows if r.get("n_gen") == 128 and r.get("n_prompt") == 0), None)
    pp = next((r["avg_ts"] for r in rows if r.get("n_prompt") == 512), None)
    return {"command": cmd[1:], "rc": run.returncode, "rows": rows, "tg128_tps": tg, "pp512_tps": pp}


def machine(a) -> dict:
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,compute_cap",
                          "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()  # fmt: skip
    version = subprocess.run([str(a.build / "bin/llama-server"), "--version"], capture_output=True, text=True)
    return {"gpu": smi, "cpus": os.cpu_count(), "date": time.strftime("%Y-%m-%d"), "llama_cpp_commit": a.commit,
            "llama_server_version": (version.stdout + version.stderr).strip().splitlines()[-2:]}  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", type=Path, required=True)
    ap.add_argument("--model-dir", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--commit", default=None, help="the llama.cpp commit built (recorded)")
    a = ap.parse_args()
    (a.out / "logs").mkdir(parents=True, exist_ok=True)
    flags = parse_build_help((a.build / "server-help.txt").read_text())
    the_card = card()
    found = {"what": __doc__.split("\n\n")[0], "machine": machine(a), "model_bytes":
             (a.model_dir / "model.gguf").stat().st_size, "prompts": list(PROMPTS), "seeded": SEEDED,
             "expected": {n: where for n, (_, where) in CASES.items()}}  # fmt: skip
    try:
        found["llama_bench"] = llama_bench(a, flags, the_card)
        write(a.out, found)
        # the default unit (auto: on, on this CUDA build with the flag) and the unit sampling on the CPU
        for name, mode in (("on", "auto"), ("off", "off")):
            found.setdefault("servers", {})[name] = serve(a, name, mode, flags, the_card)
            write(a.out, found)
        found["verdicts"] = verdicts(found)
    except Exception as e:  # what was measured before it is kept
        found["error"] = f"{type(e).__name__}: {e}"[-2000:]
    found["provenance"] = provenance.stamp(__file__, extra=RAN_WITH)
    write(a.out, found)
    print(json.dumps(found.get("verdicts") or found.get("error"), indent=1))
    return 1 if "error" in found else 0


def write(out: Path, found: dict) -> None:
    """OUT/gpu-sampling.json: what is measured so far, each decode's tokens as a digest (as
    gpu-proof.json keeps them)."""
    kept = json.loads(json.dumps(found))
    for s in kept.get("servers", {}).values():
        for kind in ("greedy", "seeded", "seeded_again"):
            s[kind] = [tokens_sha256(t) for t in s.get(kind, [])]
    (out / "gpu-sampling.json").write_text(json.dumps(kept, indent=1) + "\n")


if __name__ == "__main__":
    sys.exit(main())

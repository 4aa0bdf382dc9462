"""Each llama-server's resident memory against its share of the host-RAM ledger.

    python3 bench/gpu/host_ram.py --build BUILD --model-dir DIR --out OUT [--cpu] [--ctx N]
                                  [--prompt-tokens N] [--prompts N] [--cases NAME,...] [--proven-args ARGS]

For the model in DIR/model.gguf (``host_ram.sh model``: a random-weights Llama-3-8B Q4_K_M) and
each case (``CASES``: the layers on the card, the ``--cache-ram``):

- the ledger: ``llamarack plan DIR/model.gguf --gpu MIB --ctx N --kv f16 --gpu-layers L
  --cache-ram R --host-ram-mib MEMTOTAL --json``, the command's own output (``host_ram.units[0]``:
  weights, KV, compute, process, prompt cache and total, MiB);
- llama-server started with the unit's own command line (``server_args`` of the same plan,
  spelled as the build's --help says: ``--cache-ram R`` among them), its load log at
  verbosity 4: llama.cpp's host buffers (CUDA_Host or CPU) beside the ledger's items;
- its resident memory (/proc/PID/status: VmRSS, RssAnon, RssFile) after loading and after
  each of PROMPTS prompts of PROMPT-TOKENS distinct tokens (each new prompt puts the state of
  the one before in the prompt cache, up to R MiB), and its peak (VmHWM) at the end;
- ``rss_minus_ledger_mib``: VmRSS at the end less the ledger's total (under 0: within the
  plan); ``beyond_buffers_mib``: VmRSS less the ledger's weights, KV and compute, where the
  prompt cache is off (``cache0``): the process's own, ``roles/server/host_ram.PROCESS_MIB``'s
  figure for this build.

``--cpu`` plans and serves a CPU build (every layer in host RAM: the lab's way), the same
code on a machine without a card (a CPU build of the pinned source and the lab's tiny model,
``--ctx 2048 --prompt-tokens 1900``).

Writes OUT/gpu-host-ram.json (``--cpu``: OUT/cpu-host-ram.json), stamped by
``bench/provenance.py``, and OUT/logs/.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "bench")]
sys.path.insert(0, str(REPO / "bench/gpu"))

import provenance  # noqa: E402  (bench/provenance.py)
from roles.llamacpp.reads import parse_build_help  # noqa: E402
from roles.model.shapes import local_gguf_shape  # noqa: E402
from roles.server.plan import knobs, server_args  # noqa: E402
from roles.server.planner import Card, plan  # noqa: E402
from roles.settings import load_settings  # noqa: E402
from proof import LOAD_LOG_ENV, parse_load_log, stop  # noqa: E402
from split_ledger import get  # noqa: E402

PORT = 8091
# What ran beside this script on the GPU machine (--cpu runs it alone, here).
RAN_WITH = ("bench/gpu/host_ram.sh", "bench/gpu/build_cuda.sh", "bench/gpu/random_model.py")
# name: (layers on the card, None: all of them; --cache-ram MiB)
CASES = {"cache0": (None, 0), "cache2048": (None, 2048), "unlimited": (None, -1), "layers20-cache2048": (20, 2048)}
CPU_CASES = {"cache0": (None, 0), "cache8": (None, 8), "unlimited": (None, -1)}


def settings_for(args, layers, cache_ram: int):
    return load_settings("host-ram", {
        "llamarack_root": "/opt/hostram/root", "llamarack_allow_shared_dirs": True, "python_env_backend": "venv",
        "llamacpp_git_url": "file:///opt/hostram/src", "llamacpp_commit": "0" * 40,
        "llamacpp_backend": "cpu" if args.cpu else "cuda", "toolchain_cuda_version": "13.0",
        "server_port": PORT, "server_listen": "127.0.0.1", "server_ctx_size": args.ctx,
        "server_cache_type_k": "f16", "server_cache_type_v": "f16", "server_gpu_layers": layers,
        "server_cache_ram": cache_ram,
    })  # fmt: skip


def mem_total_mib() -> int:
    line = next(x for x in Path("/proc/meminfo").read_text().splitlines() if x.startswith("MemTotal:"))
    return int(line.split()[1]) // 1024


def card_mib() -> int:
    """The card's memory as nvidia-smi reports it (MiB)."""
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True).stdout  # fmt: skip
    return int(out.split()[0])


def ledger(args, layers, cache_ram: int) -> dict:
    """``llamarack plan --json``'s report for the case: the command itself, run here."""
    words = [str(args.model_dir / "model.gguf"), "--gpu", str(args.card_mib), "--ctx", str(args.ctx), "--kv", "f16",
             "--cache-ram", str(cache_ram), "--cache-ram-min", "0", "--host-ram-mib", str(mem_total_mib()), "--json"]
    if layers is not None or args.cpu:  # a CPU build: the plan of no layer on the card, every part in host RAM
        words += ["--gpu-layers", str(0 if args.cpu else layers)] + (["--cpu-build"] if args.cpu else [])
    run = subprocess.run([sys.executable, "-c", "from roles.server.plan_cli import plan_command; plan_command()",
                          *words], capture_output=True, text=True, cwd=REPO)  # fmt: skip
    if run.returncode:
        raise SystemExit(f"llamarack plan {' '.join(words)}: {run.stdout[-2000:]} {run.stderr[-2000:]}")
    return json.loads(run.stdout)


def memory(pid: int) -> dict:
    """/proc/PID/status's memory lines, MiB."""
    found = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile", "RssShmem"):
            found[key] = round(int(value.split()[0]) / 1024, 1)
    return found


def tokens(n: int, seed: int, hi: int = 999) -> list:
    rnd = random.Random(seed)
    return [rnd.randrange(3, hi) for _ in range(n)]


def serve(args, name: str, layers, cache_ram: int) -> dict:
    """One case: the ledger, llama-server with the unit's flags, its memory as prompts fill its cache."""
    settings = settings_for(args, layers, cache_ram)
    shape = local_gguf_shape(str(args.model_dir / "model.gguf"))
    cards = () if args.cpu else (Card("the card", args.card_mib, None, "GPU-0"),)
    the_plan = plan(shape, knobs(settings), cards)
    report = ledger(args, layers, cache_ram)
    flags = parse_build_help((args.build / "server-help.txt").read_text(), tuple(args.proven_args.split()))
    argv = server_args(settings, flags, str(args.build), str(args.model_dir), the_plan, cuda=not args.cpu,
                       cache_ram=cache_ram)  # fmt: skip
    log = args.out / "logs" / f"server-{name}.log"
    found = {"args": argv[1:], "plan": the_plan.note, "ledger": report["host_ram"]["units"][0], "rss_mib": []}
    server = subprocess.Popen(argv, stdout=open(log, "w"), stderr=subprocess.STDOUT, env={**os.environ, **LOAD_LOG_ENV})
    try:
        start = time.time()
        while time.time() - start < 420 and server.poll() is None and get(f"http://127.0.0.1:{PORT}/health")[0] != 200:
            time.sleep(0.5)
        found["load_s"] = round(time.time() - start, 1)
        found["rss_mib"].append({"after": "load", **memory(server.pid)})
        for i in range(args.prompts):
            status, _ = get(f"http://127.0.0.1:{PORT}/completion", {"prompt": tokens(args.prompt_tokens, i),
                                                                   "n_predict": 1}, timeout=600)  # fmt: skip
            found["rss_mib"].append({"after": f"prompt {i + 1}", "status": status, **memory(server.pid)})
        return {**found, **_verdict(found, parse_load_log(log.read_text(errors="replace")), cache_ram)}
    finally:
        stop(server)


def _verdict(found: dict, loaded: dict, cache_ram: int) -> dict:
    """The resident memory at the end against the ledger; llama.cpp's host buffers beside it."""
    unit, last = found["ledger"], found["rss_mib"][-1]
    host = {what: {buf: mib for buf, mib in bufs.items() if buf.startswith(("CPU", "CUDA_Host"))}
            for what, bufs in loaded.items()}  # fmt: skip
    out = {"llama_cpp_host_buffers_mib": host, "rss_minus_ledger_mib": round(last["VmRSS"] - unit["total_mib"], 1),
           "within_ledger": last["VmRSS"] <= unit["total_mib"] and last.get("VmHWM", 0) <= unit["total_mib"]}
    if cache_ram == 0:
        planned = unit["weights_mib"] + unit["kv_mib"] + unit["compute_mib"]
        out["beyond_buffers_mib"] = round(last["VmRSS"] - planned, 1)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", type=Path, required=True)
    ap.add_argument("--model-dir", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--cpu", action="store_true", help="a CPU build, every layer in host RAM")
    ap.add_argument("--ctx", type=int, default=8192)
    ap.add_argument("--prompt-tokens", type=int, default=7000)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--cases", help="comma-separated names of CASES (CPU_CASES with --cpu); default all")
    ap.add_argument("--proven-args", default="", help="runtime flags the build's proof needed (--no-repack on a CPU "
                                                      "whose AMX faults), as the unit gets them")
    a = ap.parse_args()
    (a.out / "logs").mkdir(parents=True, exist_ok=True)
    cases = CPU_CASES if a.cpu else CASES
    a.card_mib = 16384 if a.cpu else card_mib()  # --cpu: the card only names the plan's
    result = {"date": time.strftime("%Y-%m-%d"), "machine": {"host": platform.node(), "cpus": os.cpu_count(),
              "mem_total_mib": mem_total_mib(), "card_mib": None if a.cpu else a.card_mib},
              "command": ["python3", "bench/gpu/host_ram.py", *sys.argv[1:]], "build": "cpu" if a.cpu else "cuda",
              "ctx": a.ctx, "prompt_tokens": a.prompt_tokens,
              "prompts": a.prompts, "cases": {}}  # fmt: skip
    name = "cpu-host-ram.json" if a.cpu else "gpu-host-ram.json"
    for case in (a.cases.split(",") if a.cases else cases):
        result["cases"][case] = serve(a, case, *cases[case])
        result["provenance"] = provenance.stamp(__file__, extra=() if a.cpu else RAN_WITH)
        (a.out / name).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({c: {k: e.get(k) for k in ("rss_minus_ledger_mib", "within_ledger", "beyond_buffers_mib")}
                      for c, e in result["cases"].items()}, indent=1))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())

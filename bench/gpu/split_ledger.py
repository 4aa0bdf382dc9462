"""The per-card ledger of a layer split against llama.cpp's own accounting, on one GPU.

The machine has one GPU, so a second device is made of the same card: an ``ggml-rpc-server``
serving CUDA0 on 127.0.0.1 is llama.cpp's device ``RPC0[127.0.0.1:PORT]``, and
llama-server started with ``--rpc`` splits the layers over RPC0 and CUDA0 exactly as it
splits them over two cards (llama.cpp puts RPC devices first, so the unit's card 0 is
RPC0 and card 1 is CUDA0; ``--tensor-split`` and ``--main-gpu`` are in that order).

For the write-up's case, a Gemma-3-27B Q4_K_M (random weights, the real shape) on two
Tesla V100 SXM2 16GB, for each KV type asked:

- the server role's plan (``planner.plan`` over the two cards, the arguments
  ``server_args`` + ``Plan.split_args`` as the unit would have them), and the plan
  of one card alone, and ``card_layout.choose_layout``'s answer;
- llama-server started with those arguments and ``--rpc``: each device's model, KV and
  compute buffers from its load log against the card's ledger item by item, and each
  process's memory on the card (``nvidia-smi --query-compute-apps``: rpc-server holds
  card 0's share, llama-server card 1's) against the card's planned total;
- one completion through it (the split serves), its decode rate noted: the link
  between the two devices here is loopback TCP, not NVLink or PCIe, so no claim is made
  about a split's speed from it.

Writes OUT/gpu-split.json (stamped by ``bench/provenance.py``) and OUT/logs/.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "bench")]
RAN_WITH = ("bench/gpu/split.sh", "bench/gpu/build_cuda.sh", "bench/gpu/random_model.py")
sys.path.insert(0, str(REPO / "bench/gpu"))

import provenance  # noqa: E402  (bench/provenance.py)
from roles.server.card_layout import choose_layout  # noqa: E402
from llamarack.gpu_table import planning_memory_mib  # noqa: E402
from roles.model.shapes import local_gguf_shape  # noqa: E402
from roles.settings import load_settings
from roles.server.planner import Card, plan  # noqa: E402
from roles.llamacpp.files.llamacpp_proof import parse_server_help  # noqa: E402
from roles.server.plan import MIB, knobs, server_args  # noqa: E402
from proof import LOAD_LOG_ENV, parse_compute_apps, parse_load_log  # noqa: E402

V100 = (0x1DB1, 16384)  # Tesla V100 SXM2 16GB as a driver reports it
RPC_PORT, SERVER_PORT = 50052, 8090


def settings_for(kv: str):
    return load_settings("gpu-split", {
        "llamarack_root": "/opt/split/root", "llamarack_allow_shared_dirs": True, "python_env_backend": "venv",
        "llamacpp_git_url": "file:///opt/split/src", "llamacpp_commit": "0" * 40,
        "toolchain_cuda_version": "13.0", "server_port": SERVER_PORT, "server_listen": "127.0.0.1",
        "server_cache_type_k": kv, "server_cache_type_v": kv,
    })  # fmt: skip


def cards() -> list:
    mib = planning_memory_mib(*V100)
    return [Card("Tesla V100 SXM2 16GB", mib, "7.0", f"GPU-v100-{i}") for i in range(2)]


def wait_port(port: int, seconds: float) -> bool:
    end = time.time() + seconds
    while time.time() < end:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return True
        time.sleep(0.5)
    return False


def get(url: str, data: dict = None, timeout: float = 5) -> tuple:
    req = urllib.request.Request(url, json.dumps(data).encode() if data else None,
                                 {"Content-Type": "application/json"} if data else {})  # fmt: skip
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode(errors="replace")
    except Exception as e:  # a server still loading answers 503 or nothing
        return getattr(e, "code", None), str(e)


def smi_apps() -> list:
    out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True).stdout  # fmt: skip
    return parse_compute_apps(out)


def compare(book, loaded: dict, apps: list, pids: dict) -> list:
    """Card by card: the ledger's items against the device's buffers and its process's memory."""
    devices = sorted({d for part in loaded.values() for d in part if d.startswith(("RPC", "CUDA"))},
                     key=lambda d: (not d.startswith("RPC"), d))  # fmt: skip
    rows = []
    for i, card in enumerate(book.cards):
        dev = devices[i] if i < len(devices) else None
        got = {k: loaded.get(k, {}).get(dev) for k in ("model", "KV", "compute")}
        used = next((a["used_mib"] for a in apps if a["pid"] == pids[i]), None)
        planned_live = (card.total - card.reserve) / MIB
        rows.append({
            "card": i, "device": dev, "layers": card.layers, "first_layer": card.first_layer,
            "output_layer": card.output_layer,
            "weights_mib": {"ledger": round(card.weights / MIB, 1), "llama.cpp": got["model"]},
            "kv_mib": {"ledger": round(card.kv / MIB, 1), "llama.cpp": got["KV"]},
            "compute_mib": {"ledger": round(card.compute / MIB, 1), "llama.cpp": got["compute"]},
            "process_mib": {"ledger_without_reserve": round(planned_live, 1),
                            "ledger_total": round(card.total / MIB, 1), "nvidia-smi": used},
            "reserve_mib": round(card.reserve / MIB, 1), "card_mib": card.card_mib,
            "fits_card": None if used is None else used <= card.card_mib,
        })  # fmt: skip
    return rows


def serve(build: Path, model_dir: Path, plan, settings, out: Path, tag: str) -> dict:
    flags = parse_server_help((build / "server-help.txt").read_text())
    args = server_args(settings, flags, str(build), str(model_dir), plan, cuda=True) + plan.split_args()
    args += ["--rpc", f"127.0.0.1:{RPC_PORT}"]
    logs = out / "logs"
    rpc = subprocess.Popen([str(build / "bin/ggml-rpc-server"), "-d", "CUDA0", "-H", "127.0.0.1", "-p", str(RPC_PORT)],
                           stdout=open(logs / f"rpc-{tag}.log", "w"), stderr=subprocess.STDOUT)  # fmt: skip
    server = None
    found = {"args": args[1:]}
    try:
        if not wait_port(RPC_PORT, 60):
            return {**found, "error": "rpc-server did not listen"}
        log = logs / f"server-{tag}.log"
        server = subprocess.Popen(args, stdout=open(log, "w"), stderr=subprocess.STDOUT,
                                  env={**os.environ, **LOAD_LOG_ENV})  # fmt: skip
        start = time.time()
        while time.time() - start < 420 and server.poll() is None:
            if get(f"http://127.0.0.1:{SERVER_PORT}/health")[0] == 200:
                break
            time.sleep(1)
        found["load_s"] = round(time.time() - start, 1)
        status, body = get(f"http://127.0.0.1:{SERVER_PORT}/completion",
                           {"prompt": "The rack", "n_predict": 64, "cache_prompt": False}, timeout=120)  # fmt: skip
        found["completion_status"] = status
        if status == 200:
            timings = json.loads(body).get("timings", {})
            found["decode_tokens_per_second"] = timings.get("predicted_per_second")
        found["apps"] = smi_apps()
        found["loaded"] = parse_load_log(log.read_text(errors="replace"))
        found["cards"] = compare(plan.ledger, found["loaded"], found["apps"], {0: rpc.pid, 1: server.pid})
        found["log_lines"] = [ln for ln in log.read_text(errors="replace").splitlines()
                              if "offloaded" in ln or "RPC" in ln and "buffer" in ln][-10:]  # fmt: skip
        return found
    finally:
        for p in (server, rpc):
            if p and p.poll() is None:
                p.terminate()
                try:
                    p.wait(30)
                except subprocess.TimeoutExpired:
                    p.kill()


def plans(shape: dict, kv: str) -> dict:
    settings = settings_for(kv)
    kn = knobs(settings)
    alone = plan(shape, kn, cards()[:1])
    split = plan(shape, kn, cards(), split_mode="layer")
    layout = choose_layout(shape, kn, cards(), "auto")
    return {"settings": settings, "split": split, "alone": alone, "layout": layout}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", type=Path, required=True)
    ap.add_argument("--model-dir", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--kv", default="q8_0,q4_0")
    ap.add_argument("--plan-only", action="store_true", help="plan, start nothing (checks the script here)")
    a = ap.parse_args()
    (a.out / "logs").mkdir(parents=True, exist_ok=True)
    shape = local_gguf_shape(str(a.model_dir / "model.gguf"))
    gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout.strip() if not a.plan_only else None  # fmt: skip
    result = {"date": time.strftime("%Y-%m-%d"), "machine": {"host": platform.node(), "gpu": gpu},
              "model": {"shape": "gemma3-27b (random weights)", "quant": "Q4_K_M", "n_layer": shape["n_layer"],
                        "file_bytes": (a.model_dir / "model.gguf").stat().st_size},
              "cards": f"2x Tesla V100 SXM2 16GB (planned); served on one {(gpu or 'GPU').split(',')[0]} as RPC0 + CUDA0",
              "kv": {}}  # fmt: skip
    for kv in a.kv.split(","):
        p = plans(shape, kv)
        entry = {"one_card": {"gpu_layers": p["alone"].gpu_layers, "ctx_per_slot": p["alone"].ctx_per_slot,
                              "note": p["alone"].note},
                 "split": p["split"].as_dict(), "auto": {"chosen": p["layout"].chosen, "reason": p["layout"].reason}}
        if not a.plan_only:
            entry["served"] = serve(a.build, a.model_dir, p["split"], p["settings"], a.out, kv)
        result["kv"][kv] = entry
        result["provenance"] = provenance.stamp(__file__, extra=RAN_WITH)
        (a.out / "gpu-split.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    print(json.dumps({kv: {"one_card": e["one_card"], "ctx": e["split"]["ctx_per_slot"],
                           "cards": e.get("served", {}).get("cards")} for kv, e in result["kv"].items()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

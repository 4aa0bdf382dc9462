"""A sleeping llama-server on the card (``--sleep-idle-seconds``): the GPU memory its process
holds awake, asleep and woken again, how long it takes to fall asleep, that /health,
/metrics and /props leave it asleep, and the wake latency of a completion against an awake
one. Writes gpu-sleep.json into --out, stamped by ``bench/provenance.py``.

    python3 bench/gpu/sleep.py --build DIR --model GGUF --out DIR
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

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import provenance  # noqa: E402  (bench/provenance.py: standard library)

SLEEP_S = 5
RAN_WITH = ("bench/gpu/sleep.sh", "bench/gpu/build_cuda.sh", "bench/gpu/random_model.py")


def get(url: str, body=None, timeout: float = 120):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"} if data else {})
    with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(req, timeout=timeout) as r:
        return r.status, r.read()


def props(base: str) -> dict:
    return json.loads(get(base + "/props")[1])


def gpu(pid: int) -> dict:
    """The process's MiB on the card (nvidia-smi's compute apps; None: not listed) and the card's used MiB."""
    apps = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_gpu_memory", "--format=csv,noheader,nounits"],
                          capture_output=True, text=True).stdout
    mine = [int(f[1]) for f in (line.split(", ") for line in apps.splitlines()) if f[0].strip() == str(pid)]
    used = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                          capture_output=True, text=True).stdout.split()[0]
    return {"process_mib": sum(mine) if mine else None, "card_used_mib": int(used)}


def complete(base: str, n: int = 16) -> float:
    start = time.monotonic()
    status, _ = get(base + "/completion", {"prompt": "The quick brown fox", "n_predict": n, "temperature": 0})
    assert status == 200
    return round(time.monotonic() - start, 3)


def wait_sleeping(base: str, limit: float = 120) -> float:
    start = time.monotonic()
    while not props(base).get("is_sleeping"):
        assert time.monotonic() - start < limit, "never fell asleep"
        time.sleep(0.2)
    return round(time.monotonic() - start, 2)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    help_text = open(os.path.join(a.build, "server-help.txt"), errors="replace").read()
    load = ["--load-mode", "none"] if "--load-mode" in help_text else ["--no-mmap"]
    argv = [f"{a.build}/bin/llama-server", "-m", a.model, "--port", str(port), "-c", "8192", "-ngl", "999",
            "-fa", "on", *load, "--metrics", "--sleep-idle-seconds", str(SLEEP_S)]
    log = open(os.path.join(a.out, "server.log"), "w")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    base, found = f"http://127.0.0.1:{port}", {"argv": argv[1:]}
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                if get(base + "/health", timeout=2)[0] == 200:
                    break
            except Exception:
                pass
            assert time.monotonic() < deadline and proc.poll() is None, "llama-server never answered /health"
            time.sleep(0.5)
        found["first_completion_s"] = complete(base)
        found["awake"] = gpu(proc.pid)
        found["seconds_to_sleep_after_the_request"] = wait_sleeping(base)
        time.sleep(2)
        found["asleep"] = gpu(proc.pid)
        for path in ("/health", "/metrics", "/props") * 5:  # none of these may wake it
            get(base + path)
        found["asleep_after_health_metrics_props"] = props(base).get("is_sleeping") is True
        found["wake_completion_s"] = complete(base)
        found["awake_completion_s"] = complete(base)
        found["woken"] = gpu(proc.pid)
        found["wake_again"] = {"seconds_to_sleep": wait_sleeping(base)}
        found["wake_again"]["wake_completion_s"] = complete(base)
    finally:
        proc.terminate()
        proc.wait(30)
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout.strip()
    found["machine"] = {"gpu": smi, "cpu": platform.processor() or platform.machine(), "date": time.strftime("%Y-%m-%d")}
    found["model_bytes"] = os.path.getsize(a.model)
    found["provenance"] = provenance.stamp(__file__, extra=RAN_WITH)
    with open(os.path.join(a.out, "gpu-sleep.json"), "w") as f:
        json.dump(found, f, indent=1)
    print(json.dumps(found, indent=1))


if __name__ == "__main__":
    main()

"""The residency check against a real CUDA llama-server serving fewer layers than planned:
the smoke model (3 layers with the output layer) planned with every layer on the card,
served with ``--n-gpu-layers 1``, once at llama.cpp's default log verbosity and once with
the unit's ``LLAMA_ARG_LOG_VERBOSITY=4``. ``wait_healthy.residency`` reads the load log
and nvidia-smi as a switch does. Writes gpu-layers.json into --out, stamped by
``bench/provenance.py``.

    python3 bench/gpu/layers.py --build DIR --out DIR
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

import provenance  # noqa: E402  (bench/provenance.py)
from roles.llamacpp.files.llamacpp_proof import write_smoke_gguf  # noqa: E402
from roles.server.files.wait_healthy import OFFLOADED, compute_apps, residency  # noqa: E402

RAN_WITH = ("bench/gpu/layers.sh", "bench/gpu/build_cuda.sh")


def serve(build: str, model: str, layers: int, env: dict, log_path: str) -> dict:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = [f"{build}/bin/llama-server", "-m", model, "--port", str(port), "-c", "1024", "-ngl", str(layers),
            "--load-mode", "none"]
    with open(log_path, "w") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **env})
        try:
            deadline = time.monotonic() + 120
            while True:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                        if r.status == 200:
                            break
                except Exception:
                    pass
                assert time.monotonic() < deadline and proc.poll() is None, "no /health"
                time.sleep(0.3)
            apps = compute_apps()
            uuid = subprocess.run(["nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader"], capture_output=True,
                                  text=True).stdout.split()[0]
            text = open(log_path, errors="replace").read()
            mine = [a for a in apps if a.pid == proc.pid]
            # planned: every layer on the card; weights: the smoke model's, well under the CUDA context
            why = residency(apps, proc.pid, (uuid,), 1, text)
            return {"env": env, "n_gpu_layers": layers, "offloaded_lines": OFFLOADED.findall(text),
                    "process_mib": sum(a.used_mib or 0 for a in mine), "residency": why or "passed"}
        finally:
            proc.terminate()
            proc.wait(30)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    model = "/dev/shm/smoke-f16.gguf"
    write_smoke_gguf(model)
    found = {"what": "the smoke model (2 layers and the output layer: 3) planned all on the card, served with "
                     "--n-gpu-layers 1: the residency check at llama.cpp's default verbosity and at the unit's 4"}
    found["runs"] = [serve(a.build, model, 1, {}, f"{a.out}/default.log"),
                     serve(a.build, model, 1, {"LLAMA_ARG_LOG_VERBOSITY": "4"}, f"{a.out}/verbosity4.log"),
                     serve(a.build, model, 3, {"LLAMA_ARG_LOG_VERBOSITY": "4"}, f"{a.out}/all-layers.log")]
    found["machine"] = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                                      capture_output=True, text=True).stdout.strip()
    found["date"] = time.strftime("%Y-%m-%d")
    found["provenance"] = provenance.stamp(__file__, extra=RAN_WITH)
    with open(f"{a.out}/gpu-layers.json", "w") as f:
        json.dump(found, f, indent=1)
    print(json.dumps(found, indent=1))


if __name__ == "__main__":
    main()

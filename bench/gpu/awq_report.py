"""The AWQ route's GPU proof, read back: bench/gpu/awq.sh's logs into one JSON (standard library;
imports nothing from llamarack).

    python3 bench/gpu/awq_report.py env
        (with AutoAWQ's env on PYTHONPATH) the versions it runs with, as JSON
    python3 bench/gpu/awq_report.py report --work W --shm SHM --shape NAME --scale-down N --ctx N --out FILE
        gpu-awq.json: the machine, the shape, the calibration (seconds, peak GPU bytes, the
        model role's preflight figure beside them), the files' sizes, and per route the
        Q4_K_M's perplexity and mean KL divergence against the plain f16 GGUF for f16, q8_0
        and q4_0 KV; the AWQ f16's own against the plain f16; each step's seconds and command

The figures are read by the model role's own parsers (roles/model/files/model_quality.py). The
result is stamped by ``bench/provenance.py``: awq.sh runs more than once, each command ending
with this report, so each command's stamp is kept (W/out/provenance.json) in the stamp's runs.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FILES = ROOT / "roles" / "model" / "files"
sys.path[:0] = [str(FILES), str(ROOT / "bench")]
import awq_apply  # noqa: E402 (standard library at import)
import model_quality  # noqa: E402
import provenance  # noqa: E402 (bench/provenance.py: standard library)

RAN_WITH = ("bench/gpu/awq.sh", "bench/gpu/build_cuda.sh", "bench/gpu/random_model.py")

ROUTES = {"gguf": "plain", "awq": "awq"}
CAVEAT = ("random weights (N(0, 0.02)) of a real shape, with the tiny model's 1000-piece tokenizer: the "
          "figures show that both routes run and what each changes against the same f16 model, not which "
          "route is better; that is measured on the model served")


def env() -> dict:
    import importlib.metadata as md

    import torch

    def version(name):
        try:
            return md.version(name)
        except md.PackageNotFoundError:
            return "stub" if name == "datasets" else None

    names = ("transformers", "tokenizers", "huggingface_hub", "accelerate", "autoawq", "datasets", "numpy")
    return {"python": sys.version.split()[0], "torch": torch.__version__, "torch_cuda": torch.version.cuda,
            "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
            **{n: version(n) for n in names}}  # fmt: skip


def _read(path: Path) -> str:
    return path.read_text(errors="replace") if path.is_file() else ""


def _size(path: Path) -> int | None:
    if path.is_dir():
        return sum(p.stat().st_size for p in path.iterdir() if p.is_file())
    return path.stat().st_size if path.is_file() else None


def _output(argv: list) -> str | None:
    """A command's output, None when it fails."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() or None if done.returncode == 0 else None


def machine(src: Path) -> dict:
    smi = _output(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"])
    mem = next((line.split()[1] for line in _read(Path("/proc/meminfo")).splitlines()
                if line.startswith("MemTotal:")), None)  # fmt: skip
    return {"gpu": smi or None, "cpus": os.cpu_count(), "mem_total_kib": int(mem) if mem else None,
            "date": time.strftime("%Y-%m-%d"), "llamacpp_commit": _output(["git", "-C", str(src), "rev-parse", "HEAD"])}


def _last_json(text: str, prefix: str = "") -> dict | None:
    for line in reversed(text.splitlines()):
        if line.startswith(prefix + "{"):
            return json.loads(line[len(prefix):])
    return None


def calibration(logs: Path, shm: Path) -> dict:
    """awq_apply.py's report, beside the preflight figure the model role computes for it."""
    report = _last_json(_read(logs / "awq.log"), "awq-report ")
    out: dict = {"report": report, "env": _last_json(_read(logs / "awq-env.log"))}
    config = shm / "plain" / "config.json"
    if report and config.is_file():
        cfg = json.loads(config.read_text())
        out["preflight_bytes"] = awq_apply.calibration_bytes(cfg, report["tokens"])
        out["decoder_layer_bytes"] = awq_apply.layer_bytes(cfg)
        out["decoder_layers"] = cfg["num_hidden_layers"]
    return out


def quality(logs: Path, ctx: int) -> dict:
    text = (FILES / "quality.txt").read_bytes()
    base = model_quality.parse_perplexity(_read(logs / "quality-f16.log"))
    q: dict = {"text": "roles/model/files/quality.txt", "text_sha256": hashlib.sha256(text).hexdigest(),
               "ctx": ctx, "base": "the plain checkpoint's f16 GGUF", "f16_plain": base,
               "f16_awq_vs_f16_plain": model_quality.parse_kld(_read(logs / "quality-awq-f16.log")), "q4_k_m": {}}
    for route, files in ROUTES.items():
        q["q4_k_m"][route] = {kv: model_quality.parse_kld(_read(logs / f"quality-{files}-q4km-kv-{kv}.log"))
                              for kv in model_quality.KV_TYPES}  # fmt: skip
    return q


def steps(work: Path) -> tuple:
    """Each step's last (seconds, exit status), and its last command line."""
    timing, commands = {}, {}
    for line in _read(work / "out" / "steps.tsv").splitlines():
        name, seconds, rc = line.split("\t")
        timing[name] = {"seconds": int(seconds), "rc": int(rc)}
    for line in _read(work / "out" / "commands.tsv").splitlines():
        name, command = line.split("\t", 1)
        commands[name] = command.strip()
    return timing, commands


def stamp(work: Path) -> dict:
    """This command's stamp joined with those of the commands before it on this machine."""
    kept = work / "out" / "provenance.json"
    earlier = json.loads(kept.read_text()) if kept.is_file() else None
    joined = provenance.joined(earlier, provenance.stamp(__file__, extra=RAN_WITH))
    kept.write_text(json.dumps(joined, indent=1) + "\n")
    return joined


def report(a) -> dict:
    work, shm, logs = Path(a.work), Path(a.shm), Path(a.work) / "out" / "logs"
    timing, commands = steps(work)
    files = {f"{r}_checkpoint": shm / r for r in ROUTES.values()}
    files.update({f"{r}_{kind}": shm / f"{r}-{kind}.gguf" for r in ROUTES.values() for kind in ("f16", "q4km")})
    failed = {p.name[:-8]: _read(p).splitlines()[-15:] for p in sorted(logs.glob("*.log.tmp"))}
    return {"what": "the AWQ route (model_route='awq': AutoAWQ's scales applied into the fp16 weights, then "
                    "convert and llama-quantize) against the plain route (model_route='gguf') on one GPU; "
                    "bench/gpu/awq.sh", "caveat": CAVEAT,
            "machine": machine(work / "src"), "shape": _last_json(_read(logs / "model.log")), "scale_down": a.scale_down,
            "shape_name": a.shape, "calibration": calibration(logs, shm),
            "bytes": {k: _size(p) for k, p in files.items()}, "quality": quality(logs, a.ctx),
            "steps": timing, "commands": commands, "failed_logs": failed, "provenance": stamp(work)}  # fmt: skip


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="what", required=True)
    sub.add_parser("env")
    r = sub.add_parser("report")
    for option in ("--work", "--shm", "--shape", "--out"):
        r.add_argument(option, required=True)
    r.add_argument("--scale-down", type=int, default=1)
    r.add_argument("--ctx", type=int, required=True)
    a = ap.parse_args(argv)
    if a.what == "env":
        print(json.dumps(env(), sort_keys=True))
        return 0
    result = report(a)
    Path(a.out).write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    q = result["quality"]
    print(json.dumps({"calibration": result["calibration"]["report"], "f16_plain": q["f16_plain"],
                      "f16_awq_vs_f16_plain": q["f16_awq_vs_f16_plain"], "q4_k_m": q["q4_k_m"]}))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())

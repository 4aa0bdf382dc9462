"""Proof that the pinned llama.cpp builds for Volta (sm_70) with CUDA 11.8, using the role's flags.

Runs on this machine (no GPU needed to compile) with Debian 12's non-free
nvidia-cuda-toolkit 11.8.89 and g++-11, exactly the cmake arguments the
llama.cpp role plans for a V100 host whose build is shipped to the rack
(ggml's CPU baseline in the stamp, ``llamacpp_cpu_features``: the recipe of
``bench/gpu/build_proof.sh ship``), then checks the artifact itself as that
proof's report does (``build_report.artifact``): the cubins with cuobjdump,
and ggml's CPU library for AVX-512 registers. Writes
bench/results/sm70-build.json, stamped by ``bench/provenance.py``.

    python3 bench/sm70_build.py [--source DIR] [--jobs 2]

A cold build is about 50 minutes on 2 cores; ccache (its own directory,
/var/cache/llamarack/ccache-sm70) makes a repeat a few minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import time
from pathlib import Path

import sys

import provenance  # this folder's (the script's own: first on sys.path)
from roles.llamacpp.plan import plan_build
from llamarack_lab import services
from roles.settings import load_settings

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench/gpu"))
from build_report import artifact  # noqa: E402  (bench/gpu/build_report.py: the ship proof's checks)

# ggml's CPU baseline (x86-64-v3 without AVX-512), as a shipped build is made
BASELINE = ["sse42", "avx", "avx2", "bmi2", "fma", "f16c"]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--workdir", default="/var/cache/llamarack/sm70-build")
    parser.add_argument("--jobs", type=int, default=os.cpu_count())
    args = parser.parse_args()

    mirror = services.prepare()
    settings = load_settings("bench", {"python_env_backend": "venv", "llamacpp_commit": mirror.commit,
                                       "llamacpp_cpu_features": BASELINE})
    plan = plan_build(settings, archs=("70",), cuda_home="/usr", cuda_version="11.8",
                      host_compiler="/usr/bin/g++-11")  # fmt: skip
    work = Path(args.workdir)
    src, build = work / "src", work / f"build-{plan.stamp}"
    if not (src / ".git").exists():
        subprocess.run(["git", "clone", "--quiet", str(mirror.bare), str(src)], check=True)
    subprocess.run(["git", "-C", str(src), "checkout", "--quiet", "--detach", mirror.commit], check=True)

    env = {**os.environ, "PATH": "/usr/bin:/usr/sbin:/bin:/sbin", "CCACHE_DIR": "/var/cache/llamarack/ccache-sm70",
           "CCACHE_BASEDIR": str(work), "CCACHE_NOHASHDIR": "true"}  # fmt: skip
    subprocess.run(["ccache", "-z"], env=env, check=True, capture_output=True)
    t0 = time.monotonic()
    subprocess.run(["cmake", "-S", str(src), "-B", str(build), *plan.cmake_args], env=env, check=True,
                   stdout=open(work / "configure.log", "w"), stderr=subprocess.STDOUT)  # fmt: skip
    t1 = time.monotonic()
    with open(work / "build.log", "w") as log:
        rc = subprocess.run(
            ["cmake", "--build", str(build), "--config", "Release", "-j", str(args.jobs), "--target", *plan.targets],
            env=env, stdout=log, stderr=subprocess.STDOUT,
        ).returncode  # fmt: skip
    t2 = time.monotonic()
    checked = artifact(build)
    archs = checked["cubin_archs"]
    version = subprocess.run([str(build / "bin/llama-server"), "--version"], capture_output=True, text=True)
    stats = subprocess.run(["ccache", "-s"], env=env, capture_output=True, text=True).stdout
    result = {
        "provenance": provenance.stamp(__file__, extra=("bench/gpu/build_report.py",)),
        "what": "llama.cpp CUDA build for sm_70 with the llama.cpp role's cmake arguments for a shipped build (ggml's CPU "
                "baseline), the artifact checked: its cubins, and no AVX-512 register in ggml's CPU library",
        "llama_cpp_commit_upstream": "0c1e57098bba43ac29e6e3b677cdceebdd22334f",
        "mirror_commit": mirror.commit,
        "cmake_args": list(plan.cmake_args),
        "targets": list(plan.targets),
        "toolkit": subprocess.run(["nvcc", "--version"], env=env, capture_output=True, text=True).stdout.strip().splitlines()[-2],
        "host_compiler": subprocess.run(["g++-11", "--version"], capture_output=True, text=True).stdout.splitlines()[0],
        "build_exit_code": rc,
        "configure_s": round(t1 - t0, 1),
        "build_s": round(t2 - t1, 1),
        "jobs": args.jobs,
        "cubin_count": checked["cubins"],
        "cubin_archs": archs,
        "cuobjdump_head": checked["cuobjdump_head"],
        "cuda_library": checked["cuda_library"],
        "cpu_code": checked["cpu_code"],
        "server_version": (version.stdout + version.stderr).strip().splitlines()[-2:],
        "ccache": [l.strip() for l in stats.splitlines() if re.match(r"\s*(Hits|Misses|Cacheable)", l)],
        "machine": {"cpus": os.cpu_count(), "kernel": platform.release(), "python": platform.python_version(),
                    "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())},  # fmt: skip
    }
    out = ROOT / "bench/results/sm70-build.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    avx512 = sum(c["avx512_zmm"] for c in checked["cpu_code"].values())
    return 0 if rc == 0 and archs == ["sm_70"] and checked["cpu_code"] and not avx512 else 1


if __name__ == "__main__":
    raise SystemExit(main())

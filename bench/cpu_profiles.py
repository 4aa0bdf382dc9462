"""A shipped llama.cpp build's CPU code on every CPU profile, and the rule that guards it.

    python3 bench/cpu_profiles.py [--workdir DIR] [--jobs N]

Builds the pinned llama.cpp for the CPU twice with the llama.cpp role's cmake arguments
(``plan_build``): as a build shipped to the rack is made (ggml's CPU baseline in the stamp,
``llamacpp_cpu_features``) and as a host builds for itself (``-march=native``, the default;
such a build is shipped only to hosts whose CPU flags are the same). The lab's hosts share
this machine's CPU, so the other CPUs are QEMU's user mode (``qemu-x86_64 -cpu MODEL``,
Debian's qemu-user): its emulation raises an illegal instruction for any extension the
model lacks, and has none of AVX-512. The profiles: this machine's own CPU; Haswell (AVX2,
FMA, F16C, BMI2: x86-64-v3, the baseline's level); Sandy Bridge (AVX, no AVX2); Westmere
(SSE4.2, no AVX).

On each profile ``bench/cpu_probe.c`` reports the extensions the CPU has (cpuid, named as
``/proc/cpuinfo`` names them), the llama.cpp role's ``cpu-has-features`` rule is asked
about the shipped build on a host with that CPU, and each build's ``llama-bench`` runs a
tiny random-weights GGUF (``bench/gpu/random_model.py``). Both builds' ggml CPU library
are checked for AVX-512 registers (``build_report.artifact``). The result is good when the
shipped build computes on every profile the rule passes, and the rule refuses every profile
where it does not. Writes bench/results/cpu-profiles.json, stamped by
``bench/provenance.py``. A cold run is two CPU builds: about 15 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import provenance  # this folder's (the script's own: first on sys.path)

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "lab"), str(ROOT / "bench/gpu")]

from build_report import artifact  # noqa: E402  (bench/gpu/build_report.py: the ship proof's checks)
from llamarack_lab import services  # noqa: E402
from roles.llamacpp.plan import plan_build  # noqa: E402
from roles.llamacpp.rules import rule_cpu_has_features  # noqa: E402
from roles.preflight.facts import HostFacts  # noqa: E402
from roles.driver.reads import DriverState  # noqa: E402
from roles.settings import load_settings  # noqa: E402

BASELINE = ["sse42", "avx", "avx2", "bmi2", "fma", "f16c"]
# (name, QEMU CPU model or None for this machine's own CPU, what it stands for)
PROFILES = (
    ("this machine", None, "the CPU the builds were made on"),
    ("Haswell", "Haswell-v4", "x86-64-v3 (2013): AVX2, FMA, F16C, BMI2, the baseline's level"),
    ("Sandy Bridge", "SandyBridge-v1", "2011: AVX, no AVX2, FMA or F16C"),
    ("Westmere", "Westmere-v1", "x86-64-v2 (2010): SSE4.2, no AVX"),
)
QEMU_NOISE = re.compile(r"TCG doesn't support requested feature")


def run_on(profile: str | None, argv: list, timeout: int = 600) -> dict:
    """``argv`` on a CPU profile: its exit (a signal's name where it died of one) and output's tail."""
    full = (["qemu-x86_64", "-cpu", profile] if profile else []) + argv
    t0 = time.monotonic()
    p = subprocess.run(full, capture_output=True, text=True, timeout=timeout)
    err = [x for x in p.stderr.splitlines() if x.strip() and not QEMU_NOISE.search(x)]
    died = -p.returncode if p.returncode < 0 else p.returncode - 128 if p.returncode > 128 else 0
    return {"rc": p.returncode, "signal": signal.Signals(died).name if died else None,
            "seconds": round(time.monotonic() - t0, 1), "stdout": p.stdout, "stderr_tail": err[-3:]}  # fmt: skip


def build(src: Path, work: Path, name: str, settings_data: dict, commit: str, jobs: int, targets: tuple) -> dict:
    """The role's CPU build of ``commit`` for these settings, compiled in ``work/name``."""
    settings = load_settings("bench", {"python_env_backend": "venv", "llamacpp_backend": "cpu",
                                       "llamacpp_commit": commit, **settings_data})  # fmt: skip
    plan = plan_build(settings)
    d = work / f"build-{name}-{plan.stamp}"
    env = {**os.environ, "CCACHE_DIR": str(work / "ccache"), "CCACHE_BASEDIR": str(work), "CCACHE_NOHASHDIR": "true"}
    t0 = time.monotonic()
    with open(work / f"{name}.log", "w") as log:
        rc = subprocess.run(["cmake", "-S", str(src), "-B", str(d), *plan.cmake_args], env=env, stdout=log,
                            stderr=subprocess.STDOUT).returncode  # fmt: skip
        if rc == 0:
            rc = subprocess.run(["cmake", "--build", str(d), "--config", "Release", "-j", str(jobs), "--target",
                                 *targets], env=env, stdout=log, stderr=subprocess.STDOUT).returncode  # fmt: skip
    return {"dir": d, "stamp": plan.stamp, "cmake_args": list(plan.cmake_args), "targets": list(targets),
            "build_exit_code": rc, "build_s": round(time.monotonic() - t0, 1), "features": settings_data.get(
                "llamacpp_cpu_features")}  # fmt: skip


def bench_on(b: dict, profile: str | None, model: Path) -> dict:
    """``llama-bench`` of build ``b`` on the tiny model, one thread, on a CPU profile."""
    r = run_on(profile, [str(b["dir"] / "bin/llama-bench"), "-m", str(model), "-p", "16", "-n", "8", "-r", "1",
                         "-t", "1", "-o", "json"])  # fmt: skip
    try:
        rows = json.loads(r["stdout"]) if r["rc"] == 0 else []
    except ValueError:
        rows = []
    tps = {f"{'pp' if row.get('n_prompt') else 'tg'}{row.get('n_prompt') or row.get('n_gen')}": row.get("avg_ts")
           for row in rows}  # fmt: skip
    return {"computed": r["rc"] == 0 and bool(tps), "rc": r["rc"], "signal": r["signal"], "seconds": r["seconds"],
            "tokens_per_second": tps, "stderr_tail": [] if tps else r["stderr_tail"]}  # fmt: skip


def rule_on(flags: str, features: list) -> dict:
    """The ``cpu-has-features`` rule for a host with this CPU and a build of ``features``."""
    settings = load_settings("bench", {"python_env_backend": "venv", "llamacpp_cpu_features": features})
    failure = rule_cpu_has_features(settings, HostFacts(driver=DriverState("ok", ()), module=None, cpu_flags=flags))
    return {"passes": failure is None, **({"found": failure.found, "fix": failure.fix} if failure else {})}


def profiles(builds: dict, model: Path, probe: Path) -> list:
    rows = []
    for name, qemu, what in PROFILES:
        flags = run_on(qemu, [str(probe)])["stdout"].split()
        rows.append({"profile": name, "qemu_cpu": qemu, "what": what, "cpu_reports": flags,
                     "rule_for_shipped": rule_on(" ".join(flags), BASELINE),
                     **{kind: bench_on(b, qemu, model) for kind, b in builds.items()}})  # fmt: skip
        print(f"{name}: " + ", ".join(f"{k} {'computed' if rows[-1][k]['computed'] else rows[-1][k]['signal']}"
                                      for k in builds), flush=True)  # fmt: skip
    return rows


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--workdir", default="/var/cache/llamarack/cpu-profiles")
    parser.add_argument("--jobs", type=int, default=os.cpu_count())
    args = parser.parse_args()
    mirror = services.prepare()
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    src = work / "src"
    if not (src / ".git").exists():
        subprocess.run(["git", "clone", "--quiet", str(mirror.bare), str(src)], check=True)
    subprocess.run(["git", "-C", str(src), "checkout", "--quiet", "--detach", mirror.commit], check=True)
    probe, model = work / "cpu_probe", work / "tiny.gguf"
    subprocess.run(["gcc", "-O1", "-o", str(probe), str(ROOT / "bench/cpu_probe.c")], check=True)
    subprocess.run([sys.executable, str(ROOT / "bench/gpu/random_model.py"), "gguf", "llama3-8b", str(model),
                    "--gguf-py", str(src / "gguf-py"), "--scale-down", "32"], check=True, capture_output=True)  # fmt: skip
    builds = {"shipped": build(src, work, "shipped", {"llamacpp_cpu_features": BASELINE}, mirror.commit, args.jobs,
                               ("llama-server", "llama-bench", "llama-cli", "llama-quantize")),
              "native": build(src, work, "native", {}, mirror.commit, args.jobs, ("llama-bench",))}  # fmt: skip
    rows = profiles(builds, model, probe)
    shipped_ok = all(r["shipped"]["computed"] == r["rule_for_shipped"]["passes"] for r in rows)
    result = {
        "provenance": provenance.stamp(__file__, extra=("bench/cpu_probe.c", "bench/gpu/build_report.py",
                                                        "bench/gpu/random_model.py")),  # fmt: skip
        "what": "the llama.cpp role's CPU build as shipped (ggml's CPU baseline) and as a host makes it for itself "
                "(-march=native), each build's llama-bench on a tiny random GGUF on this machine's CPU and on CPUs "
                "QEMU's user mode emulates; on each, the cpu-has-features rule for the shipped build",
        "mirror_commit": mirror.commit,
        "qemu": subprocess.run(["qemu-x86_64", "--version"], capture_output=True, text=True).stdout.splitlines()[0],
        "builds": {k: {**{f: v for f, v in b.items() if f != "dir"}, **artifact(b["dir"])} for k, b in builds.items()},
        "model": {"shape": "llama3-8b at 1/32 (random weights, f16)", "bytes": model.stat().st_size},
        "profiles": rows,
        "shipped_runs_where_the_rule_passes_and_only_there": shipped_ok,
    }
    out = ROOT / "bench/results/cpu-profiles.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: result[k] for k in ("profiles", "shipped_runs_where_the_rule_passes_and_only_there")},
                     indent=1))  # fmt: skip
    return 0 if shipped_ok and all(b["build_exit_code"] == 0 for b in builds.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
